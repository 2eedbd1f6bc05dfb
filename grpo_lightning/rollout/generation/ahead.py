"""Sampling ahead: a rollout drawn on a worker thread, on CUDA on its own stream, while the caller
goes on (:class:`grpo_lightning.rollout.stale.StaleRollouts` with ``overlap``: the next batch's
rollout while the current batch's reference pass and update run).

A decode step is bound by kernel latency, the update by arithmetic: on two streams their kernels
share the GPU (W1 on one H100: 0.77 s a step against 0.91 s in turn). The worker waits for the work
its caller queued before the submission (the copy of the weights it samples from), and finishes its
stream before its result is handed over; the caller then records its own stream on the result's
tensors, so the allocator does not reuse their memory for the worker's next rollout while the
caller still reads them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


class SamplesAhead:
    """Rollouts submitted under a key and taken by it; one worker, so one rollout at a time."""

    def __init__(self) -> None:
        self._worker: ThreadPoolExecutor | None = None  # started at the first submission
        self._pending: dict[Hashable, Future] = {}
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self.taken = 0  # results handed over so far
        self.on_take: Callable[[], None] | None = None  # called after a result is handed over

    def submit(self, key: Hashable, device: torch.device, sample: Callable[[], Any]) -> None:
        """Run ``sample()`` on the worker (on ``device``'s rollout stream), after the work queued so far."""
        stream = None
        if device.type == "cuda":
            if device not in self._streams:
                self._streams[device] = torch.cuda.Stream(device)
            stream = self._streams[device]
            stream.wait_stream(torch.cuda.current_stream(device))  # e.g. the snapshot of the weights

        def work() -> Any:
            if stream is None:
                return sample()
            with torch.cuda.device(device), torch.cuda.stream(stream):
                result = sample()
                stream.synchronize()
            return result

        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-rollout-ahead")
        self._pending[key] = self._worker.submit(work)

    def take(self, key: Hashable) -> Any | None:
        """The result submitted under ``key`` once it is ready (``None``: none was), for use on the
        caller's stream, after ``on_take()``; a failure of the worker is raised here."""
        future = self._pending.pop(key, None)
        if future is None:
            return None
        result = future.result()
        self.taken += 1
        for tensor in result if isinstance(result, tuple) else (result,):
            if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                tensor.record_stream(torch.cuda.current_stream(tensor.device))
        if self.on_take is not None:
            self.on_take()
        return result

    def has(self, key: Hashable) -> bool:
        return key in self._pending

    @property
    def pending(self) -> int:
        """How many results were submitted and not taken."""
        return len(self._pending)

    def wait(self) -> None:
        """Until the worker is idle (before anything else samples, e.g. validation): results are kept."""
        for future in list(self._pending.values()):
            with contextlib.suppress(Exception):  # raised when taken
                future.result()

    def clear(self) -> None:
        """Wait for the worker and drop what it sampled, and ``on_take`` with it."""
        self.wait()
        self._pending.clear()
        self.on_take = None
