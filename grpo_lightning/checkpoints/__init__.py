"""Checkpoints: atomic files, the final checkpoint of every fit, exact resume and export."""
