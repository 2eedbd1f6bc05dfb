"""The online difficulty curriculum: pass rates by hand, the band, lazy draws, exact resume and a fit."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from grpo_lightning.data import ArithmeticDataModule, DifficultyCurriculum
from grpo_lightning.data.curriculum import group_pass_rates
from grpo_lightning.data.loaders import ResumableDataLoader
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO

#: Six prompts, each in two rows (r and r + 6): measuring one measures both.
PROMPTS = [f"p{i % 6}" for i in range(12)]
#: Pass rates the "policy" gets: p0 and p1 every time (too easy), p2 never (too hard), the rest half the time.
RATES = {"p0": 1.0, "p1": 1.0, "p2": 0.0}


def test_a_groups_pass_rate_is_its_share_of_rewards_at_the_pass_reward():
    rewards = torch.tensor([1.0, 0.0, 1.5, 1.0, 0.2, 0.0, 0.9, 0.0, 1.0, float("nan"), 1.0, 1.0])
    rates = group_pass_rates(rewards, 4, pass_reward=1.0)
    assert rates[:2].tolist() == [0.75, 0.0] and math.isnan(rates[2])


def test_a_prompt_is_kept_unmeasured_inside_the_band_or_once_set_aside_long_enough():
    curriculum = DifficultyCurriculum(min_pass_rate=0.0, max_pass_rate=1.0, revisit_epochs=2)
    curriculum.rates, curriculum.measured = {1: 0.5, 2: 1.0, 3: 0.0}, {1: 0, 2: 0, 3: 1}
    assert curriculum.keeps(0, 1) and curriculum.keeps(1, 1)  # unmeasured; in (0, 1)
    assert [curriculum.keeps(2, epoch) for epoch in (0, 1, 2, 3)] == [False, False, False, True]
    assert not curriculum.keeps(3, 3) and curriculum.keeps(3, 4)
    with pytest.raises(ConfigError, match="min_pass_rate < max_pass_rate"):
        DifficultyCurriculum(min_pass_rate=0.6, max_pass_rate=0.4)


def measure(curriculum: DifficultyCurriculum, batch: list[int], epoch: int) -> None:
    """The step's outcome as the module hands it over: every prompt of the batch, a group of 2 each."""
    prompts = [PROMPTS[row] for row in batch for _ in range(2)]
    rewards = torch.tensor([1.0 if n < 2 * RATES.get(prompt, 0.5) else 0.0 for prompt in prompts[::2] for n in range(2)])
    rollout = SimpleNamespace(rewards=rewards, group_size=2, prompts=prompts)
    curriculum.on_train_batch_end(SimpleNamespace(world_size=1, current_epoch=epoch), None, {"rollout": rollout}, None, 0)


def test_on_several_devices_every_device_measures_with_all_their_outcomes():
    curriculum = DifficultyCurriculum()
    curriculum.rows_of = {f"p{i}": [i, i + 6] for i in range(6)}
    other_device = torch.tensor([[4.0, 0.5], [5.0, float("nan")]], dtype=torch.float64)  # rows 4 and 5; 5 failed
    gather = lambda pairs: torch.stack([pairs, other_device])  # noqa: E731 - all_gather over two devices
    trainer = SimpleNamespace(world_size=2, current_epoch=0, strategy=SimpleNamespace(all_gather=gather))
    rollout = SimpleNamespace(rewards=torch.tensor([1.0, 1.0, 0.0, 1.0]), group_size=2, prompts=["p0", "p0", "p3", "p3"])
    curriculum.on_train_batch_end(trainer, SimpleNamespace(device="cpu"), {"rollout": rollout}, None, 0)
    assert curriculum.rates == {0: 1.0, 6: 1.0, 3: 0.5, 9: 0.5, 4: 0.5, 10: 0.5}


def test_rows_are_those_of_the_dataset_sampled_after_long_prompts_dropped_one():
    """``data.long_prompts skip`` drops rows after the callback's setup: row numbers shift, and a prompt
    measured too easy must set aside its own row, not the next prompt's."""
    from datasets import Dataset

    curriculum = DifficultyCurriculum()
    datamodule = SimpleNamespace(curriculum=None, prompt_column="prompt",
                                 train_dataset=Dataset.from_dict({"prompt": ["LONG", "p1", "p2", "p3"]}))  # fmt: skip
    curriculum.setup(SimpleNamespace(datamodule=datamodule), None, "fit")
    datamodule.train_dataset = datamodule.train_dataset.select([1, 2, 3])  # as the fit's prompt check leaves it
    curriculum.new_sampler(datamodule.train_dataset, 1, seed=0)
    rollout = SimpleNamespace(rewards=torch.tensor([1.0, 1.0]), group_size=2, prompts=["p1", "p1"])  # too easy
    curriculum.on_train_batch_end(SimpleNamespace(world_size=1, current_epoch=0), None, {"rollout": rollout}, None, 0)
    assert curriculum.rates == {0: 1.0}  # p1's row of the sampled dataset
    assert not curriculum.keeps(0, 1) and curriculum.keeps(1, 1)  # p1 set aside, p2 still drawn


