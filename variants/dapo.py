"""DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale".

GRPO advantages with four changes (eq. 8-13):

* Clip-Higher (sec. 3.1): decoupled bounds ``clip(r, 1 - eps_low, 1 + eps_high)``, 0.2 / 0.28,
  so low-probability tokens can grow and entropy does not collapse.
* Dynamic Sampling (sec. 3.2): groups whose rewards are all equal carry no gradient; drop them
  and keep sampling prompts until the batch holds as many informative groups as prompts asked
  for (at most ``max_gen_batches`` generation batches)::

      0 < |{o_i : is_equivalent(a, o_i)}| < G

* Token-Level Policy Gradient Loss (sec. 3.3): every token of the batch weighs the same::

      J = 1 / sum_i |o_i| * sum_i sum_t min(r_it A_it, clip(r_it, 1 - eps_low, 1 + eps_high) A_it)

* Overlong Reward Shaping (sec. 3.4, eq. 13): with ``L_max = max_new_tokens`` and a buffer
  ``L_cache``, a completion longer than ``L_max - L_cache`` loses reward linearly, up to
  ``penalty_factor``.

No KL term (beta 0).

What a step is: an optimizer step, as for every variant. A generation batch that leaves the
dynamic-sampling buffer short of a batch of informative groups ends without an update; it logs no
row, and its counts (rewards, lengths, ``dynamic_sampling/gen_batches``, ``counters/generation_batches``)
go into the next update's row. ``max_steps``, ``global_step``, ``val_check_interval``, checkpoints
and the loggers' x-axis (``step``) count optimizer steps, so DAPO validates at the same steps as
GRPO; ``log_every_n_steps`` counts generation batches (Lightning's batches). After ``max_gen_batches``
batches short of a full batch, ``on_exhausted: partial`` trains on the groups found, in as many
(smaller) minibatches as a full batch, so that every update makes the same optimizer steps and the
fit validates at GRPO's steps; when no group was informative at all the update's steps still
count, without changing the weights (``skip_update``; ``dynamic_sampling/skipped_updates`` is 1 in
its row). Under manual optimization Lightning's ``global_step`` counts ``optimizer.step()`` calls,
so an update (or ``skip_update``'s steps without gradients) is what advances it; the generation batches
stay Lightning's own batches, so their data position and the buffer go into every checkpoint.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from grpo_lightning.algorithms import functional
from grpo_lightning.training.options import KLOptions, LossOptions
from grpo_lightning.rollout.types import Rollout, RolloutBuffer
from grpo_lightning.errors import require
from grpo_lightning.variants.grpo import GRPO


class DAPO(GRPO):
    """GRPO with clip-higher, dynamic sampling, token-level loss and overlong reward shaping.

    Args:
        dynamic_sampling: drop zero-variance groups and refill the batch.
        max_gen_batches: generation batches one update may draw on.
        on_exhausted: when ``max_gen_batches`` are spent before the batch is full: ``"error"``, or
            ``"partial"`` to train on the informative groups found so far (none: a step that changes no weight).
        overlong_buffer: ``L_cache`` in tokens; ``None`` is 20% of ``max_new_tokens`` (the paper's
            4096 of 20480); 0 turns the shaping off.
        overlong_penalty: the largest penalty, reached at ``max_new_tokens``.
    """

    #: ``sum(loss * mask) / sum(mask)`` over the whole batch (all micro-batches and devices).
    default_aggregation = "token_mean"

    def __init__(
        self,
        model: str,
        *,
        loss: LossOptions = LossOptions(clip_eps_high=0.28),
        kl: KLOptions = KLOptions(beta=0.0),
        dynamic_sampling: bool = True,
        max_gen_batches: int = 3,
        on_exhausted: Literal["error", "partial"] = "partial",
        overlong_buffer: int | None = None,
        overlong_penalty: float = 1.0,
        **kwargs,
    ) -> None:
        super().__init__(model, loss=loss, kl=kl, **kwargs)
        require(max_gen_batches >= 1, f"max_gen_batches: must be at least 1 (got {max_gen_batches}).")
        require(on_exhausted in ("error", "partial"), f"on_exhausted: {on_exhausted!r} is not 'error' or 'partial'.")
        overlong_buffer = self.max_new_tokens // 5 if overlong_buffer is None else overlong_buffer
        require(
            0 <= overlong_buffer <= self.max_new_tokens,
            f"overlong_buffer: must be between 0 and max_new_tokens ({self.max_new_tokens}), got {overlong_buffer}.",
        )
        require(
            self.environment is None or overlong_penalty == 0,
            "overlong_penalty: measures one completion against max_new_tokens, and multi-turn episodes (environment) "
            "have several turns; set overlong_penalty to 0.",
        )
        self.dynamic_sampling = dynamic_sampling
        self.max_gen_batches = max_gen_batches
        self.on_exhausted = on_exhausted
        self.overlong_buffer = overlong_buffer
        self.overlong_penalty = overlong_penalty
        self.buffer = RolloutBuffer()  # informative groups kept for the next update (and in checkpoints)

    def select(self, rollout: Rollout, num_groups: int | None = None) -> Rollout | None:
        """Dynamic sampling: buffer informative groups until a batch of them (``num_groups``, the
        batch's groups before ``skip_group`` left any out) is full."""
        if not self.dynamic_sampling:
            return rollout
        target = num_groups or rollout.num_groups
        self.buffer.append(rollout, functional.informative_groups(rollout.rewards.view(-1, rollout.group_size)))
        # Over several devices the decision is common: every device updates, with as many groups
        # as the device that found fewest, or none does (each update runs collectives).
        kept = self.min_over_ranks(self.buffer.num_groups)
        if kept < target and self.buffer.batches < self.max_gen_batches:
            return None
        if kept < target and self.on_exhausted == "error":
            self.buffer.clear()
            raise RuntimeError(
                f"DAPO dynamic sampling found {kept} informative groups of the {target} needed in "
                f"{self.max_gen_batches} generation batches. Raise --model.max_gen_batches, or set "
                "--model.on_exhausted partial to train on the groups found."
            )
        self.step_metrics.update("dynamic_sampling/gen_batches", self.buffer.batches)
        self.step_metrics.update("dynamic_sampling/frac_groups_kept", self.buffer.num_groups / self.buffer.groups_seen)
        self.step_metrics.update("dynamic_sampling/skipped_updates", float(kept == 0))
        batch = self.buffer.take(min(kept, target), self.tokenizer.pad_token_id)
        if batch is None:
            self.skip_update(target)  # the steps count: max_steps is reached even when nothing is informative
        return batch

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """Soft overlong punishment (eq. 13) added to the task reward (and the base's shaping: the KL
        where ``kl.placement`` is ``"reward"``)."""
        rewards = super().shape_rewards(rewards, rollout)
        if self.overlong_buffer == 0:
            return rewards
        penalty = functional.overlong_penalty(
            rollout.lengths, self.max_new_tokens, self.overlong_buffer, self.overlong_penalty
        )
        self.step_metrics.update("overlong_penalty", penalty.mean())
        return rewards + penalty.to(rewards)
