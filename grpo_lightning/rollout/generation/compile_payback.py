"""Whether compiling pays back within this run: what ``"auto"`` weighs for the compilation options.

Compiling costs once (seconds before the first step that uses it) and saves a little on every step
after. A short fit, a debugging run or an ablation cell can end before it has paid back, so
:func:`compile_choices` compiles a part only where the estimated saving over the fit's length
(``max_steps``, or the time left of ``max_time``) exceeds the estimated cost of compiling it: cold,
or warm where this machine's compile cache holds that part already
(:class:`~grpo_lightning.rollout.generation.compile_record.CompileRecord`). The static engine's Triton kernels
are weighed the same way: on a cold Triton cache a short run decodes with their torch fallbacks.

Both are rough models: a decode step's saving grows with the layers and the tokens it decodes, a
log-prob pass's with the layers; the cost of compiling does not grow with depth, since one decoder
layer is compiled and run for all. The constants below are the only calibration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_lightning.rollout.generation.compile_record import CompileRecord

# ---------------------------------------------------------------------------------- calibration
# From W1 (Qwen2.5-0.5B shape, 24 layers, 128 completions x 256 tokens) on one H200, torch 2.11, each
# first step with empty compile caches, then the median step (benchmarks/JOURNAL.md, 2026-11-28):
# * nothing compiled: first step 14.0 s (rollout 12.9, log-probs 0.3, update 0.9), then rollout
#   0.647 s, log-probs 0.178 s, update 0.603 s;
# * one decoder layer compiled for all: first step 41.4 s (28.7 / 4.5 / 8.2), then 0.371 / 0.109 / 0.370 s;
#   with warm caches 11.7 s, 0.28 of the cold first step.
# Derived: compiling the decode step and the prefill costs 28.7 - 12.9 = 16 s and saves
# 0.647 - 0.371 = 0.28 s a rollout = 4.5e-5 s a layer and token (against the static engine's CUDA
# graphs run eagerly); compiling the log-prob passes costs 4.5 + 8.2 - 1.2 = 11.5 s and saves
# 0.781 - 0.479 = 0.30 s a step = 12.5 ms a layer at W1's 41k tokens a step; 9 ms is kept for
# smaller batches (the SmolLM2 recipe's first estimate, from 1.1 s per step against TRL's 1.37 s).
DECODE_COMPILE_COLD_S = 16.0
DECODE_SAVED_S_PER_LAYER_TOKEN = 4.5e-5
DECODE_SAVED_OFFSET_S_PER_STEP = 0.0
LOGPROB_COMPILE_COLD_S = 11.5
LOGPROB_SAVED_S_PER_LAYER_STEP = 9e-3
WARM_CACHE_COST_FRACTION = 0.28
#: Seconds per step assumed without compilation, to turn ``max_time`` into steps: TRL's eager W1
#: step per layer and token (7.7 s / (24 x 256)), plus the log-prob passes' eager share.
EAGER_S_PER_LAYER_TOKEN = 1.25e-3
EAGER_LOGPROB_S_PER_LAYER_STEP = 0.02
# The static engine's Triton kernels (decode attention, q/k/v, sampling) against their torch fallbacks,
# W1's decode step on one H200, compiled (benchmarks/JOURNAL.md, 2026-11-26): attention 1.56 against
# 1.77 ms with SDPA, 8.8 us a layer; q/k/v 1.53 against 1.56 ms, 1.3 us a layer; sampling 1.401
# against 1.485 ms, 84 us a token whatever the depth. With the decode step uncompiled the fallbacks
# may cost more than this (not measured).
TRITON_SAVED_S_PER_LAYER_TOKEN = 1.0e-5
TRITON_SAVED_S_PER_TOKEN = 8.4e-5
# ESTIMATE, to be measured: the kernels' compile on an empty Triton cache. The SmolLM2 recipe's first
# step took 36 s on empty caches and 3 s on warm ones (JOURNAL.md, 2026-11-28); 8 s of the difference is
# the log-prob passes' cold compile (11.5 s x (1 - 0.28)), the rest is put on the kernels. Not yet
# measured alone; loading them from a warm cache is taken as free.
TRITON_KERNELS_COMPILE_COLD_S = 25.0
TRITON_KERNELS_COMPILE_WARM_S = 0.0


@dataclass(frozen=True)
class FitLength:
    """What a run offers compilation to pay back over; ``None`` where not bounded."""

    max_steps: int | None
    """Optimizer steps (one rollout each) left in the run."""
    max_time_s: float | None
    """Seconds left of the run's ``max_time`` budget."""
    max_new_tokens: int
    """Tokens each rollout decodes."""
    warm: frozenset[str] = frozenset()
    """The parts (``compile_record.PARTS``: ``"decode"``, ``"logprobs"``, ``"kernels"``) whose compiled
    code this machine's compile caches hold already (:func:`compile_cache_is_warm`)."""


def compile_cache_is_warm(record: CompileRecord | None, part: str, options: dict[str, Any]) -> bool:
    """Whether ``part`` of this model has been compiled and run with ``options`` on this machine, into
    compile-cache folders that are still there (:meth:`CompileRecord.is_warm`); ``None``: no record, cold."""
    return record is not None and record.is_warm(part, options)


