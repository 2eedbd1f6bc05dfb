"""The optimizer step: AdamW that keeps the updates of bf16 weights (:mod:`.compensated`), and the guard
that drops a step whose gradient is NaN or infinite (:mod:`.nonfinite`)."""

from grpo_lightning.runtime.optimization.compensated import CompensatedAdamW, adamw
from grpo_lightning.runtime.optimization.nonfinite import NonFiniteGuard, NonFiniteTrainingError

__all__ = ["CompensatedAdamW", "NonFiniteGuard", "NonFiniteTrainingError", "adamw"]
