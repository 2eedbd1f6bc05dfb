"""What a long wait is doing, on stderr: one-line notices, and the progress of a loop of known length.

On a terminal the progress is a live bar (rich); in a log (stderr not a terminal) it is a plain
line every :data:`PLAIN_EVERY_S` seconds and one at the end, so the log stays readable. Output is a
courtesy: a closed or full stream never stops the work it reports.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TextIO

#: Seconds between two plain progress lines where stderr is not a terminal.
PLAIN_EVERY_S = 15.0


def say(line: str, stream: TextIO | None = None) -> None:
    """Write ``line`` to ``stream`` (stderr), flushed; nothing happens if it cannot be written."""
    stream = stream or sys.stderr
    try:
        stream.write(line + "\n")
        stream.flush()
    except (OSError, ValueError):  # a closed pipe or file
        pass


def clock(seconds: float) -> str:
    """``H:MM:SS`` of a duration."""
    return str(timedelta(seconds=int(seconds)))


def progress_line(label: str, done: int, total: int, elapsed: float) -> str:
    """``label: done/total steps, elapsed, ETA`` (the ETA from the mean time of the steps so far)."""
    line = f"{label}: {done}/{total} steps, {clock(elapsed)} elapsed"
    if done < total:
        line += f", ETA {clock(elapsed / done * (total - done))}" if done else ", ETA unknown"
    return line


def end_line(label: str, done: int, total: int, elapsed: float) -> str:
    """The last line of a loop that ended normally, after all its steps or stopped early."""
    if done == total:
        return f"{label}: {done}/{total} steps in {clock(elapsed)}, done"
    return f"{label}: stopped after {done} of at most {total} steps, in {clock(elapsed)}"


@contextmanager
def step_progress(
    label: str, total: int, stream: TextIO | None = None, every_s: float = PLAIN_EVERY_S
) -> Iterator[Callable[[int], None]]:
    """Report a loop of at most ``total`` steps; yields ``advance(done)``, to call after each step.
    A loop that stops early ends its report at the steps it did."""
    stream = stream or sys.stderr
    interactive = _is_terminal(stream)
    with _live_bar(label, total, stream) if interactive else _plain_lines(label, total, stream, every_s) as advance:
        yield advance


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


@contextmanager
def _plain_lines(label: str, total: int, stream: TextIO, every_s: float) -> Iterator[Callable[[int], None]]:
    started = time.monotonic()
    last_said = started
    done = 0

    def advance(steps_done: int) -> None:
        nonlocal last_said, done
        done = steps_done
        now = time.monotonic()
        if now - last_said >= every_s and done < total:
            say(progress_line(label, done, total, now - started), stream)
            last_said = now

    yield advance
    say(end_line(label, done, total, time.monotonic() - started), stream)


@contextmanager
def _live_bar(label: str, total: int, stream: TextIO) -> Iterator[Callable[[int], None]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("steps"), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=Console(file=stream)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)
