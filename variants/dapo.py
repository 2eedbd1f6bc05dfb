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
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Literal

import torch
from torch import Tensor

from grpo_lightning import functional as F
from grpo_lightning.module import ConfigError
from grpo_lightning.rollout import Rollout
from variants.grpo import GRPO


class DAPO(GRPO):
    """GRPO with clip-higher, dynamic sampling, token-level loss and overlong reward shaping.

    Args:
        dynamic_sampling: drop zero-variance groups and refill the batch.
        max_gen_batches: generation batches one update may draw on.
        on_exhausted: when ``max_gen_batches`` are spent before the batch is full: ``"error"``, or
            ``"partial"`` to train on the informative groups found so far (none: skip the update).
        overlong_buffer: ``L_cache`` in tokens; ``None`` is 20% of ``max_new_tokens`` (the paper's
            4096 of 20480); 0 turns the shaping off.
        overlong_penalty: the largest penalty, reached at ``max_new_tokens``.
    """

    def __init__(
        self,
        model: str,
        *,
        beta: float = 0.0,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.28,
        dynamic_sampling: bool = True,
        max_gen_batches: int = 3,
        on_exhausted: Literal["error", "partial"] = "partial",
        overlong_buffer: int | None = None,
        overlong_penalty: float = 1.0,
        **kwargs,
    ) -> None:
        super().__init__(model, beta=beta, clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, **kwargs)
        if max_gen_batches < 1:
            raise ConfigError(f"max_gen_batches: must be at least 1 (got {max_gen_batches}).")
        if on_exhausted not in ("error", "partial"):
            raise ConfigError(f"on_exhausted: {on_exhausted!r} is not 'error' or 'partial'.")
        if overlong_buffer is None:
            overlong_buffer = self.max_new_tokens // 5
        if not 0 <= overlong_buffer <= self.max_new_tokens:
            raise ConfigError(
                f"overlong_buffer: must be between 0 and max_new_tokens ({self.max_new_tokens}), got {overlong_buffer}."
            )
        self.dynamic_sampling = dynamic_sampling
        self.max_gen_batches = max_gen_batches
        self.on_exhausted = on_exhausted
        self.overlong_buffer = overlong_buffer
        self.overlong_penalty = overlong_penalty
        self._kept: list[Rollout] = []
        self._gen_batches = 0
        self._groups_seen = 0

    def select(self, rollout: Rollout) -> Rollout | None:
        """Dynamic sampling: buffer informative groups until a batch of them is full."""
        if not self.dynamic_sampling:
            return rollout
        target = rollout.num_groups
        informative = F.informative_groups(rollout.rewards.view(-1, rollout.group_size))
        self._gen_batches += 1
        self._groups_seen += target
        if informative.any():
            self._kept.append(rollout.select_groups(informative.cpu()))
        found = kept = sum(part.num_groups for part in self._kept)
        # Over several devices the decision is common: every device updates, with as many groups
        # as the device that found fewest, or none does (each update runs collectives).
        kept = self.min_over_ranks(kept)
        if kept < target and self._gen_batches < self.max_gen_batches:
            return None
        if kept < target and self.on_exhausted == "error":
            gen_batches, self._kept, self._gen_batches, self._groups_seen = self._gen_batches, [], 0, 0
            raise RuntimeError(
                f"DAPO dynamic sampling found {kept} informative groups of the {target} needed in "
                f"{gen_batches} generation batches. Raise --model.max_gen_batches, or set "
                "--model.on_exhausted partial to train on the groups found."
            )
        self.step_metrics.update("dynamic_sampling/gen_batches", self._gen_batches)
        self.step_metrics.update("dynamic_sampling/frac_groups_kept", found / self._groups_seen)
        batch = Rollout.concat(self._kept, self.tokenizer.pad_token_id) if kept else None
        self._kept, self._gen_batches, self._groups_seen = [], 0, 0
        if batch is not None and batch.num_groups > min(kept, target):
            batch = batch.select_groups(torch.arange(min(kept, target)))
        return batch

    def training_state(self) -> dict[str, Any]:
        """Adds the dynamic-sampling buffer: the informative groups kept for the next update."""
        state = super().training_state()
        state["dynamic_sampling"] = {
            "kept": [_rollout_state(part) for part in self._kept],
            "gen_batches": self._gen_batches,
            "groups_seen": self._groups_seen,
        }
        return state

    def load_training_state(self, state: dict[str, Any]) -> None:
        super().load_training_state(state)
        buffer = state.get("dynamic_sampling", {"kept": [], "gen_batches": 0, "groups_seen": 0})
        self._kept = [Rollout(**part) for part in buffer["kept"]]
        self._gen_batches = buffer["gen_batches"]
        self._groups_seen = buffer["groups_seen"]

    def on_train_start(self) -> None:
        super().on_train_start()
        # A restored buffer was loaded on the CPU, before the module moved to its device.
        self._kept = [_rollout_to(part, self.device) for part in self._kept]

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """Soft overlong punishment (eq. 13) added to the task reward."""
        if self.overlong_buffer == 0:
            return rewards
        penalty = F.overlong_penalty(rollout.lengths, self.max_new_tokens, self.overlong_buffer, self.overlong_penalty)
        self.step_metrics.update("overlong_penalty", penalty.mean())
        return rewards + penalty.to(rewards)

    def aggregate(self, loss: Tensor, mask: Tensor, *, num_sequences=None, num_tokens: Tensor | None = None) -> Tensor:
        """``sum(loss * mask) / sum(mask)`` over the whole batch (all micro-batches and devices)."""
        return F.token_mean(loss, mask, num_tokens=num_tokens)


def _rollout_to(rollout: Rollout, device: torch.device | str) -> Rollout:
    tensors = {f.name: getattr(rollout, f.name) for f in fields(rollout)}
    return replace(rollout, **{k: v.to(device) for k, v in tensors.items() if isinstance(v, Tensor)})


def _rollout_state(rollout: Rollout) -> dict[str, Any]:
    """A rollout as a dict of its fields (tensors on the CPU), ``Rollout(**state)`` rebuilds it."""
    moved = _rollout_to(rollout, "cpu")
    return {f.name: getattr(moved, f.name) for f in fields(moved)}
