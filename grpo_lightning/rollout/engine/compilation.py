"""Compilation of the decode step with ``torch.compile``, falling back where Inductor fails.

Compilation is regional where the model allows it: one decoder layer's step is compiled once and
run for every layer (the layers share their code and differ only in their weights, which the
compiled code takes as inputs), so compile time does not grow with depth. Unrolling all the layers
into one graph compiles each of them anew, several times the compile time for a step a few percent
faster at most (benchmarks/JOURNAL.md, 2026-11-28).

Inductor cannot generate code for every graph: the step is tried with its layers compiled, then
compiled whole, then with only its model forward compiled, then eager; a candidate that fails is
dropped for good, with a warning. The fused prefill is compiled layer by layer too, and run eagerly
from the compiler's first failure on.
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


def compiled_step_candidates(
    step: Callable, forward: Callable, options: dict[str, Any], layer_step: Callable | None = None
) -> list[tuple[str, Callable]]:
    """The candidates for the decode step ``step`` (which takes its model forward as ``forward=``):
    with ``layer_step`` (a decoder layer's step, which ``forward`` takes as ``layer_step=``) that
    function compiled once for every layer; then ``step`` compiled whole; then ``step`` with
    ``forward`` compiled alone. Each is named for the warning that drops it."""
    candidates = []
    if layer_step is not None:
        compiled_layer = torch.compile(layer_step, dynamic=False, options=options)
        candidates.append(
            ("the decode step's layers", functools.partial(step, forward=functools.partial(forward, layer_step=compiled_layer)))
        )
    compiled_forward = torch.compile(forward, dynamic=False, options=options)
    return candidates + [
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
    """``FusedDecoder.prefill`` with its layer step compiled (once, for every layer), given up for
    good, with a warning, the first time the compiler fails."""

    def __init__(self) -> None:
        self.failed = False
        self._compiled_layer: Callable | None = None

    def __call__(self, decoder: Any, options: dict[str, Any], *args: Any) -> Any:
        """``decoder.prefill(*args)`` with Inductor ``options``; ``None`` if the compiler fails."""
        if self._compiled_layer is None:
            self._compiled_layer = torch.compile(type(decoder).prefill_layer, options=options)
        try:
            return decoder.prefill(*args, layer_step=self._compiled_layer)
        except Exception as error:  # noqa: BLE001 - any compiler failure: prefill eagerly from now on
            warnings.warn(f"torch.compile of the prefill failed, prefilling eagerly: {error!r}", stacklevel=3)
            self.failed = True
            return None
