"""The weights rollouts sample from: the policy's own, a replica, or the sharded policy gathered."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from transformers import PreTrainedTokenizerBase

from grpo_lightning.models.lora import has_adapters, merged_model, merged_weights
from grpo_lightning.runtime.strategies import RolloutReplica, full_parameters, full_state_dict, is_sharded


def save_policy(policy: nn.Module, tokenizer: PreTrainedTokenizerBase, directory: str, write: bool = True) -> None:
    """Write ``policy`` and ``tokenizer`` as a plain Hugging Face directory (where ``write``); a
    sharded policy is gathered first, so under FSDP every process must call it."""
    weights = None
    if has_adapters(policy):  # LoRA: the merged model (grpo_lightning.checkpoints.export --adapter writes the adapter)
        policy = merged_model(policy)
    if is_sharded(policy):
        with full_state_dict(policy):
            weights = policy.state_dict()
        policy = policy.module
    if write:
        policy.save_pretrained(directory, state_dict=weights)
        tokenizer.save_pretrained(directory)


def samples_from_shards(policy: nn.Module, strategy: Any) -> bool:
    """Whether rollouts sample from the sharded policy itself (FSDP ``rollout_weights="gather"``)."""
    return is_sharded(policy) and getattr(strategy, "rollout_weights", "gather") != "replica"


class RolloutWeights:
    """Chooses the model rollouts sample from: the policy itself; or a :class:`RolloutReplica`
    refreshed after every optimizer step, with LoRA's merged weights, in ``dtype`` or, under FSDP (the strategy's
    ``rollout_weights="replica"``), unsharded; or under FSDP with ``"gather"`` the sharded policy
    with its root parameters gathered. While ``stale`` (:class:`grpo_lightning.rollout.stale.StaleRollouts`),
    a second replica that holds the weights of the last :meth:`snapshot`."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.replica: RolloutReplica | None = None
        self.stale = False
        self.snapshot_replica: RolloutReplica | None = None

    @contextlib.contextmanager
    def model(self, policy: nn.Module, version: int, strategy: Any = None) -> Iterator[nn.Module]:
        """The model to sample from inside the ``with`` block; ``version``: optimizer steps taken
        (a replica of an older version is refreshed first)."""
        if self.stale:
            if self.snapshot_replica is None:
                self.snapshot(policy, version)
            yield self.snapshot_replica.model
            return
        if not has_adapters(policy):  # LoRA always samples from a plain model with the merged weights
            if not is_sharded(policy) and self.dtype in (None, next(policy.parameters()).dtype):
                yield policy
                return
            if samples_from_shards(policy, strategy):
                with full_parameters(policy):
                    yield policy
                return
        self.replica = self._refreshed(self.replica, policy, version)
        yield self.replica.model

    def snapshot(self, policy: nn.Module, version: int) -> None:
        """Copy the policy's current weights (``version``) into the replica stale rollouts sample
        from (every process must call it under FSDP)."""
        self.snapshot_replica = self._refreshed(self.snapshot_replica, policy, version)

    def version_sampled(self, version: int) -> int:
        """The policy version of the weights :meth:`model` yields, ``version`` being the policy's."""
        return self.snapshot_replica.version if self.stale and self.snapshot_replica is not None else version

    def snapshot_state(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of the last :meth:`snapshot` (its version and weights, in the replica's
        dtype; with LoRA the merged model's), for :meth:`load_snapshot`; ``None`` before the first one."""
        replica = self.snapshot_replica
        return None if replica is None else {"version": replica.version, "weights": replica.model.state_dict()}

    def load_snapshot(self, policy: nn.Module, state: dict[str, Any]) -> None:
        """Make the snapshot the one :meth:`snapshot_state` returned (``policy``: the model it is a copy of)."""
        if self.snapshot_replica is None:
            base = policy.get_base_model() if has_adapters(policy) else policy
            self.snapshot_replica = RolloutReplica(base, self.dtype)
        with torch.no_grad():
            self.snapshot_replica.model.load_state_dict(state["weights"])
        self.snapshot_replica.version = state["version"]

    @property
    def snapshot_version(self) -> int | None:
        return None if self.snapshot_replica is None else self.snapshot_replica.version

    def _refreshed(self, replica: RolloutReplica | None, policy: nn.Module, version: int) -> RolloutReplica:
        adapters = has_adapters(policy)
        if replica is None:
            replica = RolloutReplica(policy.get_base_model() if adapters else policy, self.dtype)
        if replica.version != version:
            if adapters:
                replica.refresh(policy, merged_weights(policy))
            else:
                replica.refresh(policy)
            replica.version = version
        return replica
