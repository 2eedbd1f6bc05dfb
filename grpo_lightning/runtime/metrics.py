"""Step metrics, the logging policy and phase timers.

Metric names are those users know from TRL: ``reward``, ``reward_std``, ``frac_reward_zero_std``,
``kl``, ``entropy``, ``clip_ratio/*``, ``completions/*``; timings are under ``perf/``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.profiler import record_function

#: How two partial states ``(value, weight)`` of a step metric combine: a mean's weighted sums and
#: weights add up; a minimum or maximum keeps the extreme (its weight counts the values seen).
_COMBINE = {
    "mean": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "min": lambda a, b: (min(a[0], b[0]), a[1] + b[1]),
    "max": lambda a, b: (max(a[0], b[0]), a[1] + b[1]),
}

#: The state of a metric updated with NaN only: its value is NaN.
_NOTHING = {"mean": (0.0, 0.0), "min": (float("inf"), 0.0), "max": (float("-inf"), 0.0)}


class StepMetrics:
    """A step's metrics: weighted running means, or minima/maxima, logged and reset once per step.
    NaN values are left out.

    Values computed on an accelerator stay there until the step's metrics are read: moving each to
    the CPU as it is added would make the host wait for the device mid-step (several times per
    micro-batch), leaving the device idle while the host launches the next work. They are read
    together, in one copy."""

    def __init__(self) -> None:
        self._states: dict[str, tuple[str, tuple[float, float]]] = {}
        self._pending: list[tuple[str, str, Tensor, Tensor]] = []

    def update(self, name: str, value: Tensor | float, weight: Tensor | float = 1.0, reduce: str = "mean") -> None:
        """Add ``value`` to metric ``name``; ``reduce``: ``"mean"`` (weighted by ``weight``), ``"min"``, ``"max"``."""
        if reduce not in _COMBINE:
            raise ValueError(f"reduce must be one of {', '.join(_COMBINE)}, got {reduce!r}")
        # Copies: a tensor changed in place later must not change what was logged.
        value = torch.as_tensor(value, dtype=torch.float32).detach().reshape(()).clone()
        if isinstance(weight, Tensor):
            weight = weight.detach().to(value.device, torch.float32).reshape(()).clone()
        else:  # filled where the value is, not copied there: a copy to the GPU makes the host wait
            weight = torch.full((), float(weight), dtype=torch.float32, device=value.device)
        self._pending.append((name, reduce, value, weight))

    def _apply_pending(self) -> None:
        """Read the values added since the last read into the states, in order: those on an accelerator
        in one copy to the CPU, those on the CPU where they are (copying them over would make the host
        wait for the device once each)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        device = next((value.device for _, _, value, _ in pending if value.device.type != "cpu"), None)
        on_device = [torch.stack([value.to(device), weight.to(device)]) for _, _, value, weight in pending
                     if value.device.type != "cpu"]  # fmt: skip
        read = iter(torch.stack(on_device).tolist() if on_device else [])
        for name, reduce, value, weight in pending:
            value, weight = next(read) if value.device.type != "cpu" else (float(value), float(weight))
            if value != value:  # NaN: counts as an update, adds nothing
                state = _NOTHING[reduce]
            else:
                state = (value * weight, weight) if reduce == "mean" else (value, 1.0)
            if name in self._states:
                state = _COMBINE[reduce](self._states[name][1], state)
            self._states[name] = (reduce, state)

    def compute_and_reset(self, gather: Callable[[Any], list[Any]] | None = None) -> dict[str, float]:
        """Each metric's value since the last reset. ``gather`` (e.g. an all-gather over processes)
        merges the states of every process first, so the values are over all devices' data."""
        self._apply_pending()
        states, self._states = self._states, {}
        if gather is not None:
            merged: dict[str, tuple[str, tuple[float, float]]] = {}
            for part in gather(states):
                for name, (reduce, state) in part.items():
                    if name in merged:
                        state = _COMBINE[reduce](merged[name][1], state)
                    merged[name] = (reduce, state)
            states = merged
        values = {}
        for name, (reduce, (value, weight)) in states.items():
            if reduce == "mean":
                values[name] = value / weight if weight else float("nan")
            else:
                values[name] = value if weight else float("nan")
        return values

    def state_dict(self) -> dict[str, tuple[str, Tensor, Tensor]]:
        """States of the metrics updated since the last reset (a step in progress)."""
        self._apply_pending()
        return {
            name: (reduce, torch.tensor(value), torch.tensor(weight))
            for name, (reduce, (value, weight)) in self._states.items()
        }

    def load_state_dict(self, state: dict[str, tuple[str, Tensor, Tensor]]) -> None:
        self._pending = []
        self._states = {name: (reduce, (float(value), float(weight))) for name, (reduce, value, weight) in state.items()}


