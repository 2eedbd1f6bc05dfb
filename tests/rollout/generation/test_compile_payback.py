"""``auto`` compiles only what pays back within the run: the estimated saving over the run's steps
against the estimated cost of compiling, cold or warm; explicit settings are kept. The expected
decisions are computed by hand from the constants of ``compile_payback``."""

from __future__ import annotations

import time

import lightning as L
import pytest
from lightning.pytorch.trainer.states import TrainerFn

from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.generation import EngineTarget, FitLength, compile_payback, resolve_engine
from grpo_lightning.rollout.generation.compile_payback import run_length
from grpo_lightning.training.time_budget import TimeBudget

W1_SHAPE = EngineTarget("cuda", "qwen2", "sdpa", num_layers=24)  # benchmarks' W1: Qwen2.5-0.5B's 24 layers
SMOLLM2 = EngineTarget("cuda", "llama", "sdpa", num_layers=30)  # SmolLM2-135M: 30 layers


def compiled(plan) -> tuple[bool, bool, bool]:
    return plan.compile, plan.model_compile, plan.logprob_compile


def test_a_short_fit_compiles_nothing_and_says_why():
    # 5 steps of 256 tokens: the decode step saves 4.5e-5 x 24 x 256 x 5 = 1.4 s for 16 s; the
    # log-prob passes 9e-3 x 24 x 5 = 1.1 s for 11.5 s.
    plan = resolve_engine(EngineOptions(), W1_SHAPE, fit=FitLength(max_steps=5, max_time_s=None, max_new_tokens=256))
    assert plan.rollout == "static" and compiled(plan) == (False, False, False)
    # The Triton kernels save (1e-5 x 24 + 8.4e-5) x 256 x 5 = 0.4 s for 25 s: their torch fallbacks decode.
    assert not plan.triton_kernels and plan.decode_attention == "sdpa"
    (note,) = plan.notes
    assert note == (
        "engine compilation auto: over ~5 steps of 256 tokens, 24 layers: decode step off (cold cache: saves ~1 s, "
        "costs ~16 s); log-prob passes off (cold cache: saves ~1 s, costs ~12 s); Triton kernels off, their torch "
        "fallbacks instead (cold cache: saves ~0 s, costs ~25 s)."
    )


def test_a_long_fit_compiles_everything():
    # 500 steps: the decode step saves 0.276 x 500 = 138 s > 16 s, the log-prob passes 0.216 x 500 = 108 s > 11.5 s,
    # the Triton kernels 0.083 x 500 = 41 s > 25 s.
    plan = resolve_engine(EngineOptions(), W1_SHAPE, fit=FitLength(max_steps=500, max_time_s=None, max_new_tokens=256))
    assert compiled(plan) == (True, True, True)
    assert plan.triton_kernels and plan.decode_attention == "auto"


def test_a_warm_cache_makes_compiling_pay_back_sooner():
    # 30 steps: the decode step saves 8.3 s against 16 s cold, 0.28 x 16 = 4.5 s warm; the log-prob
    # passes 6.5 s against 11.5 s cold, 3.2 s warm.
    cold = FitLength(max_steps=30, max_time_s=None, max_new_tokens=256)
    warm = FitLength(max_steps=30, max_time_s=None, max_new_tokens=256, warm=frozenset({"decode", "logprobs"}))
    assert compiled(resolve_engine(EngineOptions(), W1_SHAPE, fit=cold)) == (False, False, False)
    assert compiled(resolve_engine(EngineOptions(), W1_SHAPE, fit=warm)) == (True, True, True)


def test_a_three_minute_budget_on_the_small_recipe_compiles_only_the_log_prob_passes():
    # Eager steps of 30 x (1.25e-3 x 16 + 0.02) = 1.2 s: 180 s hold 150 steps (fewer than max_steps 500).
    # Decode step: 4.5e-5 x 30 x 16 x 150 = 3.2 s saved for 16 s; log-prob passes 0.27 x 150 = 40 s for 11.5 s.
    fit = FitLength(max_steps=500, max_time_s=180.0, max_new_tokens=16)
    plan = resolve_engine(EngineOptions(), SMOLLM2, fit=fit)
    assert compiled(plan) == (False, True, True)
    assert "over ~150 steps of 16 tokens" in plan.notes[0]
    # Half a minute holds 25 steps: the log-prob passes save 6.8 s for 11.5 s, so nothing is compiled.
    plan = resolve_engine(EngineOptions(), SMOLLM2, fit=FitLength(max_steps=500, max_time_s=30.0, max_new_tokens=16))
    assert compiled(plan) == (False, False, False)


def test_explicit_settings_are_kept_whatever_the_estimate():
    short = FitLength(max_steps=5, max_time_s=None, max_new_tokens=256)
    plan = resolve_engine(EngineOptions(compile=True, model_compile=False), W1_SHAPE, fit=short)
    assert compiled(plan) == (True, False, False)
    assert "decode step" not in plan.notes[0]  # not automatic: not estimated
    plan = resolve_engine(EngineOptions(compile=True, model_compile=True, logprob_compile=True), W1_SHAPE, fit=short)
    assert compiled(plan) == (True, True, True)
    (note,) = plan.notes  # only the Triton kernels, left automatic, are weighed
    assert "decode step" not in note and "log-prob" not in note and "Triton kernels off" in note


def test_an_unbounded_fit_and_a_cpu_keep_the_device_s_defaults():
    unbounded = FitLength(max_steps=None, max_time_s=None, max_new_tokens=256)
    assert compiled(resolve_engine(EngineOptions(), W1_SHAPE, fit=unbounded)) == (True, True, True)
    cpu = EngineTarget("cpu", "qwen2", "sdpa", num_layers=24)
    plan = resolve_engine(EngineOptions(), cpu, fit=FitLength(max_steps=500, max_time_s=None, max_new_tokens=256))
    assert compiled(plan) == (False, False, False) and not any("compilation" in n for n in plan.notes)


@pytest.mark.parametrize("budget", ["lightning", "ours"])
def test_the_run_length_is_the_steps_and_the_time_left(budget):
    if budget == "ours":
        trainer = L.Trainer(max_steps=50, callbacks=[TimeBudget(100, start=time.time() - 20)], logger=False)
    else:
        trainer = L.Trainer(max_steps=50, max_time={"seconds": 100}, logger=False)
    trainer.state.fn = TrainerFn.FITTING
    run = run_length(trainer, max_new_tokens=16, val_max_new_tokens=8)
    assert (run.max_steps, run.max_new_tokens) == (50, 16)
    assert run.max_time_s == pytest.approx(80 if budget == "ours" else 100, abs=2)
    trainer.state.fn = None
    assert run_length(trainer, 16, 8) is None
