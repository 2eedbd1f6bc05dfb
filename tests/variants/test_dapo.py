"""Specification of DAPO (Yu et al. 2025): its paper defaults, hand-computed hook values, the
overlong reward shaping, and dynamic sampling on real rollouts and fits of a tiny random model
(``tests/conftest.py``)."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.testing import assert_close

from grpo_lightning.rollout.types import Rollout
from grpo_lightning.variants import DAPO
from tests.helpers import (
    LOSS,
    MASK,
    REWARDS,
    Z,
    arithmetic,
    assert_clip_higher_boundary,
    assert_constructs_without_loading,
    cpu_trainer,
    hand_rollout,
    t,
)


# ------------------------------------------------------------------ construction and defaults


def test_construction_loads_nothing_and_is_instant(monkeypatch):
    assert_constructs_without_loading(DAPO, monkeypatch)


def test_defaults_follow_the_papers():
    module = DAPO(model="unused")  # DAPO: no KL, clip-higher 0.2 / 0.28
    assert module.coefficients.beta == 0.0
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.2, 0.28)
    assert module.settings.kl_estimator == "k3"
    assert module.settings.kl_placement == "loss"


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    advantages = DAPO(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[Z, -Z, 0.0, 0.0], [0.0] * 4]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = DAPO(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(2.75))  # token mean over the batch: 11 / 4 tokens


def test_token_loss_clip_higher_boundary():
    # eps_high 0.28: 1.25 < 1.28, -1.25, d/dlogp = -ratio * A = -1.25
    assert_clip_higher_boundary(DAPO(model="unused"), high_loss=-1.25, high_grad=-1.25, high_clipped=0.0)


# ------------------------------------------------------------------ reward shaping


def test_dapo_overlong_shaping_is_linear_inside_the_buffer():
    # max_new_tokens 10, buffer 4: no penalty up to 10 - 4 = 6 tokens, then -(len - 6) / 4.
    module = DAPO(model="unused", overlong_buffer=4, sampling={"max_new_tokens": 10})
    rollout = hand_rollout([3, 6, 7, 9, 10], width=10, group_size=5)
    shaped = module.shape_rewards(t([1.0, 1.0, 1.0, 1.0, 1.0]), rollout)
    # penalties [0, 0, -1/4, -3/4, -1]
    assert_close(shaped, t([1.0, 1.0, 0.75, 0.25, 0.0]))


def test_dapo_overlong_buffer_defaults_to_a_fifth_of_max_new_tokens_and_zero_turns_it_off():
    # max_new_tokens 20 -> buffer 4, start 16; factor 0.5: lengths 16, 18, 20 -> 0, -0.25, -0.5.
    module = DAPO(model="unused", overlong_penalty=0.5, sampling={"max_new_tokens": 20})
    assert module.overlong_buffer == 4
    rollout = hand_rollout([16, 18, 20], width=20, group_size=3)
    assert_close(module.shape_rewards(t([0.0, 0.0, 0.0]), rollout), t([0.0, -0.25, -0.5]))
    off = DAPO(model="unused", overlong_buffer=0, sampling={"max_new_tokens": 20})
    assert_close(off.shape_rewards(t([0.0, 0.0, 0.0]), rollout), t([0.0, 0.0, 0.0]))


# ------------------------------------------------------------------ dynamic sampling


def flagged_reward(prompts, completions, informative, **columns) -> list[float]:
    """0, 1, 0, 1, ... within the groups of prompts flagged informative (G is even); 0 elsewhere."""
    return [float(flag and i % 2) for i, flag in enumerate(informative)]


def _dapo(make_module, **kwargs) -> DAPO:
    return make_module(
        DAPO, **kwargs, rewards={"funcs": [flagged_reward]}, sampling={"group_size": 2, "max_new_tokens": 4}
    )


def _draw(module, make_rollout, flags: list[bool], tag: int) -> Rollout:
    """A scored rollout of one prompt per flag; prompt lengths differ between draws."""
    prompts = [f"{str(tag) * tag}+{i}=" for i in range(len(flags))]
    return make_rollout(module, prompts, seed=tag, informative=flags)


def _group_spread(rollout: Rollout) -> torch.Tensor:
    grouped = rollout.rewards.view(-1, rollout.group_size)
    return grouped.max(dim=1).values - grouped.min(dim=1).values


def test_dynamic_sampling_waits_until_the_batch_is_full(make_module, make_rollout):
    module = _dapo(make_module, max_gen_batches=5)
    assert module.select(_draw(module, make_rollout, [True, False, True, False], tag=1)) is None  # 2 of 4
    assert module.select(_draw(module, make_rollout, [False, False, False, True], tag=2)) is None  # 3 of 4
    batch = module.select(_draw(module, make_rollout, [False, True, False, False], tag=3))  # 4 of 4
    assert batch is not None and batch.num_groups == 4
    assert batch.prompts[:: batch.group_size] == ["1+0=", "1+2=", "22+3=", "333+1="]
    assert (_group_spread(batch) > 0).all()
    metrics = module.step_metrics.compute_and_reset()
    assert metrics["dynamic_sampling/gen_batches"] == 3
    assert metrics["dynamic_sampling/frac_groups_kept"] == pytest.approx(4 / 12)


def test_dynamic_sampling_trims_to_the_target_and_starts_afresh(make_module, make_rollout):
    module = _dapo(make_module)
    assert module.select(_draw(module, make_rollout, [True, True, False, True], tag=1)) is None  # 3 of 4
    batch = module.select(_draw(module, make_rollout, [True, True, True, False], tag=2))  # 6: keep the first 4
    assert batch.num_groups == 4 and len(batch) == 8
    assert batch.prompts[:: batch.group_size] == ["1+0=", "1+1=", "1+3=", "22+0="]
    assert (_group_spread(batch) > 0).all()
    metrics = module.step_metrics.compute_and_reset()
    assert metrics["dynamic_sampling/gen_batches"] == 2
    assert metrics["dynamic_sampling/frac_groups_kept"] == pytest.approx(6 / 8)
    # The buffer was emptied: one informative group is not a batch.
    assert module.select(_draw(module, make_rollout, [True, False, False, False], tag=3)) is None


def test_dynamic_sampling_exhausted_raises_with_on_exhausted_error(make_module, make_rollout):
    module = _dapo(make_module, max_gen_batches=2, on_exhausted="error")
    assert module.select(_draw(module, make_rollout, [True, False, False, False], tag=1)) is None
    with pytest.raises(RuntimeError, match="max_gen_batches"):
        module.select(_draw(module, make_rollout, [False, False, True, False], tag=2))


def test_dynamic_sampling_exhausted_trains_on_what_it_found_with_partial(make_module, make_rollout):
    module = _dapo(make_module, max_gen_batches=2, on_exhausted="partial")
    assert module.select(_draw(module, make_rollout, [True, False, False, False], tag=1)) is None
    batch = module.select(_draw(module, make_rollout, [False, False, True, False], tag=2))
    assert batch.num_groups == 2 and (_group_spread(batch) > 0).all()
    assert module.step_metrics.compute_and_reset()["dynamic_sampling/frac_groups_kept"] == pytest.approx(2 / 8)
    # No informative group at all: no update, but the step counts (skip_update).
    skipped = []
    module.skip_update = lambda num_groups: skipped.append(module.step_metrics.compute_and_reset())
    assert module.select(_draw(module, make_rollout, [False] * 4, tag=3)) is None
    assert skipped == []
    assert module.select(_draw(module, make_rollout, [False] * 4, tag=4)) is None
    assert len(skipped) == 1 and skipped[0]["dynamic_sampling/skipped_updates"] == 1.0
    assert skipped[0]["dynamic_sampling/gen_batches"] == 2 and skipped[0]["dynamic_sampling/frac_groups_kept"] == 0.0


def test_dynamic_sampling_over_devices_waits_for_and_trims_to_the_device_with_fewest(make_module, make_rollout, monkeypatch):
    """Another device's count comes through ``min_over_ranks``, replaced here by a stand-in for the
    collective (which needs several processes; the two-process runs are in test_strategies.py)."""
    module = _dapo(make_module, max_gen_batches=3, on_exhausted="partial")
    other_device = iter([1, 3, 2])  # informative groups the other device holds after each draw
    monkeypatch.setattr(module, "min_over_ranks", lambda kept: min(kept, next(other_device)))
    # This device has its 4 after the first draw, but the other has 1: every device samples again.
    assert module.select(_draw(module, make_rollout, [True] * 4, tag=1)) is None
    assert module.select(_draw(module, make_rollout, [False] * 4, tag=2)) is None
    # Exhausted: both train on the 2 groups the other device found, so both run the same passes.
    batch = module.select(_draw(module, make_rollout, [False] * 4, tag=3))
    assert batch.num_groups == 2 and batch.prompts[:: batch.group_size] == ["1+0=", "1+1="]
    assert module.step_metrics.compute_and_reset()["dynamic_sampling/frac_groups_kept"] == pytest.approx(4 / 12)


def odd_answer_reward(prompts, completions, answer, **columns) -> list[float]:
    """0, 1, 0, 1, ... within groups of odd answers (G is even); all 0 for even answers."""
    return [float(int(a) % 2 == 1 and i % 2 == 1) for i, a in enumerate(answer)]


def test_dapo_fit_updates_only_on_informative_groups(make_module):
    updates: list[torch.Tensor] = []

    class RecordingDAPO(DAPO):
        def update(self, rollout, advantages, num_groups=None):
            updates.append(rollout.rewards.view(-1, rollout.group_size).clone())
            super().update(rollout, advantages, num_groups)

    L.seed_everything(0)
    module = make_module(
        RecordingDAPO,
        configure=False,
        on_exhausted="error",
        rewards={"funcs": [odd_answer_reward]},
        sampling={"group_size": 2, "max_new_tokens": 4},
    )
    trainer = cpu_trainer(max_steps=2)
    trainer.fit(module, datamodule=arithmetic(batch_size=4))
    assert trainer.global_step == 2
    assert len(updates) == 2
    for rewards in updates:
        assert rewards.shape == (4, 2)
        assert (rewards.max(dim=1).values > rewards.min(dim=1).values).all()


def constant_reward(prompts, completions, **columns) -> list[float]:
    """Every completion the same reward: no group is ever informative."""
    return [1.0] * len(completions)


def _logged_rows(trainer: L.Trainer) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _logged_trainer(tmp_path, max_steps: int) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=L.pytorch.loggers.TensorBoardLogger(tmp_path, name="run"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=max_steps,
        max_epochs=100,  # a bound for a fit that would not end: it must end on max_steps long before
        num_sanity_val_steps=0,
        limit_val_batches=0,
        log_every_n_steps=1,
    )


def test_dapo_fit_with_no_informative_group_ends_at_max_steps_without_changing_the_weights(make_module, tmp_path):
    """Dynamic sampling never finds a group whose rewards differ: each step draws ``max_gen_batches``
    batches, then counts without an update (``dynamic_sampling/skipped_updates``), one row a step."""
    L.seed_everything(0)
    module = make_module(
        DAPO,
        configure=False,
        max_gen_batches=2,
        rewards={"funcs": [constant_reward]},
        sampling={"group_size": 2, "max_new_tokens": 4},
    )
    trainer = _logged_trainer(tmp_path, max_steps=3)
    data = arithmetic(batch_size=4)
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    assert time.perf_counter() - start < 60
    assert trainer.global_step == 3
    assert trainer.fit_loop.total_batch_idx + 1 == 6  # 2 generation batches a step
    initial = make_module(DAPO, rewards={"funcs": [constant_reward]})
    for name, value in module.policy.state_dict().items():
        assert torch.equal(value, initial.policy.state_dict()[name]), name
    rows = _logged_rows(trainer)
    assert rows["dynamic_sampling/skipped_updates"] == [(1, 1.0), (2, 1.0), (3, 1.0)]  # at the optimizer steps taken
    assert rows["dynamic_sampling/gen_batches"] == [(1, 2.0), (2, 2.0), (3, 2.0)]
    assert rows["counters/generation_batches"] == [(1, 2.0), (2, 4.0), (3, 6.0)]
    assert rows["counters/rollouts"] == [(1, 0.0), (2, 0.0), (3, 0.0)]  # none was trained on
    assert "loss" not in rows  # no update, no loss


def test_dapo_logs_one_row_per_update_with_the_sampling_batches_folded_in(make_module, tmp_path):
    """Batches that only sample log no row (no repeat of the last update's values); the x-axis
    counts optimizer steps (one an update here) and each row's ``gen_batches`` counts the batches its
    update drew on."""
    L.seed_everything(0)
    module = make_module(
        DAPO,
        configure=False,
        max_gen_batches=3,
        rewards={"funcs": [odd_answer_reward]},
        sampling={"group_size": 2, "max_new_tokens": 4},
    )
    trainer = _logged_trainer(tmp_path, max_steps=3)
    trainer.fit(module, datamodule=arithmetic(batch_size=4))
    assert trainer.global_step == 3
    rows = _logged_rows(trainer)
    batches = trainer.fit_loop.total_batch_idx + 1
    gen_batches = rows["dynamic_sampling/gen_batches"]
    assert batches > 3, "every batch was full: change the reward or the seed"
    for tag in ("reward", "loss", "dynamic_sampling/gen_batches", "entropy"):
        assert [step for step, _ in rows[tag]] == [1, 2, 3], tag
    assert sum(value for _, value in gen_batches) == batches == rows["counters/generation_batches"][-1][1]
    assert all(value == 0.0 for _, value in rows["dynamic_sampling/skipped_updates"])
