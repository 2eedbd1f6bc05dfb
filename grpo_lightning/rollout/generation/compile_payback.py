"""Whether compiling pays back within this run: what ``"auto"`` weighs for the compilation options.

Compiling costs once (seconds before the first step that uses it) and saves a little on every step
after. A short fit, a debugging run or an ablation cell can end before it has paid back, so
:func:`compile_choices` picks the parts to compile (the decode step, the log-prob passes) that get the
most out of the fit's length: the most steps in the time left of ``max_time``, or the least time
for ``max_steps``. Compiling costs a fixed part, paid once whatever is compiled (the compiler's start
in the process), and a part per piece; each is cheaper where this machine's compile cache holds that
part already (:class:`~grpo_lightning.rollout.generation.compile_record.CompileRecord`). The static
engine's Triton kernels are weighed on their own: on a cold Triton cache a short run decodes with
their torch fallbacks.

Both are rough models, a step's time and its savings linear in the layers and the tokens each
rollout decodes, fitted to two workloads; the constants below are the only calibration.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_lightning.rollout.generation.compile_record import CompileRecord

# ---------------------------------------------------------------------------------- calibration
# Two workloads on one H200, torch 2.11: first step with empty or warm compile caches, then the median
# step (benchmarks/JOURNAL.md, 2026-11-28):
# * W1 (Qwen2.5-0.5B shape, 24 layers, 128 completions x 256 tokens): 1.93 s a step with nothing
#   compiled (the static engine's CUDA graphs run eagerly); compiling the decode step and the prefill
#   saves 0.28 s a step, the log-prob passes 0.30 s. First step 14.0 s eager, 41.4 s all compiled, cold.
# * SmolLM2-135M (30 layers, 64 completions x 16 tokens; results/compile_payback_smollm2_h200/): 0.30 s
#   a step eager; the decode step and prefill save 0.06 s, the log-prob passes 0.05 s. First step 3.8 s
#   eager; all compiled 20.7 s cold, 6.3 s warm; the log-prob passes alone 19.3 s cold, 7.0 s warm.
# Per layer, a step is EAGER_S_PER_LAYER + EAGER_S_PER_LAYER_TOKEN x tokens, through both points; the
# same for each part's saving. The costs: the compiler's start (its worker pool, Inductor's and Triton's
# first use) is most of a cold compile, whatever is compiled.
EAGER_S_PER_LAYER = 5.3e-3
EAGER_S_PER_LAYER_TOKEN = 2.93e-4
SAVED_S_PER_LAYER = {"decode": 1.36e-3, "logprobs": 9.8e-4}
SAVED_S_PER_LAYER_TOKEN = {"decode": 4.03e-5, "logprobs": 4.5e-5}
COMPILER_START_S = {"cold": 12.0, "warm": 1.5}
PART_COMPILE_S = {"cold": {"decode": 3.0, "logprobs": 6.0}, "warm": {"decode": 0.5, "logprobs": 0.5}}
PART_NAMES = {"decode": "decode step", "logprobs": "log-prob passes"}
# The static engine's Triton kernels (decode attention, q/k/v, sampling) against their torch fallbacks,
# W1's decode step on one H200, compiled (benchmarks/JOURNAL.md, 2026-11-26): attention 1.56 against
# 1.77 ms with SDPA, 8.8 us a layer; q/k/v 1.53 against 1.56 ms, 1.3 us a layer; sampling 1.401
# against 1.485 ms, 84 us a token whatever the depth. With the decode step uncompiled the fallbacks
# may cost more than this (not measured).
TRITON_SAVED_S_PER_LAYER_TOKEN = 1.0e-5
TRITON_SAVED_S_PER_TOKEN = 8.4e-5
# ESTIMATE, to be measured: the kernels' compile on an empty Triton cache. The SmolLM2 recipe's first
# step took 36 s on empty caches and 3 s on warm ones (JOURNAL.md, 2026-11-28); 8 s of the difference is
# the log-prob passes' cold compile, the rest is put on the kernels. Not yet measured alone; loading
# them from a warm cache is taken as free.
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


def eager_step_s(num_layers: int, max_new_tokens: int) -> float:
    """Estimated seconds of a step with nothing compiled."""
    return num_layers * (EAGER_S_PER_LAYER + EAGER_S_PER_LAYER_TOKEN * max_new_tokens)


def saved_s(part: str, num_layers: int, max_new_tokens: int) -> float:
    """Estimated seconds a step saves with ``part`` (``"decode"``, ``"logprobs"``) compiled."""
    return num_layers * (SAVED_S_PER_LAYER[part] + SAVED_S_PER_LAYER_TOKEN[part] * max_new_tokens)


def compile_cost_s(parts: frozenset[str] | set[str], warm: frozenset[str]) -> float:
    """Estimated seconds of compiling ``parts`` in a new process: the compiler's start, warm only where
    every part is, and each part's own share."""
    if not parts:
        return 0.0
    start = COMPILER_START_S["warm" if parts <= warm else "cold"]
    return start + sum(PART_COMPILE_S["warm" if part in warm else "cold"][part] for part in parts)


@dataclass(frozen=True)
class _Outcome:
    parts: frozenset[str]
    steps: float
    seconds: float


