"""CUDA graphs of the decode step: one per bound on the cache slots read, replayed once per token.

A captured graph reads the weights at their device addresses: it stays valid while they are updated
in place and sees every update, but must be captured again when a parameter is replaced by a new
tensor (:func:`weights_fingerprint` tells).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


def weights_fingerprint(model: nn.Module) -> tuple[int, ...]:
    """Addresses of every parameter and buffer: a CUDA graph reads them at these addresses."""
    return tuple(t.data_ptr() for t in model.parameters()) + tuple(t.data_ptr() for t in model.buffers())


def capture_step_graphs(
    choose_step: Callable[[], Callable[[], None]],
    counters: list[Tensor],
    limits: list[int],
    warmup_limits: list[int],
    slots_in_use: Callable[[int], Any],
    pool: Any,
    stream: torch.cuda.Stream,
) -> dict[int, torch.cuda.CUDAGraph]:
    """One graph of the decode step for each bound of ``limits``, run inside ``slots_in_use(bound)``.

    ``choose_step`` runs a first step and returns the step to capture (compiled or not). Warm-up
    steps run on a side stream, one per bound of ``warmup_limits`` and ``limits``; each step is
    undone by putting ``counters`` (positions, cache slot, step index) back, so that all write the
    cache slot of the first decode step. The graphs share the memory ``pool`` and are captured on
    ``stream``; the caller prefills the cache again before replaying them."""
    device = counters[0].device
    start = [counter.clone() for counter in counters]

    def rewind() -> None:
        for counter, value in zip(counters, start):
            counter.copy_(value)

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        step = choose_step()
        rewind()
        for limit in warmup_limits + limits:  # each limit's launch too
            with slots_in_use(limit):
                step()
            rewind()
    torch.cuda.current_stream(device).wait_stream(side)
    graphs = {}
    for limit in limits:
        graph = graphs[limit] = torch.cuda.CUDAGraph()
        # thread_local: another thread (the update, while rollouts are sampled ahead) may keep
        # launching work and allocating memory on its own streams during the capture.
        with slots_in_use(limit), torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            step()
    return graphs
