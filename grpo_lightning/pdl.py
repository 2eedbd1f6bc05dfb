"""Programmatic dependent launch (PDL) of the decode step's Triton kernels, on Hopper and later GPUs.

In a CUDA graph, a kernel of the decode step starts once the kernel before it has finished and its
writes are visible: about 1 us between kernels, some 230 times per W1 decode step
(``benchmarks/RESULTS.md``). With PDL (CUDA's programmatic stream serialization) a kernel may be
launched while the one before it still runs; ``griddepcontrol.wait`` (``tl.extra.cuda.gdc_wait``)
then holds it until that kernel has completed and its writes are visible, and
``griddepcontrol.launch_dependents`` in the kernel before lets it launch early. Our kernels do both,
first thing (:func:`wait_then_release`): the wait makes every read that follows safe whatever kernel
came before, and the release lets the next kernel's launch overlap this one's work.

:func:`launch_pdl` says whether a launch on a device uses it: on CUDA devices of compute
capability 9 or more, not under Triton's interpreter, and not inside ``enabled(False)``; it is read
at each launch, so a CUDA graph keeps what held when it was captured.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from .attention import TRITON_INTERPRETED

_enabled = True


@contextlib.contextmanager
def enabled(flag: bool) -> Iterator[None]:
    """Launch the kernels with PDL (where :func:`launch_pdl` allows it) or without, inside the block."""
    global _enabled
    previous, _enabled = _enabled, flag
    try:
        yield
    finally:
        _enabled = previous


@functools.cache
def _capable(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_pdl(device: torch.device) -> bool:
    """Whether a kernel launched now on ``device`` uses programmatic dependent launch."""
    return _enabled and device.type == "cuda" and not TRITON_INTERPRETED and _capable(device)


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """With ``PDL``: wait until the kernel before has completed and its writes are visible, then let
    the next kernel launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
