"""The final metrics of every arm as files for a paper: ``final_metrics.csv`` (one row per arm
and metric, full precision) and ``final_metrics.tex`` (a booktabs table, metrics x arms)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning.report.render.formatting import fmt_interval
from grpo_lightning.report.metrics import Metric

CSV_FILE = "final_metrics.csv"
LATEX_FILE = "final_metrics.tex"
#: ``(metric, [(mean, low, high) per arm])``
Row = tuple[Metric, list[tuple[float, float, float]]]

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip


def _number(value: float) -> str:
    if value == math.inf:  # a threshold not reached by every seed (learning.py)
        return "inf"
    return "" if not math.isfinite(value) else f"{value:.6g}"


def final_metrics_csv(arm_names: Sequence[str], counts: Sequence[Sequence[int]], rows: Sequence[Row], interval: str) -> str:
    """One line per metric and arm; ``n``: the seeds behind that mean (``counts``, per row and arm)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["metric", "arm", "n", "mean", "ci_low", "ci_high", "interval"])
    for (metric, stats), row_counts in zip(rows, counts):
        for name, n, (mean, low, high) in zip(arm_names, row_counts, stats):
            method = interval if math.isfinite(low) else ""
            writer.writerow([metric.key, name, n, _number(mean), _number(low), _number(high), method])
    return out.getvalue()


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(char, char) for char in str(text))


def final_metrics_latex(name: str, arm_names: Sequence[str], seeds: Sequence[int], counts: Sequence[Sequence[int]],
                        rows: Sequence[Row], caption: str) -> str:  # fmt: skip
    """A ``table`` with a booktabs ``tabular``: one row per metric, one column per arm; needs
    ``\\usepackage{booktabs}``. ``seeds``: each arm's runs (its header's n); a mean over fewer
    (``counts``, per row and arm) says its own n."""
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{latex_escape(caption)}}}",
        rf"\label{{tab:{latex_escape(name)}-final-metrics}}",
        r"\begin{tabular}{l" + "r" * len(arm_names) + "}",
        r"\toprule",
        " & ".join(["Metric", *(f"{latex_escape(a)} ($n={n}$)" for a, n in zip(arm_names, seeds))]) + r" \\",
        r"\midrule",
    ]
    for (metric, stats), row_counts in zip(rows, counts):
        texts = [latex_escape(fmt_interval(*s, metric.key) + (f" (n={n})" if n < runs else ""))
                 for s, n, runs in zip(stats, row_counts, seeds)]  # fmt: skip
        lines.append(" & ".join([latex_escape(metric.label), *texts]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_final_tables(target: Path, name: str, arm_names: Sequence[str], seeds: Sequence[int],
                       counts: Sequence[Sequence[int]], rows: Sequence[Row], interval: str, caption: str) -> None:  # fmt: skip
    (target / CSV_FILE).write_text(final_metrics_csv(arm_names, counts, rows, interval))
    (target / LATEX_FILE).write_text(final_metrics_latex(name, arm_names, seeds, counts, rows, caption))
