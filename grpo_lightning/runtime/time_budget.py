"""``trainer.max_time`` counted from the start of the process, and where the time went.

Lightning's ``Timer`` counts from the start of ``fit``: loading the model, validating before the
first step and compiling come on top of the budget, so a 3-minute budget could run for six. A user
pays for the whole process, so :class:`TimeBudget` counts from its start: it stops training after
the optimizer step during which the budget ran out (at most one step over), stops a validation loop
at the batch where it runs out (validation before the first step included), and reports how the
time was spent when the fit ends (:meth:`TimeBudget.summary`, shown by
:class:`~grpo_lightning.training.callbacks.FitSummary`).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities import rank_zero_info

from grpo_lightning.errors import ConfigError


def process_start_time() -> float:
    """When this process started, in ``time.time()`` seconds: from ``/proc`` on Linux (imports and
    interpreter start-up count), else ``psutil``; without either, the time this module was imported."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # Field 22 (after the command name, which may hold spaces): start time in clock ticks after boot.
            started_after_boot = int(stat.read().rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
            age = float(uptime.read().split()[0]) - started_after_boot
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001  (psutil missing or refused: the import time is the best left)
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


def budget_seconds(max_time: Any) -> float | None:
    """Seconds of a ``max_time`` in the forms Lightning's ``Trainer(max_time=...)`` takes:
    ``"DD:HH:MM:SS"``, a ``timedelta``, a dict of ``timedelta`` arguments; or a number of seconds."""
    if max_time is None:
        return None
    if isinstance(max_time, timedelta):
        return max_time.total_seconds()
    if isinstance(max_time, dict):
        return timedelta(**max_time).total_seconds()
    if isinstance(max_time, (int, float)) and not isinstance(max_time, bool):
        return float(max_time)
    if isinstance(max_time, str):
        parts = max_time.strip().split(":")
        if len(parts) == 4 and all(p.strip().isdigit() for p in parts):
            days, hours, minutes, seconds = map(int, parts)
            return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()
    raise ConfigError(f"trainer.max_time: {max_time!r} is not a duration; write it as DD:HH:MM:SS, e.g. 00:00:10:00.")


def remaining_seconds(trainer) -> float | None:
    """Seconds left of ``trainer``'s time budget: its :class:`TimeBudget`'s, else Lightning's timer's
    (``Trainer(max_time=...)``); ``None`` without a budget."""
    for callback in trainer.callbacks:
        if isinstance(callback, TimeBudget) and callback.budget is not None:
            return callback.budget - callback.elapsed()
    timers = [callback for callback in trainer.callbacks if isinstance(callback, Timer)]
    return timers[0].time_remaining() if timers else None


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (0 before Dynamo is imported)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    return dynamo_utils.counters["stats"]["unique_graphs"] if dynamo_utils is not None else 0


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else (f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s")


class TimeBudget(Callback):
    """Stop a run once ``max_time`` has passed since the process started, and account for the time.

    ``max_time``: as :func:`budget_seconds` reads it; ``None`` only accounts. ``start``: the clock's
    origin in ``time.time()`` seconds (default: :func:`process_start_time`). Every process takes
    rank 0's decision, so the processes of a multi-device run stop at the same batch.
    """

    def __init__(self, max_time: Any = None, start: float | None = None) -> None:
        self.budget = budget_seconds(max_time)
        self.start = process_start_time() if start is None else start
        self.origin = "process start" if start is None else "start"
        self.train_started: float | None = None
        self.first_step_started: float | None = None
        self.first_step_ended: float | None = None
        self.ended: float | None = None
        self.steps = 0
        self.compiling_steps = 0
        """Steps after the first that compiled a graph (a shape or a path the compile cache had not seen), and
        their seconds."""
        self.compiling_steps_seconds = 0.0
        self._step_started: tuple[float, int] | None = None
        self.validating = 0.0
        """Seconds in validation loops, ``validating_before_training`` of them before the first step."""
        self.validating_before_training = 0.0
        self.validation_stopped = False
        self._validation_started: float | None = None

    # ------------------------------------------------------------------ the clock

    def elapsed(self) -> float:
        return time.time() - self.start

    def exhausted(self, trainer) -> bool:
        """Whether the budget is gone, as rank 0 sees it."""
        if self.budget is None:
            return False
        return bool(trainer.strategy.broadcast(self.elapsed() >= self.budget))

    # ------------------------------------------------------------------ training

    def on_train_start(self, trainer, pl_module) -> None:
        # After the validation before the first step (the CLI puts this callback after that one).
        self.train_started = time.time()
        self.validating_before_training = self.validating
        if self.exhausted(trainer):
            trainer.should_stop = True
            rank_zero_info(f"max_time: the budget of {_duration(self.budget)} from {self.origin} was used up before "
                           "the first training step; no step is taken.")  # fmt: skip

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_started = (time.time(), compiled_graphs())
        if self.first_step_started is None:
            self.first_step_started = self._step_started[0]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps += 1
        if self.first_step_ended is None:
            self.first_step_ended = time.time()
        elif self._step_started is not None and compiled_graphs() > self._step_started[1]:
            self.compiling_steps += 1
            self.compiling_steps_seconds += time.time() - self._step_started[0]
        if self.exhausted(trainer):
            trainer.should_stop = True

    def on_fit_end(self, trainer, pl_module) -> None:
        self.ended = time.time()

    # ------------------------------------------------------------------ validation

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validation_started = time.time()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._validation_started is not None:
            self.validating += time.time() - self._validation_started
            self._validation_started = None

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not self.exhausted(trainer):
            return
        if not self.validation_stopped:
            rank_zero_info(f"max_time: the budget of {_duration(self.budget)} from {self.origin} is used up; "
                           f"validation stops (after {batch_idx} batch(es)), and so does the run.")  # fmt: skip
        self.validation_stopped = True
        trainer.should_stop = True
        # Lightning's evaluation loop ends on StopIteration raised inside a step, as at the end of its data;
        # the batch is closed first as the loop closes one, so the epoch's logging does not read it.
        trainer._logger_connector.on_batch_end()
        raise StopIteration

    # ------------------------------------------------------------------ the account

    def summary(self) -> str:
        """Where the time went since the process started: start-up and loading (imports, model, data;
        validation excluded), validation, the first training batch (a rollout and its update, compilation
        included) and the others, with the seconds of those that compiled. Batches, not optimizer steps:
        an update can make several steps (``minibatch_size``, ``ppo_epochs``)."""
        end = self.ended or time.time()
        budget = f" (max_time {_duration(self.budget)})" if self.budget is not None else ""
        line = f"{_duration(end - self.start)} since {self.origin}{budget}"
        if self.train_started is None:
            return line
        parts = [f"start-up and loading {_duration(self.train_started - self.start - self.validating_before_training)}",
                 f"validation {_duration(self.validating)}"]  # fmt: skip
        if self.first_step_started is not None and self.first_step_ended is not None:
            parts.append(f"first batch (compilation included) {_duration(self.first_step_ended - self.first_step_started)}")
            if self.steps > 1:
                later_validation = self.validating - self.validating_before_training
                later = max(end - self.first_step_ended - later_validation, 0.0)
                parts.append(f"{self.steps - 1} more batch{'es' if self.steps > 2 else ''} {_duration(later)}")
                if self.compiling_steps:
                    n = self.compiling_steps
                    parts[-1] += (f" ({_duration(self.compiling_steps_seconds)} of them in {n} batch{'es' if n > 1 else ''} "
                                  "that compiled)")  # fmt: skip
        return f"{line}: " + ", ".join(parts)
