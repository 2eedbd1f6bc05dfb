"""Specification of the five variants: GRPO, Dr. GRPO, DAPO, RLOO and GSPO.

Hook values are worked out by hand in the comments next to them; the gradient tests run the real
modules on a tiny random model (``tests/conftest.py``).
"""

from __future__ import annotations

import math
import time

import lightning as L
import pytest
import torch
import transformers
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.testing import assert_close

from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.types import Rollout
from variants import DAPO, GRPO, GSPO, RLOO, DrGRPO

VARIANTS = [GRPO, DrGRPO, DAPO, RLOO, GSPO]
f64 = torch.float64


def t(values, dtype=f64):
    return torch.tensor(values, dtype=dtype)


def hand_rollout(lengths: list[int], width: int, group_size: int) -> Rollout:
    """A rollout with no real tokens: only the completion lengths (the mask) are meaningful."""
    n = len(lengths)
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    return Rollout(
        group_size=group_size,
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.zeros(n, width, dtype=torch.long),
        completion_mask=mask,
        truncated=torch.tensor([length >= width for length in lengths]),
        prompts=["p"] * n,
        completions=[""] * n,
    )


# ------------------------------------------------------------------ construction and defaults


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda c: c.__name__)
def test_construction_loads_nothing_and_is_instant(cls, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the constructor must not load a model or tokenizer")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    start = time.perf_counter()
    module = cls(model="no-such/model", sampling={"group_size": 4, "max_new_tokens": 16})
    assert time.perf_counter() - start < 1.0
    assert module.policy is None and module.ref_model is None and module.tokenizer is None


@pytest.mark.parametrize(
    "cls, beta, eps_low, eps_high, placement",
    [
        (GRPO, 0.04, 0.2, 0.2, "loss"),  # DeepSeekMath: beta 0.04, eps 0.2, k3
        (DrGRPO, 0.0, 0.2, 0.2, "loss"),  # Dr. GRPO: no KL term
        (DAPO, 0.0, 0.2, 0.28, "loss"),  # DAPO: no KL, clip-higher 0.2 / 0.28
        (RLOO, 0.05, 0.2, 0.2, "reward"),  # RLOO: KL penalty in the reward
        (GSPO, 0.0, 3e-4, 4e-4, "loss"),  # GSPO: sequence-ratio clip range
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_defaults_follow_the_papers(cls, beta, eps_low, eps_high, placement):
    module = cls(model="unused")
    assert module.beta == beta
    assert (module.clip_eps_low, module.clip_eps_high) == (eps_low, eps_high)
    assert module.kl_estimator == ("k3" if placement == "loss" else "k1")  # RLOO: k1 in the reward, as the paper
    assert module.kl_placement == placement


# ------------------------------------------------------------------ hand-computed hook values

# Group 0 has spread, group 1 is all equal (no signal: advantages exactly 0 in every variant).
REWARDS = [[3.0, 1.0, 2.0, 2.0], [0.5, 0.5, 0.5, 0.5]]
# Group 0: mean 2, deviations [1, -1, 0, 0], unbiased var (1 + 1) / 3 = 2/3, std 0.816496580927726;
# 1 / (0.816496580927726 + 1e-4) = 1.2245948897605123.
Z = 1.2245948897605123
# Leave-one-out: 3 - (1+2+2)/3 = 4/3; 1 - (3+2+2)/3 = -4/3; 2 - (3+1+2)/3 = 0.
ADVANTAGES = {
    GRPO: [[Z, -Z, 0.0, 0.0], [0.0] * 4],
    DAPO: [[Z, -Z, 0.0, 0.0], [0.0] * 4],
    GSPO: [[Z, -Z, 0.0, 0.0], [0.0] * 4],
    DrGRPO: [[1.0, -1.0, 0.0, 0.0], [0.0] * 4],  # centred only
    RLOO: [[4 / 3, -4 / 3, 0.0, 0.0], [0.0] * 4],
}


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda c: c.__name__)
def test_advantages_by_hand(cls):
    advantages = cls(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t(ADVANTAGES[cls]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=f64))


# Ragged mask: row 0 has 3 tokens (sum 1+2+3 = 6), row 1 has 1 token (5); max_new_tokens 4.
LOSS = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
AGGREGATES = {
    GRPO: 3.5,  # sequence mean of token means: (6/3 + 5/1) / 2
    GSPO: 3.5,  # same reduction as GRPO
    DrGRPO: 1.375,  # token sum over N * max_new_tokens: 11 / (2 * 4)
    DAPO: 2.75,  # token mean over the batch: 11 / 4 tokens
    RLOO: 5.5,  # sequence mean of token sums: (6 + 5) / 2
}


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda c: c.__name__)
def test_aggregate_on_a_ragged_mask_by_hand(cls):
    module = cls(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(AGGREGATES[cls]))


# Row 0: ratio 1.25 with advantage +1; row 1: ratio 0.75 with advantage -1.
#   eps_high 0.2:  -min(1.25 * 1, 1.2 * 1) = -1.2, clipped: no gradient.
#   eps_high 0.28: 1.25 < 1.28, -1.25, d/dlogp = -ratio * A = -1.25.
#   low side (eps_low 0.2 everywhere): -min(0.75 * -1, 0.8 * -1) = 0.8, clipped: no gradient.
@pytest.mark.parametrize(
    "cls, high_loss, high_grad, high_clipped",
    [(GRPO, -1.2, 0.0, 0.5), (DrGRPO, -1.2, 0.0, 0.5), (RLOO, -1.2, 0.0, 0.5), (DAPO, -1.25, -1.25, 0.0)],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_token_loss_clip_higher_boundary(cls, high_loss, high_grad, high_clipped):
    module = cls(model="unused")
    logp = t([[math.log(1.25)], [math.log(0.75)]]).requires_grad_()
    mask = t([[1.0], [1.0]])
    loss = module.token_loss(logp, torch.zeros_like(logp), t([1.0, -1.0]), mask)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert_close(loss.detach(), t([[high_loss], [0.8]]))
    assert_close(grad, t([[high_grad], [0.0]]))
    metrics = module.step_metrics.compute_and_reset()
    assert metrics["clip_ratio/high"] == pytest.approx(high_clipped)  # share of the 2 tokens
    assert metrics["clip_ratio/low"] == pytest.approx(0.5)


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


def test_rloo_puts_the_summed_k1_kl_in_the_reward():
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # row 0: (0.5) + (-1) + 0 = -0.5; row 1: 0.5 + 0.5 (third token masked) = 1.0
    # beta 0.05: [1 + 0.025, 2 - 0.05]
    shaped = RLOO(model="unused").shape_rewards(t([1.0, 2.0]), rollout)
    assert_close(shaped, t([1.025, 1.95]))
    in_loss = RLOO(model="unused", kl={"placement": "loss"})
    assert_close(in_loss.shape_rewards(t([1.0, 2.0]), rollout), t([1.0, 2.0]))
    assert in_loss.kl_estimator == "k3"  # in the loss, the base's default


def test_rloo_puts_the_chosen_kl_estimator_in_the_reward():
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # k3 = exp(d) - d - 1 with d = ref - old: row 0 d = -0.5, 1, 0; row 1 d = -0.5, -0.5 (third token masked)
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    row0, row1 = k3(-0.5) + k3(1.0) + k3(0.0), 2 * k3(-0.5)  # 0.824813, 0.213061
    shaped = RLOO(model="unused", kl={"estimator": "k3"}).shape_rewards(t([1.0, 2.0]), rollout)
    assert_close(shaped, t([1.0 - 0.05 * row0, 2.0 - 0.05 * row1]))
    # k2 = d^2 / 2: row 0 (0.25 + 1) / 2, row 1 (0.25 + 0.25) / 2
    shaped = RLOO(model="unused", kl={"estimator": "k2"}).shape_rewards(t([1.0, 2.0]), rollout)
    assert_close(shaped, t([1.0 - 0.05 * 0.625, 2.0 - 0.05 * 0.25]))


# ------------------------------------------------------------------ micro-batch invariance

# Each variant's, in micro-batches of one row: tests/conformance/. Here, a fit's optimizer step.


class GradientCapture(L.Callback):
    """Copies the policy's gradients right before each optimizer step."""

    def __init__(self) -> None:
        self.gradients: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.gradients.append({n: p.grad.detach().clone() for n, p in pl_module.policy.named_parameters()})


def _trainer(max_steps: int, callbacks=()) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=max_steps,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=list(callbacks),
    )


def _arithmetic(batch_size: int) -> ArithmeticDataModule:
    return ArithmeticDataModule(num_train=64, num_val=0, val_split=None, batch_size=batch_size)


def test_trainer_step_gradient_does_not_depend_on_micro_batching_the_fused_head_or_packing(make_module):
    # 2 prompts x 4 completions = 8 rows: micro-batches of 3 + 3 + 2 (or packed to 40 tokens, about two
    # rows) against one of 8, with the LM head fused into the log-softmax and without, packed without padding and padded.
    gradients = []
    tokens = {"micro_batch_size": None, "micro_batch_tokens": 40}
    settings = (({"micro_batch_size": 3}, True, False), ({"micro_batch_size": 8}, True, False),
                ({"micro_batch_size": 3}, False, True), (tokens, True, False), ({"micro_batch_size": 8}, True, True),
                ({"micro_batch_size": 8}, False, False))  # fmt: skip
    for optim, fused_lm_head, padding_free in settings:
        L.seed_everything(0)
        capture = GradientCapture()
        engine = EngineOptions(fused_lm_head=fused_lm_head, padding_free=padding_free)
        module = make_module(GRPO, configure=False, engine=engine, optim=optim)
        _trainer(max_steps=1, callbacks=[capture]).fit(module, datamodule=_arithmetic(batch_size=2))
        assert len(capture.gradients) == 1  # the hook runs under manual optimization
        gradients.append(capture.gradients[0])
    whole = gradients[-1]
    assert sum(g.abs().sum() for g in whole.values()) > 0
    for other in gradients[:-1]:
        for name in whole:
            assert_close(other[name], whole[name], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")


# ------------------------------------------------------------------ DAPO dynamic sampling


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
    trainer = _trainer(max_steps=2)
    trainer.fit(module, datamodule=_arithmetic(batch_size=4))
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
    data = _arithmetic(batch_size=4)
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
    trainer.fit(module, datamodule=_arithmetic(batch_size=4))
    assert trainer.global_step == 3
    rows = _logged_rows(trainer)
    batches = trainer.fit_loop.total_batch_idx + 1
    gen_batches = rows["dynamic_sampling/gen_batches"]
    assert batches > 3, "every batch was full: change the reward or the seed"
    for tag in ("reward", "loss", "dynamic_sampling/gen_batches", "entropy"):
        assert [step for step, _ in rows[tag]] == [1, 2, 3], tag
    assert sum(value for _, value in gen_batches) == batches == rows["counters/generation_batches"][-1][1]
    assert all(value == 0.0 for _, value in rows["dynamic_sampling/skipped_updates"])
