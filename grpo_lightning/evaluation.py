"""Validation and test of the policy: one completion per prompt, scored by the reward functions,
``val/*`` metrics (``test/*`` under ``grpo-lightning test``). A mixin of
:class:`grpo_lightning.module.GroupPolicyOptimization`, which owns the metrics, the reward functions
and ``generate``."""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_lightning.rewards import score_completions
from grpo_lightning.rollout import Rollout


class Evaluation:
    """``validation_step``/``test_step`` and what they need; mixed into the LightningModule."""

    def on_validation_epoch_start(self) -> None:
        # Fresh states in this evaluation's grad mode (one made under inference mode can't be updated).
        for metric in (self.val_accuracy, self.val_reward, self.val_length):
            metric.reset()

    def accuracy_scores(self, rollout: Rollout) -> Tensor:
        """``[N]`` scores of ``accuracy_func``: its column of the rewards when it is also a reward
        function, so it is not called twice."""
        accuracy = self.accuracy_function[1]
        for column, (_, function) in enumerate(self.reward_functions):
            if function is accuracy:
                return rollout.reward_per_function[:, column]
        return score_completions([self.accuracy_function], rollout.prompts, rollout.completions, rollout.columns)[:, 0]

    def validation_step(self, batch: dict[str, list], batch_idx: int) -> None:
        """One completion per prompt: ``val/*`` (``test/*`` on the test split, ``grpo-lightning test``)."""
        prefix = "test" if self._trainer is not None and self.trainer.testing else "val"
        rollout = self.generate(batch, 1, self.val_sampling)
        self.score(rollout)
        accuracy = self.accuracy_scores(rollout)
        size = len(rollout)
        self.val_accuracy.update(torch.nanmean(accuracy), size)
        self.val_reward.update(rollout.rewards.mean(), size)
        self.val_length.update(rollout.lengths.float().mean(), size)
        self.log(f"{prefix}/accuracy", self.val_accuracy, on_epoch=True, prog_bar=True, batch_size=size)
        self.log(f"{prefix}/reward", self.val_reward, on_epoch=True, batch_size=size)
        self.log(f"{prefix}/mean_length", self.val_length, on_epoch=True, batch_size=size)
        if self.batches_without_update:  # the x-axis of the last training step's row
            self.log("step", float(max(self.logged_steps - 1, 0)), on_epoch=True, batch_size=size)

    test_step = validation_step
    on_test_epoch_start = on_validation_epoch_start
