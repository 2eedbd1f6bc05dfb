"""Never train on NaN: an optimizer step whose gradient is not finite changes no weight.

A NaN or an infinity anywhere in a minibatch's loss (an inf log-prob, a reward that slipped
through, an overflow in bf16) reaches the gradient, and from there its total norm, which the
update computes anyway (to clip it). When that norm is not finite the gradient is dropped before
``optimizer.step()``: AdamW skips parameters without a gradient, so neither the weights nor the
optimizer's moments change, exactly as if the minibatch had not been drawn. The step still counts
(``max_steps``, the learning-rate schedule), is counted in ``skipped_steps``, and is warned
about with the step and the rollout's first prompts. After ``max_nonfinite_steps`` such steps in a
row the fit stops: something is broken for good (a learning rate that diverged, a reward that
always fails) and more steps would only burn device time.

Under DDP and FSDP the norm is of the gradient averaged over all devices, so every process skips
the same steps. Under fp16 with a gradient scaler, the scaler skips steps with infinite gradients
itself (and lowers its scale) and no norm is taken here.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from grpo_lightning.errors import require


class NonFiniteTrainingError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite gradient."""


class NonFiniteGuard:
    """Counts the optimizer steps whose gradient norm is not finite; :meth:`allows` says whether a
    step may apply its gradient."""

    def __init__(self, max_in_a_row: int = 3) -> None:
        require(isinstance(max_in_a_row, int) and max_in_a_row >= 1,
                f"optim.max_nonfinite_steps: must be a positive integer, got {max_in_a_row!r}.")  # fmt: skip
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0
        self.skipped = 0

    def allows(self, norm: Tensor, step: int, prompts: Sequence[Any] = (), what: str = "gradient") -> bool:
        """``False`` (and counted, warned about; an error after too many in a row) when ``norm``
        is NaN or infinite."""
        if bool(torch.isfinite(norm)):
            self.in_a_row = 0
            return True
        self.skipped += 1
        self.in_a_row += 1
        shown = "; ".join(repr(str(p))[:80] for p in list(prompts)[:3])
        message = (f"step {step}: the {what} norm is {float(norm)}; the optimizer step is skipped (no weight changes). "
                   f"Rollout's first prompts: {shown or '-'}")  # fmt: skip
        if self.in_a_row >= self.max_in_a_row:
            raise NonFiniteTrainingError(
                f"{message}. That is {self.in_a_row} non-finite steps in a row: check the learning rate, the dtype "
                "(bf16 weights overflow where fp32 do not) and the reward functions, or raise optim.max_nonfinite_steps."
            )
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return False

    def state_dict(self) -> dict[str, int]:
        return {"in_a_row": self.in_a_row, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.in_a_row, self.skipped = state.get("in_a_row", 0), state.get("skipped", 0)

