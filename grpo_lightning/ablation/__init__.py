"""Ablation sweeps: many ``grpo-lightning fit`` runs over variants, seeds and settings.

``run`` (the ``grpo-lightning-ablate`` entry point and the spec's documentation), ``spec``,
``labels``, ``launch`` (the cells as the jobs of a Hydra launcher), ``sweep``, ``provenance``,
``metrics`` and ``runs`` (a run's TensorBoard scalars, which the report reads too).
"""

from grpo_lightning.ablation.run import main, sweep_from_config
from grpo_lightning.ablation.spec import Cell, SweepError, SweepSpec, cli_value, flatten, variant_config
from grpo_lightning.ablation.sweep import CellResult, cell_command, run_cell, run_sweep

__all__ = [
    "Cell",
    "CellResult",
    "SweepError",
    "SweepSpec",
    "cell_command",
    "cli_value",
    "flatten",
    "main",
    "run_cell",
    "run_sweep",
    "sweep_from_config",
    "variant_config",
]