#: Step metrics given to ``self.log`` at every training step (the progress bar shows the reward and
#: the KL), so that callbacks find them in ``trainer.callback_metrics``; every metric of a step whose
#: metrics the loggers get is written to them by :func:`write_to_loggers`, and every step's values are
#: in ``GroupPolicyOptimization.last_step_metrics``. A hook's own metric joins them through
#: ``self.step_metrics.update``.
EVERY_STEP_METRICS = ("loss", "reward", "kl")

#: Metrics shown in the progress bar.
PROGRESS_BAR_METRICS = ("reward", "kl")


def every_step_metrics(values: dict[str, float]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(others, progress_bar)``: the step's ``EVERY_STEP_METRICS`` for ``self.log``, as CPU tensors
    (a number would be copied to the module's device, the host waiting for it each time)."""
    logged = as_tensors({k: values[k] for k in EVERY_STEP_METRICS if k in values})
    progress = {k: v for k, v in logged.items() if k in PROGRESS_BAR_METRICS}
    return {k: v for k, v in logged.items() if k not in progress}, progress


def write_to_loggers(trainer: Any, row: dict[str, float]) -> None:
    """What ``self.log`` of every metric in ``row`` would give the loggers, at a small part of its cost
    (``self.log`` takes about 0.2 ms of host time per metric: 10 ms a step for ~50). Each logger gets
    the values under the optimizer steps taken (``row["step"]``, as Lightning takes a logged ``step``),
    then saves."""
    scalars = {k: v for k, v in row.items() if k != "step"}
    for logger in trainer.loggers:
        logger.log_metrics(scalars, step=int(row["step"]))
        logger.save()


def keep_as_logged(trainer: Any, values: dict[str, float], loggers_write: bool) -> None:
    """Put ``values`` where ``self.log`` would leave them: in ``trainer.callback_metrics``, and on a
    step the loggers get (``loggers_write``, with a logger) in ``trainer.logged_metrics`` too."""
    tensors = as_tensors(values)
    trainer.callback_metrics.update(tensors)
    if loggers_write and trainer.loggers:
        trainer.logged_metrics.update(tensors)


def as_tensors(values: dict[str, float]) -> dict[str, Tensor]:
    """``values`` as CPU tensors, as ``trainer.callback_metrics`` holds them."""
    return {k: torch.tensor(v) for k, v in values.items()}


def counters(rollouts: int, generation_batches: int, optimizer_steps: int) -> dict[str, float]:
    """A training row's x-axis and work counters: ``step`` (the loggers' x-axis) is the optimizer
    steps taken, this update's included; ``counters/rollouts`` the rollouts trained on and
    ``counters/generation_batches`` the batches of prompts sampled for training (DAPO's dynamic
    sampling draws several per update), beside ``perf/generated_tokens``."""
    return {
        "counters/rollouts": float(rollouts),
        "counters/generation_batches": float(generation_batches),
        "step": float(optimizer_steps),
    }


class PhaseTimer:
    """Wall time of a step's phases as ``perf/<phase>_s`` metrics, each phase also a profiler range
    (``grpo.<phase>``). On CUDA the current stream's queued work is waited for at each boundary,
    so each phase is charged its own kernels (and not a rollout sampled ahead on its own stream)."""

    def __init__(self, metrics: StepMetrics, device: torch.device) -> None:
        self.metrics, self.device = metrics, device
        self.start = self.clock()

    def clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str, range_name: str | None = None) -> Iterator[None]:
        """Time the ``with`` block as ``perf/<name>_s``, in the profiler range ``range_name``
        (default ``grpo.<name>``)."""
        start = self.clock()
        with record_function(range_name or f"grpo.{name}"):
            yield
        self.metrics.update(f"perf/{name}_s", self.clock() - start)

    def total(self) -> float:
        """Seconds since the timer started."""
        return self.clock() - self.start
