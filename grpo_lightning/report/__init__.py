"""``grpo-lightning-report``: a Markdown + HTML report of a sweep's TensorBoard logs.

    grpo-lightning-report runs/ablation/default
    grpo-lightning-report runs/ablation/default --name default --out reports/

Writes ``<out>/<name>/report.md``, ``report.html`` and one PNG per learning curve. Runs are
grouped into *arms*: cells that differ only in their seed (``cell.json`` written by
``grpo-lightning-ablate``; for plain ``grpo-lightning fit`` directories the model class and the
seed come from the saved ``config.yaml``). The report is a pure function of the logs:
regenerating it from the same sweep directory gives byte-identical files.

Statistics: the mean over seeds with a Student-t confidence interval (``mean_ci``), Welch's
unequal-variance t-test between arms (``welch_test``), Holm's correction over the pairs.

Modules: ``runs`` (a run's TensorBoard scalars), ``cells`` (a sweep's cell folders and configs),
``statistics``, ``arms`` (final metrics and comparisons of arms), ``plots`` (curve PNGs),
``document`` with ``markdown`` and ``html`` (the report's text), ``build`` (the report) and
``cli`` (the command).
"""

from grpo_lightning.report.arms import Arm, final_value, pairwise_rows, summary_paragraph
from grpo_lightning.report.build import build_report
from grpo_lightning.report.cells import CellInfo, arm_configs, discover_cells, flatten_config
from grpo_lightning.report.cli import main
from grpo_lightning.report.document import Doc
from grpo_lightning.report.plots import aligned_curve, plot_curves
from grpo_lightning.report.runs import Run, Series, event_directory, load_run, read_scalars
from grpo_lightning.report.statistics import holm, mean_ci, welch_dof, welch_test

__all__ = [
    "Arm",
    "CellInfo",
    "Doc",
    "Run",
    "Series",
    "aligned_curve",
    "arm_configs",
    "build_report",
    "discover_cells",
    "event_directory",
    "final_value",
    "flatten_config",
    "holm",
    "load_run",
    "main",
    "mean_ci",
    "pairwise_rows",
    "plot_curves",
    "read_scalars",
    "summary_paragraph",
    "welch_dof",
    "welch_test",
]