def fresh(state: dict | None = None, loader_state: dict | None = None) -> tuple[DifficultyCurriculum, ResumableDataLoader]:
    curriculum = DifficultyCurriculum(revisit_epochs=1)
    curriculum.rows_of = {f"p{i}": [i, i + 6] for i in range(6)}
    if state is not None:
        curriculum.load_state_dict(state)
    sampler = curriculum.new_sampler(list(range(12)), 2, seed=3)
    loader = ResumableDataLoader(list(range(12)), batch_size=2, sampler=sampler, drop_last=True, collate_fn=list)
    curriculum.loader = loader
    if loader_state is not None:
        loader.load_state_dict(loader_state)
    return curriculum, loader


def train(curriculum, loader, epochs: range, stop_after: int | None = None) -> tuple[list, tuple | None]:
    """``(epoch, batch)`` of each batch a fit trains on, measured once trained; with ``stop_after``,
    stopped after that many with a checkpoint (the curriculum's and the loader's states)."""
    batches = []
    for epoch in epochs:
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            batches.append((epoch, batch))
            measure(curriculum, batch, epoch)
            if len(batches) == stop_after:
                return batches, (curriculum.state_dict(), loader.state_dict())
    return batches, None


def test_prompts_out_of_the_band_sit_out_the_next_epoch_and_come_back_after():
    batches, _ = train(*fresh(), range(3))
    prompts = {epoch: [PROMPTS[row] for e, batch in batches if e == epoch for row in batch] for epoch in range(3)}
    out_of_band = {"p0", "p1", "p2"}
    assert out_of_band <= set(prompts[0])  # unmeasured at first: drawn and measured
    assert sorted(prompts[1]) == ["p3", "p3", "p4", "p4", "p5", "p5"]  # revisit_epochs 1: none of them
    assert out_of_band & set(prompts[2])  # then measured again
    assert len(prompts[0]) < 12  # a copy drawn after its prompt was measured out of the band is passed over


@pytest.mark.parametrize("stop_after", range(1, 12))
def test_a_fit_resumed_from_any_checkpoint_trains_on_the_batches_of_the_uninterrupted_one(stop_after):
    whole, _ = train(*fresh(), range(3))
    assert len(whole) > stop_after
    first, saved = train(*fresh(), range(3), stop_after=stop_after)
    state, loader_state = saved
    curriculum, loader = fresh(state, loader_state)
    rest, _ = train(curriculum, loader, range(loader_state["epoch"], 3))
    assert first + rest == whole


class Prompts(L.Callback):
    """The prompts of each training step, and the curriculum's rates at the end of each epoch."""

    def __init__(self, curriculum: DifficultyCurriculum) -> None:
        self.curriculum, self.steps, self.rates = curriculum, [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.steps.append((trainer.current_epoch, list(batch["prompt"])))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.rates.append(dict(self.curriculum.rates))


class SaveAt(L.Callback):
    """A checkpoint after optimizer step ``step``, as ModelCheckpoint writes one in the fit."""

    def __init__(self, step: int, path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def fit(model_dir: str, root, max_steps: int, ckpt_path=None, *extra: L.Callback) -> tuple[Prompts, L.Trainer, GRPO]:
    L.seed_everything(0)
    curriculum = DifficultyCurriculum(revisit_epochs=1)
    prompts = Prompts(curriculum)
    module = GRPO(model=model_dir, sampling={"group_size": 2, "max_new_tokens": 4},
                  rewards={"funcs": ["tests.helpers.length_parity_reward"]})  # fmt: skip
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False, limit_val_batches=0,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=root,
                        callbacks=[curriculum, prompts, *extra])  # fmt: skip
    trainer.fit(module, ArithmeticDataModule(num_train=8, num_val=2, batch_size=2), ckpt_path=ckpt_path)
    return prompts, trainer, module


def test_a_fit_resumed_from_a_checkpoint_trains_on_the_prompts_of_the_uninterrupted_fit(tiny_model_dir, tmp_path,
                                                                                       one_torch_thread):  # fmt: skip
    recorded, _, module = fit(tiny_model_dir, tmp_path, 7, None, SaveAt(3, tmp_path / "step3.ckpt"))
    whole, prompts = recorded.steps, ArithmeticDataModule(num_train=8, num_val=2).load()["train"]["prompt"]
    out_of_band = {prompts[row] for row, rate in recorded.rates[0].items() if rate in (0.0, 1.0)}
    drawn = {epoch: {p for e, step in whole if e == epoch for p in step} for epoch in range(3)}
    assert len(drawn[0]) == 8 and out_of_band  # epoch 0: every prompt, measured
    assert not out_of_band & drawn[1] and out_of_band & drawn[2]  # set aside for one epoch, then back
    assert module.last_step_metrics["curriculum/measured"] == 1.0  # epoch 0 measured every prompt
    assert module.last_step_metrics["curriculum/too_easy"] + module.last_step_metrics["curriculum/too_hard"] > 0
    state = torch.load(tmp_path / "step3.ckpt", weights_only=False)["callbacks"]["DifficultyCurriculum"]
    assert len(state["rates"]) == 6 and state["sampler"]["served"] == 3  # three steps of two prompts
    rest, _, _ = fit(tiny_model_dir, tmp_path, 7, ckpt_path=tmp_path / "step3.ckpt")
    assert whole[:3] + rest.steps == whole
