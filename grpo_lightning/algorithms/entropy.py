"""The entropy bonus (``entropy_coef``): a per-token term whose gradient raises the policy's entropy,
and a callback that steers its coefficient toward a target entropy."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from grpo_lightning.errors import ConfigError


def entropy_bonus(logp: Tensor, old_logp: Tensor) -> Tensor:
    """``[N, T]``: ``sg(r_t) * sg(log pi_t) * log pi_t``, ``r_t = pi_t / pi_old,t``, whose gradient is
    the score-function estimate of ``-grad H(pi(. | s_t))`` at the sampled token::

        grad H(pi(. | s)) = -E_{y ~ pi} [ log pi(y | s) grad log pi(y | s) ]

    Adding ``entropy_coef`` times it to each token's loss is the entropy bonus ``- entropy_coef * H_t``
    in expectation (the ratio reweights tokens sampled by ``pi_old``). The log-prob passes give the
    exact entropy without a gradient (it is logged as ``entropy``), so the gradient is estimated
    from the sampled tokens: unbiased, noisier than the exact one. Its value is not the entropy."""
    weight = torch.exp(logp.detach() - old_logp)
    return weight * logp.detach() * logp


class AdaptiveEntropy(Callback):
    """Adaptive entropy control (TRL's ``use_adaptive_entropy``): after each training step, the
    entropy bonus's coefficient ``c`` (the module's ``coefficients.entropy_coef``, which starts at
    ``loss.entropy_coef``) moves by ``delta`` to steer the policy's mean token entropy ``H`` (the
    step's ``entropy``) toward ``target``::

        c <- clip(c + delta if H < target else c - delta, min_coef, max_coef)

    Set by ``pl_module.set_coefficient``, which logs it as ``entropy/coef`` (in the next step's row;
    the first row has the value it starts from). Saved in checkpoints: a resumed fit goes on with
    the coefficient it had. Add it with ``--trainer.callbacks+=grpo_lightning.algorithms.entropy.AdaptiveEntropy``.
    Defaults are TRL's: target 0.2 nats per token, delta 0.005, ``c`` within [0, 1]."""

    def __init__(self, target: float = 0.2, delta: float = 0.005, min_coef: float = 0.0, max_coef: float = 1.0) -> None:
        if not (target >= 0 and delta > 0 and 0 <= min_coef <= max_coef):
            raise ConfigError(
                f"AdaptiveEntropy: needs target >= 0, delta > 0 and 0 <= min_coef <= max_coef (got target={target}, "
                f"delta={delta}, min_coef={min_coef}, max_coef={max_coef})."
            )
        self.target, self.delta, self.min_coef, self.max_coef = target, delta, min_coef, max_coef
        self.coef: float | None = None  # the coefficient in use; None until the fit starts
        self.seen = 0  # the module's logged steps already steered on

    def on_train_start(self, trainer, pl_module) -> None:
        if self.coef is None:
            self.coef = float(pl_module.coefficients.entropy_coef)
        pl_module.set_coefficient("entropy_coef", self.coef)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if pl_module.logged_steps == self.seen:  # no step was taken (DAPO's sampling goes on)
            return
        self.seen = pl_module.logged_steps
        entropy = pl_module.last_step_metrics.get("entropy")
        if entropy is None or not math.isfinite(entropy):
            return
        step = self.delta if entropy < self.target else -self.delta
        self.coef = min(max(self.coef + step, self.min_coef), self.max_coef)
        pl_module.set_coefficient("entropy_coef", self.coef)

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef, "seen": self.seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.coef, self.seen = state_dict["coef"], state_dict["seen"]
