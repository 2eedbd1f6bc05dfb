"""The report's form: its document model rendered as Markdown and HTML, curve PNGs, CSV and LaTeX tables, and how numbers print."""
