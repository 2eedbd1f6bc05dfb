"""The weights rollouts sample from: the policy's own, a replica, or the sharded policy gathered."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from grpo_lightning.strategies import RolloutReplica, full_parameters, is_sharded


def samples_from_shards(policy: nn.Module, strategy: Any) -> bool:
    """Whether rollouts sample from the sharded policy itself (FSDP ``rollout_weights="gather"``)."""
    return is_sharded(policy) and getattr(strategy, "rollout_weights", "gather") != "replica"


class RolloutWeights:
    """Chooses the model rollouts sample from: the policy itself; or a :class:`RolloutReplica`
    refreshed after every optimizer step, in ``dtype`` or, under FSDP (the strategy's
    ``rollout_weights="replica"``), unsharded; or under FSDP with ``"gather"`` the sharded policy
    with its root parameters gathered."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.replica: RolloutReplica | None = None

    @contextlib.contextmanager
    def model(self, policy: nn.Module, version: int, strategy: Any = None) -> Iterator[nn.Module]:
        """The model to sample from inside the ``with`` block; ``version``: optimizer steps taken
        (a replica of an older version is refreshed first)."""
        if not is_sharded(policy) and self.dtype in (None, next(policy.parameters()).dtype):
            yield policy
            return
        if samples_from_shards(policy, strategy):
            with full_parameters(policy):
                yield policy
            return
        if self.replica is None:
            self.replica = RolloutReplica(policy, self.dtype)
        if self.replica.version != version:
            self.replica.refresh(policy)
            self.replica.version = version
        yield self.replica.model
