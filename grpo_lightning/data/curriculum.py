"""An online difficulty curriculum: each training prompt's pass rate, measured on its rollouts, keeps it
in training or out of it (``--trainer.callbacks+=grpo_lightning.data.DifficultyCurriculum``).

A prompt's pass rate is the share of its group's completions whose reward is at least ``pass_reward``,
as last measured. A prompt whose rate is outside the open band ``(min_pass_rate, max_pass_rate)`` (by
default: solved by none, or by all, which gives no advantage and no gradient) is skipped by the
training sampler for the next ``revisit_epochs`` epochs, then drawn and measured again; unmeasured
prompts are drawn. The sampler decides lazily, as the data loader asks for rows, so each batch
reflects every outcome known when it is drawn. The state (the rates, and the batches drawn but not
trained on yet) is in every checkpoint: a resumed fit draws the batches the uninterrupted one draws.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from lightning import Callback
from torch import Tensor

from grpo_lightning.data.loaders import ResumableSampler
from grpo_lightning.errors import ConfigError

Batches = list[tuple[list[int], int]]  # drawn batches: (rows, position in the epoch's order after them)


def prompt_key(prompt: Any) -> str:
    """A prompt (text, or chat messages) as a dictionary key."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def rows_of_prompts(prompts: Sequence[Any]) -> dict[str, list[int]]:
    """Prompt key -> the rows that hold it (a prompt written twice is measured for both)."""
    found: dict[str, list[int]] = {}
    for row, prompt in enumerate(prompts):
        found.setdefault(prompt_key(prompt), []).append(row)
    return found


def group_pass_rates(rewards: Tensor, group_size: int, pass_reward: float) -> Tensor:
    """``rewards`` ``[P * G]`` -> each group's share of rewards ``>= pass_reward``, ``[P]``; NaN for a
    group with a NaN reward (a reward function failed on it)."""
    grouped = rewards.view(-1, group_size)
    rates = (grouped >= pass_reward).float().mean(-1)
    return torch.where(grouped.isnan().any(-1), torch.full_like(rates, float("nan")), rates)


