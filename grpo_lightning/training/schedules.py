"""Schedules of the module's coefficients over a fit, as callbacks that set them before each step.

:class:`CosineKLSchedule` holds the KL coefficient ``beta`` at ``start`` for the first 10% of the
optimizer steps, lowers it along a half cosine to ``end`` by 80% of them, and holds it there
(:func:`cosine_kl_coefficient`). The value follows from ``trainer.global_step`` and
``trainer.max_steps`` alone, so a fit resumed from a checkpoint continues the schedule where it was.
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch.callbacks import Callback

from grpo_lightning.errors import ConfigError

#: The schedule's phases, as fractions of the fit's optimizer steps: ``start`` until the first,
#: ``end`` after the second.
COSINE_KL_WARMUP = 0.1
COSINE_KL_DECAY_END = 0.8


def cosine_kl_coefficient(step: int, total_steps: int, start: float = 0.1, end: float = 0.04) -> float:
    """``beta`` at optimizer step ``step`` of ``total_steps`` (``T``)::

        beta = start                                            step < 0.1 T
        beta = end + (start - end) * (1 + cos(pi * p)) / 2      p = (step - 0.1 T) / (0.7 T)
        beta = end                                              step > 0.8 T

    Continuous, and non-increasing in ``step`` for ``start >= end``.
    """
    hold, decay_end = COSINE_KL_WARMUP * total_steps, COSINE_KL_DECAY_END * total_steps
    if step < hold:
        return start
    if step > decay_end:
        return end
    progress = (step - hold) / (decay_end - hold)
    return end + (start - end) * (1 + math.cos(math.pi * progress)) / 2


class CosineKLSchedule(Callback):
    """Set the module's ``beta`` to :func:`cosine_kl_coefficient` of the step before each training step
    (``pl_module.set_coefficient``, which logs it as ``beta`` with the step's other metrics); ``kl.beta``
    stays the configured value. ``T`` is ``trainer.max_steps``.

    Args:
        start: ``beta`` for the first 10% of the steps; > 0.
        end: ``beta`` from 80% of the steps on; between 0 and ``start``.
    """

    def __init__(self, start: float = 0.1, end: float = 0.04) -> None:
        if not (start > 0 and end >= 0):
            raise ConfigError(
                f"CosineKLSchedule: start must be > 0 and end >= 0 (got start={start}, end={end}); "
                "e.g. start: 0.1 and end: 0.04 as in configs/schedules/cosine_kl.yaml."
            )
        if start < end:
            raise ConfigError(
                f"CosineKLSchedule: start ({start}) is below end ({end}), and the schedule lowers beta; "
                "swap them, or give a start >= end."
            )
        self.start = start
        self.end = end

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        beta = pl_module.coefficients.beta
        if not beta > 0:
            raise ConfigError(
                f"kl.beta: the module's beta is {beta}: there is no KL term to schedule, and no reference "
                "model is loaded for one; set --model.kl.beta > 0 (e.g. the schedule's start) or drop CosineKLSchedule "
                "from trainer.callbacks."
            )
        if not pl_module.needs_reference_model():
            raise ConfigError(
                f"kl.beta: {type(pl_module).__name__} loads no reference model, so it has no KL term to schedule; "
                "drop CosineKLSchedule from trainer.callbacks."
            )
        if trainer.max_steps is None or trainer.max_steps <= 0:
            raise ConfigError(
                f"trainer.max_steps: CosineKLSchedule spreads beta over the fit's optimizer steps, and max_steps "
                f"is {trainer.max_steps} (not set); give it, e.g. --trainer.max_steps 1000."
            )

    def beta(self, step: int, total_steps: int) -> float:
        """The coefficient at optimizer step ``step`` of ``total_steps``."""
        return cosine_kl_coefficient(step, total_steps, self.start, self.end)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        pl_module.set_coefficient("beta", self.beta(trainer.global_step, trainer.max_steps))
