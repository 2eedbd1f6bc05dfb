"""Warm starts built once and cached on disk: the lock, the notice, the marker, and the reproducible CPU their result depends on."""

from __future__ import annotations

import json
import logging
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers

from grpo_lightning.runtime.cache import cache_dir
from grpo_lightning.progress import say
from grpo_lightning.quickstart.build_lock import build_lock

logger = logging.getLogger(__name__)

MARKER_FILE = "warm_start.json"


def default_cache_dir() -> Path:
    """``$GRPO_LIGHTNING_CACHE`` if set, else ``~/.cache/grpo_lightning`` (the project's cache)."""
    return cache_dir()


def build_once(
    output_dir: Path, is_current: Callable[[Path], bool], build: Callable[[Path], None], what: str, takes: str
) -> Path:
    """``output_dir`` as ``build`` writes it (its marker file last), unless ``is_current(marker)``
    says the marker there is this build's. Processes started together (test workers, a sweep's
    cells) build it once: the others wait on a file lock (:mod:`.build_lock`, which says who they
    wait for), then reuse it. Before building, one line on stderr says ``what`` is built, where, and
    how long it ``takes``."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(output_dir.with_name(f".{output_dir.name}.lock"), what):
        marker = output_dir / MARKER_FILE
        if is_current(marker):
            logger.info("Reusing %s", output_dir)
        else:
            say(f"Building {what} in {output_dir} ({takes}); later runs reuse it.")
            marker.unlink(missing_ok=True)
            build(output_dir)
    return output_dir


def records_key(key: str) -> Callable[[Path], bool]:
    """``is_current`` for :func:`build_once`: whether a marker file records ``key``."""

    def is_current(marker: Path) -> bool:
        try:
            return json.loads(marker.read_text())["key"] == key
        except (OSError, ValueError, KeyError):
            return False

    return is_current


def environment() -> dict[str, Any]:
    """What a warm start's exact result depends on besides its settings (recorded in the marker).

    The data, the initialisation and the batch order depend only on the settings (not on
    ``PYTHONHASHSEED``); the floating-point rounding depends on the torch build and on the
    vectorised kernels it picks for this CPU (``ATEN_CPU_CAPABILITY`` can force another).
    """
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": _WARM_START_THREADS,
    }


_WARM_START_THREADS = 1


@contextmanager
def reproducible_cpu() -> Iterator[None]:
    """One intra-op thread and deterministic algorithms inside; the caller's settings restored after.

    One thread makes the reductions' order independent of the machine's core count (and is the
    fastest choice for this tiny model anyway).
    """
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(_WARM_START_THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_num_threads(threads)


def read_marker(model_dir: str | Path) -> dict[str, Any]:
    """The record written after a completed warm start: settings, losses, dev accuracy, steps, seconds."""
    return json.loads((Path(model_dir) / MARKER_FILE).read_text())