def _outcome(fit: FitLength, parts: frozenset[str], already: frozenset[str], num_layers: int) -> _Outcome:
    """Steps and seconds of the fit with ``parts`` compiled besides ``already`` (compiled anyway)."""
    tokens = fit.max_new_tokens
    eager = eager_step_s(num_layers, tokens)
    step_s = max(eager - sum(saved_s(p, num_layers, tokens) for p in parts | already), 0.1 * eager)
    cost = compile_cost_s(parts | already, fit.warm) - compile_cost_s(already, fit.warm)
    steps = float("inf") if fit.max_steps is None else float(fit.max_steps)
    if fit.max_time_s is not None:
        steps = min(steps, max(fit.max_time_s - cost, 0.0) / step_s)
    return _Outcome(parts, steps, cost + steps * step_s)


def _steps(fit: FitLength, step_s: float) -> float | None:
    bounds = [float(fit.max_steps)] if fit.max_steps is not None else []
    if fit.max_time_s is not None:
        bounds.append(max(fit.max_time_s, 0.0) / step_s)
    return min(bounds) if bounds else None


def triton_kernels_pay_back(fit: FitLength, num_layers: int) -> bool:
    """Whether the static engine's Triton kernels save more over ``fit`` than compiling them costs."""
    return _triton_estimate(fit, num_layers)[0]


def _triton_estimate(fit: FitLength, num_layers: int) -> tuple[bool, float, float]:
    steps = _steps(fit, eager_step_s(num_layers, fit.max_new_tokens))
    cost = TRITON_KERNELS_COMPILE_WARM_S if "kernels" in fit.warm else TRITON_KERNELS_COMPILE_COLD_S
    if steps is None:
        return True, float("inf"), cost
    saving = (TRITON_SAVED_S_PER_LAYER_TOKEN * num_layers + TRITON_SAVED_S_PER_TOKEN) * fit.max_new_tokens * steps
    return saving > cost, saving, cost


def _weighed(name: str, on: bool, saving: float, cost: float, warm: bool, off: str = "off") -> str:
    return (f"{name} {'on' if on else off} ({'warm' if warm else 'cold'} cache: saves ~{max(saving, 0.0):.0f} s, "
            f"costs ~{cost:.0f} s)")  # fmt: skip


def compile_choices(
    fit: FitLength,
    num_layers: int,
    static_engine: bool,
    triton_kernels: bool = False,
    logprob_passes: bool = True,
    already: frozenset[str] = frozenset(),
) -> CompileChoice:
    """The parts left to ``auto`` (the decode step: ``static_engine``; the log-prob passes:
    ``logprob_passes``) to compile so that the fit makes the most steps in its time left, or takes the
    least time over its ``max_steps``; ``already``: parts compiled anyway (set explicitly), whose cost
    is paid in any case. An unbounded fit compiles. The static engine's Triton kernels
    (``triton_kernels``) are weighed on their own (:func:`triton_kernels_pay_back`)."""
    weighed = frozenset(part for part, on in (("decode", static_engine), ("logprobs", logprob_passes)) if on)
    if fit.max_steps is None and fit.max_time_s is None:
        return CompileChoice(static_engine, True, "the fit has no max_steps or max_time, so compilation pays back")
    subsets = [frozenset(c) for n in range(len(weighed) + 1) for c in itertools.combinations(sorted(weighed), n)]
    outcomes = [_outcome(fit, parts, already, num_layers) for parts in subsets]
    best = max(outcomes, key=lambda o: (round(o.steps, 6), -o.seconds, -len(o.parts)))
    eager, everything = outcomes[0], outcomes[-1]
    parts = ["; ".join(f"{PART_NAMES[p]} {'on' if p in best.parts else 'off'}" for p in sorted(weighed))]
    if weighed:
        parts[0] += f" ({_comparison(fit, everything, eager)})"
    kernels = True
    if triton_kernels:
        kernels, kernel_saving, kernel_cost = _triton_estimate(fit, num_layers)
        off = "off, their torch fallbacks instead"
        parts.append(_weighed("Triton kernels", kernels, kernel_saving, kernel_cost, "kernels" in fit.warm, off))
    reason = f"{_horizon(fit, num_layers)}: " + "; ".join(part for part in parts if part)
    return CompileChoice("decode" in best.parts, "logprobs" in best.parts, reason, kernels)


def _horizon(fit: FitLength, num_layers: int) -> str:
    step_s = eager_step_s(num_layers, fit.max_new_tokens)
    steps = _steps(fit, step_s)
    return f"over ~{steps:.0f} steps of {fit.max_new_tokens} tokens, {num_layers} layers, ~{step_s:.2f} s each uncompiled"


def _comparison(fit: FitLength, compiled: _Outcome, eager: _Outcome) -> str:
    """Compiling every weighed part against none: steps in the time left, or seconds over the steps."""
    cache = "warm" if compiled.parts <= fit.warm else "cold"
    if fit.max_steps is None or min(compiled.steps, eager.steps) < fit.max_steps:
        return f"compiled on a {cache} cache: ~{compiled.steps:.0f} steps in the time left, not: ~{eager.steps:.0f}"
    return f"compiled on a {cache} cache: ~{compiled.seconds:.0f} s for the steps, not: ~{eager.seconds:.0f} s"


def run_length(trainer, max_new_tokens: int, val_max_new_tokens: int) -> FitLength | None:
    """The length of ``trainer``'s run: a fit's steps left (``max_steps``) and time left (``max_time``,
    :func:`~grpo_lightning.runtime.time_budget.remaining_seconds`); ``validate``/``test``: one rollout per batch.
    ``None`` outside a run."""
    from grpo_lightning.runtime.time_budget import remaining_seconds

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
