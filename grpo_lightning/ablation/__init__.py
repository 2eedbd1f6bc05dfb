"""Ablation sweeps: many ``grpo-lightning fit`` runs over variants, seeds and settings."""

from grpo_lightning.ablation.run import SweepError, SweepSpec, main, run_sweep

__all__ = ["SweepError", "SweepSpec", "main", "run_sweep"]
