"""Compilation of the decode step with ``torch.compile``, falling back where Inductor fails.

Inductor cannot generate code for every graph: the step is tried compiled whole, then with only its
model forward compiled, then eager; a candidate that fails is dropped for good, with a warning. The
fused prefill is compiled too, and run eagerly from the compiler's first failure on.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch


def default_compile_options(device: torch.device) -> dict[str, Any]:
    """Inductor options for the decode step on ``device``. On CUDA, ``combo_kernels`` launches
    independent small kernels of the step together as one kernel, which a step bound by kernel
    launches gains from."""
    from torch._inductor import config

    return {"combo_kernels": True} if device.type == "cuda" and hasattr(config, "combo_kernels") else {}


def compiled_step_candidates(step: Callable, forward: Callable, options: dict[str, Any]) -> list[tuple[str, Callable]]:
    """``step`` (which takes its model forward as ``forward=``) compiled whole, then ``step`` with
    ``forward`` compiled alone, each named for the warning that drops it."""
    compiled_forward = torch.compile(forward, dynamic=False, options=options)
    return [
        ("the decode step", torch.compile(step, dynamic=False, options=options)),
        ("the decode step's forward", functools.partial(step, forward=compiled_forward)),
    ]


def first_working_step(candidates: list[tuple[str, Callable]], eager: Callable, *args: Any) -> Callable:
    """The first of ``candidates`` that runs on ``args`` (after running it once), else ``eager``
    (after running it once). Candidates that fail are removed from the list, with a warning."""
    while candidates:
        name, step = candidates[0]
        try:
            step(*args)
            return step
        except Exception as error:  # noqa: BLE001 - any compiler failure: try the next candidate
            warnings.warn(f"torch.compile of {name} failed, trying without it: {error!r}", stacklevel=3)
            candidates.pop(0)
    eager(*args)
    return eager


class CompiledPrefill:
    """``FusedDecoder.prefill`` compiled (once per decoder), given up for good, with a warning,
    the first time the compiler fails."""

    def __init__(self) -> None:
        self.failed = False
        self._compiled: tuple[Any, Callable] | None = None  # (decoder, its compiled prefill)

    def __call__(self, decoder: Any, options: dict[str, Any], *args: Any) -> Any:
        """``decoder.prefill(*args)`` compiled with Inductor ``options``; ``None`` if the compiler fails."""
        if self._compiled is None or self._compiled[0] is not decoder:
            self._compiled = (decoder, torch.compile(decoder.prefill, options=options))
        try:
            return self._compiled[1](*args)
        except Exception as error:  # noqa: BLE001 - any compiler failure: prefill eagerly from now on
            warnings.warn(f"torch.compile of the prefill failed, prefilling eagerly: {error!r}", stacklevel=3)
            self.failed = True
            return None
