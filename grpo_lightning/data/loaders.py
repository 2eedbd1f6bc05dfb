"""A seeded, resumable order of the prompts: the sampler and the data loader whose state is the data position."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, DistributedSampler


class ResumableSampler(DistributedSampler):
    """This rank's share of a seeded shuffle of the dataset, which can start mid-epoch.

    Epoch ``e`` is the permutation drawn from a generator seeded with ``seed + e`` (epoch 0 is the
    order a ``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))`` gives),
    dealt to the ranks in turn. ``start`` skips that many of this rank's samples in the next
    iteration only; :class:`ResumableDataLoader` sets it when it restores a data position.

    A ``DistributedSampler``, so Lightning keeps it under DDP and FSDP instead of replacing it.
    """

    def __init__(self, dataset: Any, *, seed: int = 0, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.start = 0  # a restored position belongs to the epoch it was saved in
        super().set_epoch(epoch)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the draw DataLoader makes first
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        mine = order[: self.total_size][self.rank :: self.num_replicas]
        start, self.start = self.start, 0
        return iter(mine[start:])


class ResumableDataLoader(DataLoader):
    """A DataLoader over a :class:`ResumableSampler` whose state is its data position.

    ``state_dict()`` holds the epoch and how many of its batches were served. Lightning saves it
    in every checkpoint and, on ``ckpt_path``, restores it before iterating, so a resumed fit
    continues the epoch's order with the first batch it had not served.

    While a batch is out, ``upcoming`` is the batch served after it (``None`` at the epoch's end),
    not yet counted as served: the next batch's rollout can start before it is asked for
    (:class:`grpo_lightning.rollout.stale.StaleRollouts` with ``overlap``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.sampler, ResumableSampler):
            raise TypeError(f"ResumableDataLoader needs a ResumableSampler, got {type(self.sampler).__name__}.")
        self.position = (self.sampler.epoch, 0)  # (epoch, batches of it served)
        self.upcoming: Any | None = None

    def __iter__(self):
        epoch, served = self.sampler.epoch, self.sampler.start // self.batch_size
        self.position = (epoch, served)
        batches = super().__iter__()
        self.upcoming = next(batches, None)
        while self.upcoming is not None:
            batch, self.upcoming = self.upcoming, next(batches, None)
            served += 1
            self.position = (epoch, served)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        epoch, batches = self.position
        return {
            "epoch": epoch,
            "batches": batches,
            "batch_size": self.batch_size,
            "num_replicas": self.sampler.num_replicas,
            "seed": self.sampler.seed,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        epoch, batches = state_dict["epoch"], state_dict["batches"]
        saved = (state_dict["batch_size"], state_dict["num_replicas"])
        current = (self.batch_size, self.sampler.num_replicas)
        if saved != current:
            # Same global prefix of the epoch's order, counted in the new batches.
            samples = batches * saved[0] * saved[1]
            batches = samples // (current[0] * current[1])
            rank_zero_warn(
                f"The checkpoint's data position was saved with batch_size x devices = {saved[0]} x {saved[1]}, "
                f"this run has {current[0]} x {current[1]}: resuming epoch {epoch} after {samples} samples "
                f"(batch {batches}); the resumed run is not an exact continuation."
            )
        self.sampler.seed = state_dict.get("seed", self.sampler.seed)
        self.sampler.epoch = epoch
        self.sampler.start = batches * self.batch_size
        self.position = (epoch, batches)
