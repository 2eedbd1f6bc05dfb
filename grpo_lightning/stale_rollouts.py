"""One-step-stale rollouts: each rollout sampled with the weights the policy had before its
previous update, as when the next batch is generated while the current one trains.

Overlapping generation with the update (verl's and OpenRLHF's one-step off-policy pipelines)
makes rollout ``k`` come from the weights after ``k - 1`` update phases instead of ``k``. This
callback gives any fit that staleness without the overlap: before the first optimizer step of
each training step it copies the policy into a replica
(:meth:`grpo_lightning.generation.RolloutWeights.snapshot`), and rollouts sample from that replica
until the next one. So whether a variant still learns as well when its samples are a step old can
be measured anywhere, the CPU included, before any device time goes into the overlap itself.

The engine records each sampled token's log-prob under the stale weights
(``rollout.sampling_logp``), so the update's importance correction (``rollout_correction``, e.g.
``token_truncate``: TIS) and the ``sampling/*`` metrics see the staleness. ``rollout/staleness``
logs how many optimizer steps the sampling weights were behind. Validation samples from the
current policy.

    grpo-lightning fit ... --config configs/rollout/one_step_stale.yaml
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback


class StaleRollouts(Callback):
    """Training rollouts from the weights of the start of the previous update phase."""

    def __init__(self) -> None:
        self._snapshot_due = False

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        weights = module.rollout_weights
        weights.stale = True
        if weights.snapshot_version is not None:  # the first rollout takes the starting weights
            module.step_metrics.update("rollout/staleness", float(module.policy_version - weights.snapshot_version))
        self._snapshot_due = True

    def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
        if self._snapshot_due:  # the weights this step's update starts from: the next rollout's
            module.rollout_weights.snapshot(module.policy, module.policy_version)
            self._snapshot_due = False

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        module.rollout_weights.stale = False  # until the next training batch

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        module.rollout_weights.stale = False
