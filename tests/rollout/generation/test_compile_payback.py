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
from grpo_lightning.runtime.time_budget import TimeBudget

W1_SHAPE = EngineTarget("cuda", "qwen2", "sdpa", num_layers=24)  # benchmarks' W1: Qwen2.5-0.5B's 24 layers
SMOLLM2 = EngineTarget("cuda", "llama", "sdpa", num_layers=30)  # SmolLM2-135M: 30 layers


def compiled(plan) -> tuple[bool, bool, bool]:
    return plan.compile, plan.model_compile, plan.logprob_compile


def test_a_short_fit_compiles_nothing_and_says_why():
    # W1's eager step: 24 x (5.3e-3 + 2.93e-4 x 256) = 1.927 s, so 5 steps take 9.6 s. Compiled, the decode
    # step saves 24 x (1.36e-3 + 4.03e-5 x 256) = 0.280 s a step and the log-prob passes 24 x (9.8e-4 +
    # 4.5e-5 x 256) = 0.300 s, for 12 + 3 + 6 = 21 s on a cold cache: 21 + 5 x 1.347 = 27.7 s.
    plan = resolve_engine(EngineOptions(), W1_SHAPE, fit=FitLength(max_steps=5, max_time_s=None, max_new_tokens=256))
    assert plan.rollout == "static" and compiled(plan) == (False, False, False)
    # The Triton kernels save (1e-5 x 24 + 8.4e-5) x 256 x 5 = 0.4 s for 25 s: their torch fallbacks decode.
    assert not plan.triton_kernels and plan.decode_attention == "sdpa"
    (note,) = plan.notes
    assert note == (
        "engine compilation auto: over ~5 steps of 256 tokens, 24 layers, ~1.93 s each uncompiled: decode step off; "
        "log-prob passes off (compiled on a cold cache: ~28 s for the steps, not: ~10 s); Triton kernels off, their "
        "torch fallbacks instead (cold cache: saves ~0 s, costs ~25 s)."
    )


def test_a_long_fit_compiles_everything():
    # 500 steps: 21 + 500 x 1.347 = 695 s compiled against 500 x 1.927 = 964 s; the Triton kernels save
    # 0.083 x 500 = 41 s > 25 s.
    plan = resolve_engine(EngineOptions(), W1_SHAPE, fit=FitLength(max_steps=500, max_time_s=None, max_new_tokens=256))
    assert compiled(plan) == (True, True, True)
    assert plan.triton_kernels and plan.decode_attention == "auto"


def test_a_warm_cache_makes_compiling_pay_back_sooner():
    # 30 steps: 57.8 s uncompiled; cold, 21 + 30 x 1.347 = 61.4 s with both parts (the decode step alone
    # 15 + 30 x 1.647 = 64.4 s, the log-prob passes alone 18 + 30 x 1.627 = 66.8 s); warm, 1.5 + 0.5 + 0.5
    # + 40.4 = 42.9 s.
    cold = FitLength(max_steps=30, max_time_s=None, max_new_tokens=256)
    warm = FitLength(max_steps=30, max_time_s=None, max_new_tokens=256, warm=frozenset({"decode", "logprobs"}))
    assert compiled(resolve_engine(EngineOptions(), W1_SHAPE, fit=cold)) == (False, False, False)
    assert compiled(resolve_engine(EngineOptions(), W1_SHAPE, fit=warm)) == (True, True, True)


def test_a_minute_on_the_small_recipe_compiles_only_on_a_warm_cache():
    # SmolLM2's eager step: 30 x (5.3e-3 + 2.93e-4 x 16) = 0.300 s, so 43 s hold 144 steps. Both parts save
    # 30 x (1.36e-3 + 4.03e-5 x 16) + 30 x (9.8e-4 + 4.5e-5 x 16) = 0.111 s, for steps of 0.189 s: (43 - 21) /
    # 0.189 = 117 steps on a cold cache, (43 - 2.5) / 0.189 = 215 on a warm one (measured: 103 and 154).
    cold = FitLength(max_steps=1_000_000, max_time_s=43.0, max_new_tokens=16)
    plan = resolve_engine(EngineOptions(), SMOLLM2, fit=cold)
    assert compiled(plan) == (False, False, False)
    assert "over ~144 steps of 16 tokens" in plan.notes[0] and "~117 steps in the time left, not: ~144" in plan.notes[0]
    warm = FitLength(max_steps=1_000_000, max_time_s=43.0, max_new_tokens=16, warm=frozenset({"decode", "logprobs"}))
    assert compiled(resolve_engine(EngineOptions(), SMOLLM2, fit=warm)) == (True, True, True)


def test_three_minutes_on_the_small_recipe_compile_everything():
    # 180 s would hold 601 eager steps, so max_steps 500 bounds the fit: 150 s uncompiled, 21 + 500 x 0.189
    # = 115 s compiled on a cold cache.
    plan = resolve_engine(EngineOptions(), SMOLLM2, fit=FitLength(max_steps=500, max_time_s=180.0, max_new_tokens=16))
    assert compiled(plan) == (True, True, True)
    assert "~115 s for the steps, not: ~150 s" in plan.notes[0]
    # Half a minute holds 100 eager steps against (30 - 21) / 0.189 = 48 with both compiled, (30 - 15) /
    # 0.240 = 63 with the decode step alone, (30 - 18) / 0.249 = 48 with the log-prob passes alone.
    plan = resolve_engine(EngineOptions(), SMOLLM2, fit=FitLength(max_steps=500, max_time_s=30.0, max_new_tokens=16))
    assert compiled(plan) == (False, False, False)


def test_a_part_compiled_anyway_has_paid_the_compiler_s_start():
    # compile=True: the decode step is compiled whatever the estimate, so the log-prob passes cost 6 s more,
    # not 18: (43 - 6) / 0.189 = 196 steps against 43 / 0.240 = 180.
    fit = FitLength(max_steps=1_000_000, max_time_s=43.0, max_new_tokens=16)
    plan = resolve_engine(EngineOptions(compile=True), SMOLLM2, fit=fit)
    assert compiled(plan) == (True, True, True)
    assert "~196 steps in the time left, not: ~180" in plan.notes[0]


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
