"""``grpo-lightning-report``: a Markdown + HTML report of a sweep's TensorBoard logs.

    grpo-lightning-report runs/ablation/default                             # runs/ablation/default/report/
    grpo-lightning-report runs/ablation/default --output reports/default    # the committed report
    OUT=/tmp/default sh reports/default/REGENERATE                          # rebuilt from reports/default/data

Writes ``report.md``, ``report.html``, one PNG per learning curve and the final metrics as
``final_metrics.csv`` and ``final_metrics.tex`` (booktabs) into the sweep's ``report/`` folder,
or into ``--output`` (so that a committed report is replaced only when asked for). Runs are
grouped into *arms*: cells that differ only in their seed (``cell.json`` written by
``grpo-lightning-ablate``; for plain ``grpo-lightning fit`` directories the model class and the
seed come from the saved ``config.yaml``). The report is a pure function of the logs: it copies
what it reads into ``data/`` beside itself and is built from that copy, so regenerating it from
the sweep folder or from ``data/`` gives byte-identical files.

Statistics: the mean over seeds with its Student-t interval (``seed_interval``, behind every
interval over seeds), each arm against the baseline arm over shared seeds (``comparisons``: the
paired t-test, Cohen's d_z, Holm's correction, the minimum detectable effect), paired by prompt too
where the runs wrote per-prompt outcomes (``paired``: the two-level interval over seeds and prompts),
Wilson intervals of one run's accuracy (``wilson_interval``). Every number says the seeds behind it where some are
missing (``arms.SeedCount``: diverged, not logged, unfinished); a seed run twice in one arm is
refused (``cells.refuse_duplicate_cells``), and no comparison below ``MIN_PAIRED_SEEDS`` pairs gets
a verdict.

Modules: ``cells`` (a sweep's cell folders and configs; each run's TensorBoard scalars: :mod:`grpo_lightning.ablation.runs`),
``data`` (the ``data/`` folder and ``REGENERATE``), ``outcomes`` (each run's per-prompt outcomes of
its final validation, for statistics paired by prompt), ``labels`` (each arm's class against its name),
``statistics``, ``paired`` (seeds x prompts, the seeds' robust summaries and the check for a collapsed
seed), ``metrics`` (which metrics, their ranges), ``arms`` (final values over seeds),
``learning`` (how fast an arm learned, and its accuracy at a budget), ``build`` (the report) and ``cli`` (the command);
``sections/``: ``summary``, ``effects`` (settings without effect), ``comparisons`` (effects against
the baseline), ``budgets`` (the same at matched steps, generated tokens and training FLOPs), ``finals``,
``seeds`` (each seed's final accuracy), ``validation``, ``health``, ``completions``, ``curves``,
``method`` (the formulas and their simulated coverage), ``provenance``;
``render/``: ``document`` with ``markdown`` and ``html`` (the report's text), ``plots`` (curve
PNGs and the seeds' figure), ``tables`` (CSV and LaTeX), ``formatting`` (numbers and text).
"""

from grpo_lightning.report.arms import Arm, final_value
from grpo_lightning.report.build import build_report
from grpo_lightning.report.cells import CellInfo, arm_configs, discover_cells, flatten_config
from grpo_lightning.report.cli import main
from grpo_lightning.report.render.document import Doc
from grpo_lightning.report.render.plots import aligned_curve, plot_curves
from grpo_lightning.report.sections.comparisons import Effect, baseline_effects
from grpo_lightning.report.sections.summary import summary_paragraph
from grpo_lightning.report.statistics import (
    holm,
    minimum_detectable_effect,
    paired_test,
    seed_interval,
    standardised_effect,
    welch_dof,
    welch_test,
    wilson_interval,
)

__all__ = [
    "Arm",
    "CellInfo",
    "Doc",
    "Effect",
    "aligned_curve",
    "arm_configs",
    "baseline_effects",
    "build_report",
    "discover_cells",
    "final_value",
    "flatten_config",
    "holm",
    "main",
    "minimum_detectable_effect",
    "paired_test",
    "plot_curves",
    "seed_interval",
    "standardised_effect",
    "summary_paragraph",
    "welch_dof",
    "welch_test",
    "wilson_interval",
]