class CurriculumSampler(ResumableSampler):
    """This rank's share of :class:`ResumableSampler`'s seeded order, skipping the rows ``curriculum``
    does not keep. It records the batches of ``batch_size`` rows it draws in the epoch (``drawn``, from
    the ``first_batch``-th on), so that a checkpoint holds those not served yet."""

    def __init__(self, dataset: Any, curriculum: DifficultyCurriculum, batch_size: int, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.curriculum, self.batch_size = curriculum, batch_size
        self.drawn: Batches = []
        self.first_batch = self.begin = self.skipped = 0  # begin: where fresh drawing started; skipped: rows passed over

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the draw DataLoader makes first
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        mine = order[: self.total_size][self.rank :: self.num_replicas]
        served, self.start = self.start // self.batch_size, 0
        unserved, position = self.curriculum.resume_point(self.epoch, served)
        self.first_batch, self.drawn, self.skipped, self.begin = served, [], 0, position
        for rows, after in unserved:  # drawn before the checkpoint, not trained on: drawn again as they were
            self.drawn.append((list(rows), after))
            yield from rows
        position = self.drawn[-1][1] if self.drawn else position
        batch: list[int] = []
        while position < len(mine):
            row, position = mine[position], position + 1
            if not self.curriculum.keeps(row, self.epoch):
                self.skipped += 1
                continue
            batch.append(row)
            if len(batch) == self.batch_size:
                self.drawn.append((batch, position))
                batch = []
            yield row

    def state(self, served: int) -> dict[str, Any]:
        """What a checkpoint after ``served`` batches of the epoch needs: the batches drawn after them
        and where drawing goes on."""
        position = self.drawn[-1][1] if self.drawn else self.begin
        return {"epoch": self.epoch, "served": served, "unserved": self.drawn[max(0, served - self.first_batch) :],
                "position": position}  # fmt: skip


class DifficultyCurriculum(Callback):
    """Keep training prompts whose pass rate is in ``(min_pass_rate, max_pass_rate)``.

    Args:
        min_pass_rate, max_pass_rate: the open band of pass rates a prompt is kept in; by default
            prompts no completion passes and prompts every completion passes are set aside.
        pass_reward: a completion passes when its reward is at least this.
        revisit_epochs: epochs a prompt out of the band is skipped for before it is measured again.

    Logs ``curriculum/measured`` (share of the training prompts measured), ``curriculum/too_easy`` and
    ``curriculum/too_hard`` (shares of those measured at or past the band's ends) and
    ``curriculum/skipped`` (rows the epoch's sampler passed over, per row drawn). Needs a
    :class:`~grpo_lightning.data.PromptDataModule`. On several devices every device measures with all
    devices' outcomes; a checkpoint holds rank 0's unserved batches, which the other ranks redraw.
    """

    def __init__(self, min_pass_rate: float = 0.0, max_pass_rate: float = 1.0, pass_reward: float = 1.0,
                 revisit_epochs: int = 2) -> None:  # fmt: skip
        if not 0.0 <= min_pass_rate < max_pass_rate <= 1.0:
            raise ConfigError(f"DifficultyCurriculum: need 0 <= min_pass_rate < max_pass_rate <= 1, got "
                              f"{min_pass_rate} and {max_pass_rate}; e.g. min_pass_rate 0.0, max_pass_rate 1.0.")  # fmt: skip
        if revisit_epochs < 0:
            raise ConfigError(f"DifficultyCurriculum: revisit_epochs must be >= 0, got {revisit_epochs}.")
        self.band, self.pass_reward, self.revisit_epochs = (min_pass_rate, max_pass_rate), pass_reward, revisit_epochs
        self.rates: dict[int, float] = {}  # row -> its last pass rate
        self.measured: dict[int, int] = {}  # row -> the epoch of that measure
        self.rows_of: dict[str, list[int]] = {}
        self.prompt_column: str | None = None  # the data module's, read when the sampler is made
        self.sampler: CurriculumSampler | None = None
        self.loader: Any = None  # the training loader, whose position a checkpoint reads
        self.restored: dict[str, Any] | None = None  # a checkpoint's sampler state, until its epoch is drawn

    def keeps(self, row: int, epoch: int) -> bool:
        """Whether ``row`` is drawn in ``epoch``: unmeasured, in the band, or set aside long enough."""
        rate, (low, high) = self.rates.get(row), self.band
        return rate is None or low < rate < high or epoch > self.measured[row] + self.revisit_epochs

    def resume_point(self, epoch: int, served: int) -> tuple[Batches, int]:
        """``(unserved batches, position)`` where the checkpoint left ``epoch`` after ``served`` batches
        (taken once); no batch and position 0 for a new epoch."""
        restored, self.restored = self.restored, None
        if restored is None or (restored["epoch"], restored["served"]) != (epoch, served):
            return [], 0
        return [(list(rows), int(after)) for rows, after in restored["unserved"]], int(restored["position"])

    def new_sampler(self, dataset: Any, batch_size: int, **kwargs: Any) -> CurriculumSampler:
        """The training sampler, which :class:`~grpo_lightning.data.PromptDataModule` asks for. The rows
        are this ``dataset``'s: ``data.long_prompts`` may have dropped or cut prompts since ``setup``."""
        if self.prompt_column is not None:
            self.rows_of = rows_of_prompts(dataset[self.prompt_column])
        self.sampler = CurriculumSampler(dataset, self, batch_size, **kwargs)
        return self.sampler

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        if stage != "fit":
            return
        if not hasattr(datamodule, "curriculum") or datamodule.train_dataset is None:
            raise ConfigError("DifficultyCurriculum: needs a PromptDataModule (--data), whose training sampler it sets.")
        datamodule.curriculum = self
        self.prompt_column = datamodule.prompt_column
        self.rows_of = rows_of_prompts(datamodule.train_dataset[self.prompt_column])

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.loader = trainer.train_dataloader
        low, high = self.band
        measured = max(1, len(self.rates))
        values = {"curriculum/measured": len(self.rates) / max(1, sum(map(len, self.rows_of.values()))),
                  "curriculum/too_easy": sum(rate >= high for rate in self.rates.values()) / measured,
                  "curriculum/too_hard": sum(rate <= low for rate in self.rates.values()) / measured}  # fmt: skip
        if self.sampler is not None:
            values["curriculum/skipped"] = self.sampler.skipped / max(1, sum(len(rows) for rows, _ in self.sampler.drawn))
        for name, value in values.items():
            pl_module.step_metrics.update(name, value)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Measure the prompts of the step's scored rollout (``outputs["rollout"]``: every group, none dropped)."""
        rollout = outputs.get("rollout") if isinstance(outputs, dict) else None
        if rollout is None or rollout.rewards is None:
            return
        rates = group_pass_rates(rollout.rewards.float(), rollout.group_size, self.pass_reward).cpu()
        first = [self.rows_of.get(prompt_key(p), [-1])[0] for p in rollout.prompts[:: rollout.group_size]]
        pairs = torch.stack([torch.tensor(first, dtype=torch.float64), rates.double()], dim=1)  # [P, 2]
        if trainer.world_size > 1:  # all devices' outcomes: every device keeps the same prompts
            pairs = trainer.strategy.all_gather(pairs.to(pl_module.device)).reshape(-1, 2).cpu()
        by_first = {rows[0]: rows for rows in self.rows_of.values()}
        epoch = self.sampler.epoch if self.sampler is not None else trainer.current_epoch  # the data's epoch
        for row, rate in pairs.tolist():
            if row >= 0 and rate == rate:  # NaN: a reward function failed on the group
                for same in by_first.get(int(row), [int(row)]):
                    self.rates[same], self.measured[same] = rate, epoch

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rates": dict(self.rates), "measured": dict(self.measured)}
        position = getattr(self.loader, "position", None)
        if self.sampler is not None and position is not None:
            state["sampler"] = self.sampler.state(position[1])
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rates = {int(k): float(v) for k, v in state_dict.get("rates", {}).items()}
        self.measured = {int(k): int(v) for k, v in state_dict.get("measured", {}).items()}
        self.restored = state_dict.get("sampler")