@dataclass(frozen=True)
class CompileChoice:
    """What ``"auto"`` chose for the compilation options, and the one line that says why."""

    compile: bool
    """The static engine's decode step (``engine.compile``)."""
    logprob_passes: bool
    """The log-prob passes (``engine.model_compile`` and ``engine.logprob_compile``)."""
    reason: str
    triton_kernels: bool = True
    """The static engine's Triton kernels (``False``: their torch fallbacks)."""


def _steps(fit: FitLength, eager_step_s: float) -> float | None:
    bounds = [float(fit.max_steps)] if fit.max_steps is not None else []
    if fit.max_time_s is not None:
        bounds.append(max(fit.max_time_s, 0.0) / eager_step_s)
    return min(bounds) if bounds else None


def triton_kernels_pay_back(fit: FitLength, num_layers: int) -> bool:
    """Whether the static engine's Triton kernels save more over ``fit`` than compiling them costs."""
    return _triton_estimate(fit, num_layers)[0]


def _triton_estimate(fit: FitLength, num_layers: int) -> tuple[bool, float, float]:
    steps = _steps(fit, _eager_step_s(fit, num_layers))
    cost = TRITON_KERNELS_COMPILE_WARM_S if "kernels" in fit.warm else TRITON_KERNELS_COMPILE_COLD_S
    if steps is None:
        return True, float("inf"), cost
    saving = (TRITON_SAVED_S_PER_LAYER_TOKEN * num_layers + TRITON_SAVED_S_PER_TOKEN) * fit.max_new_tokens * steps
    return saving > cost, saving, cost


def _eager_step_s(fit: FitLength, num_layers: int) -> float:
    return num_layers * (EAGER_S_PER_LAYER_TOKEN * fit.max_new_tokens + EAGER_LOGPROB_S_PER_LAYER_STEP)


def _cost(part: str, fit: FitLength, cold_s: float) -> float:
    return (WARM_CACHE_COST_FRACTION if part in fit.warm else 1.0) * cold_s


def _weighed(name: str, on: bool, saving: float, cost: float, warm: bool, off: str = "off") -> str:
    return (f"{name} {'on' if on else off} ({'warm' if warm else 'cold'} cache: saves ~{max(saving, 0.0):.0f} s, "
            f"costs ~{cost:.0f} s)")  # fmt: skip


def compile_choices(
    fit: FitLength, num_layers: int, static_engine: bool, triton_kernels: bool = False, logprob_passes: bool = True
) -> CompileChoice:
    """Compile each part left to ``auto`` (the decode step: ``static_engine``; the static engine's Triton
    kernels: ``triton_kernels``; the log-prob passes: ``logprob_passes``) whose estimated saving over
    ``fit`` exceeds its estimated cost of compiling; an unbounded fit compiles."""
    decode_saving = DECODE_SAVED_S_PER_LAYER_TOKEN * num_layers * fit.max_new_tokens - DECODE_SAVED_OFFSET_S_PER_STEP
    logprob_saving = LOGPROB_SAVED_S_PER_LAYER_STEP * num_layers
    steps = _steps(fit, _eager_step_s(fit, num_layers))
    decode_cost = _cost("decode", fit, DECODE_COMPILE_COLD_S)
    logprob_cost = _cost("logprobs", fit, LOGPROB_COMPILE_COLD_S)
    if steps is None:
        return CompileChoice(static_engine, True, "the fit has no max_steps or max_time, so compilation pays back")
    compile_decode = static_engine and decode_saving * steps > decode_cost
    compile_logprob = logprob_saving * steps > logprob_cost
    kernels, kernel_saving, kernel_cost = _triton_estimate(fit, num_layers)
    parts = []
    if static_engine:
        parts.append(_weighed("decode step", compile_decode, decode_saving * steps, decode_cost, "decode" in fit.warm))
    if logprob_passes:
        saving = logprob_saving * steps
        parts.append(_weighed("log-prob passes", compile_logprob, saving, logprob_cost, "logprobs" in fit.warm))
    if triton_kernels:
        off = "off, their torch fallbacks instead"
        parts.append(_weighed("Triton kernels", kernels, kernel_saving, kernel_cost, "kernels" in fit.warm, off))
    reason = f"over ~{steps:.0f} steps of {fit.max_new_tokens} tokens, {num_layers} layers: " + "; ".join(parts)
    return CompileChoice(compile_decode, compile_logprob, reason, kernels or not triton_kernels)


def run_length(trainer, max_new_tokens: int, val_max_new_tokens: int) -> FitLength | None:
    """The length of ``trainer``'s run: a fit's steps left (``max_steps``) and time left (``max_time``,
    :func:`~grpo_lightning.training.time_budget.remaining_seconds`); ``validate``/``test``: one rollout per batch.
    ``None`` outside a run."""
    from grpo_lightning.training.time_budget import remaining_seconds

    fn = getattr(getattr(trainer, "state", None), "fn", None)
    fn = getattr(fn, "value", fn)
    if fn == "fit":
        steps = trainer.max_steps - trainer.global_step if trainer.max_steps and trainer.max_steps > 0 else None
        return FitLength(steps, remaining_seconds(trainer), max_new_tokens)
    if fn in ("validate", "test"):
        batches = trainer.num_val_batches if fn == "validate" else trainer.num_test_batches
        finite = [b for b in batches if b != float("inf")]
        if batches and len(finite) == len(batches):
            return FitLength(int(sum(finite)), remaining_seconds(trainer), val_max_new_tokens)
    return None
