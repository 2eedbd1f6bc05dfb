"""Forced completion lengths for the long-completion workload (W5), on our engine and on TRL's.

A random-init model almost never samples EOS, so without help every completion runs to
``max_new_tokens``; real GRPO completions stop early with a long tail. Here each completion stops at a
length drawn in advance: log-normal with median ``max_new_tokens * 600 / 2048`` (600 for W5's 2048)
and ``SIGMA`` such that 10 % of the draws reach ``max_new_tokens``, rounded, at least 1 and cut to
``max_new_tokens``.

Indexing: the lengths of rollout ``step`` (0 for the first training step's rollout, counted by calls
of the generator) are drawn from ``numpy.random.default_rng((seed, step))``, one per row, where
``row = prompt index * group_size + completion index`` in the order the rollout's batch is generated.
Both frameworks generate in that order: ours repeats each prompt ``group_size`` times in a row
(``fast_generate_group``), TRL's ``RepeatSampler`` yields each prompt index ``num_generations`` times
in a row. So both runs give the same row of the same step the same length.

A row of length ``L < max_new_tokens`` has EOS blocked for its first ``L - 1`` tokens and forced as its
``L``-th (every other logit ``-inf``); a row of length ``max_new_tokens`` never samples EOS and runs to
the limit (truncated, as a real completion that hits it). One masked pass over the logits per decode
step, on both sides. Benchmark-only: the library is unchanged; our side swaps the sampler's
``StaticCacheGenerator`` for :class:`ForcedStopGenerator` in the benchmark process
(:func:`install_forced_stops`), TRL's side passes :class:`ForcedStopsProcessor` to ``generate``.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

from grpo_lightning.rollout.engine import StaticCacheGenerator
from grpo_lightning.rollout.engine.generator import model_device

MEDIAN_FRACTION = 600 / 2048  # median length / max_new_tokens
LIMIT_FRACTION = 0.10  # draws that reach max_new_tokens
SIGMA = math.log(1 / MEDIAN_FRACTION) / statistics.NormalDist().inv_cdf(1 - LIMIT_FRACTION)  # ~0.958
BUCKETS = 8  # the decode-time profile's buckets per rollout (W5: 256 steps each)


def stop_lengths(step: int, rows: int, max_new_tokens: int, seed: int) -> list[int]:
    """The lengths of rollout ``step``'s ``rows`` completions (see the module docstring)."""
    rng = np.random.default_rng((seed, step))
    draws = rng.lognormal(mean=math.log(max_new_tokens * MEDIAN_FRACTION), sigma=SIGMA, size=rows)
    return np.clip(np.rint(draws), 1, max_new_tokens).astype(np.int64).tolist()


def eos_steps(lengths: list[int], max_new_tokens: int) -> Tensor:
    """Per row, the index of the token forced to EOS: ``L - 1``, or ``max_new_tokens`` (never) when ``L``
    is the limit."""
    lengths = torch.tensor(lengths, dtype=torch.long)
    return torch.where(lengths < max_new_tokens, lengths - 1, max_new_tokens)


def force_stops(logits: Tensor, step: Tensor | int, eos_at: Tensor, is_eos: Tensor) -> Tensor:
    """``logits`` ``[B, V]`` of token ``step`` with EOS blocked in rows before their ``eos_at`` ``[B]``
    and every other token blocked in rows at it; ``is_eos`` ``[V]`` bool. Tensor ops only (CUDA-graph safe)."""
    forced = (eos_at == step).unsqueeze(1)
    early = (step < eos_at).unsqueeze(1)
    return logits.masked_fill(torch.where(forced, ~is_eos, early & is_eos), float("-inf"))


def produced_lengths(completions: Tensor, eos_ids: list[int]) -> list[int]:
    """Per row of ``completions`` ``[N, T]``: tokens up to and including the first EOS, else ``T``."""
    is_eos = torch.isin(completions, torch.tensor(eos_ids, device=completions.device))
    width = torch.full_like(is_eos[:, 0], completions.size(1), dtype=torch.long)
    return torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, width).tolist()


def eos_list(eos: int | list[int] | None) -> list[int]:
    """The EOS ids of a generation setting, as a list."""
    return [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]


def length_summary(step_lengths: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
    """The drawn lengths of some rollouts: mean, generated tokens per rollout, the share at the limit."""
    flat = [length for lengths in step_lengths for length in lengths]
    return {
        "mean_length": statistics.mean(flat),
        "tokens_per_rollout": statistics.mean(sum(lengths) for lengths in step_lengths),
        "at_limit": sum(length == max_new_tokens for length in flat) / len(flat),
    }


def rows_running(step_lengths: list[list[int]], bucket: int, buckets: int) -> list[float]:
    """Per bucket of decode steps, the mean number of rows that have not finished when it starts."""
    starts = [j * bucket + 1 for j in range(buckets)]  # decode step s samples token s
    return [statistics.mean(sum(length > s for length in lengths) for lengths in step_lengths) for s in starts]


class DecodeClock:
    """Marks every ``bucket`` decode steps of one rollout, with CUDA events on CUDA (read at the end,
    no synchronisation meanwhile), with ``perf_counter`` elsewhere; :meth:`finish` gives ms per step."""

    def __init__(self, bucket: int) -> None:
        self.bucket = bucket
        self.active = False
        self.cuda = False
        self.steps = 0
        self.marks: list[tuple[int, Any]] = []

    def begin(self, device: torch.device) -> None:
        self.active, self.cuda, self.steps, self.marks = True, device.type == "cuda", 0, []

    def _mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((self.steps, event))
        else:
            self.marks.append((self.steps, time.perf_counter()))

    def tick(self, run) -> Any:
        """``run()``, counted as one decode step."""
        if not self.active:
            return run()
        if not self.marks:
            self._mark()
        result = run()
        self.steps += 1
        if self.steps % self.bucket == 0:
            self._mark()
        return result

    def finish(self) -> list[float]:
        """Milliseconds per decode step in each bucket (the last one may be shorter)."""
        if self.marks and self.marks[-1][0] != self.steps:
            self._mark()
        self.active = False
        if self.cuda:
            torch.cuda.synchronize()
        profile = []
        for (start_step, start), (end_step, end) in zip(self.marks, self.marks[1:]):
            elapsed = start.elapsed_time(end) if self.cuda else (end - start) * 1e3
            profile.append(elapsed / (end_step - start_step))
        return profile


def median_profile(profiles: list[list[float]]) -> list[float]:
    """Bucket by bucket, the median over rollouts (those after the first when there are several)."""
    timed = profiles[1:] or profiles
    width = max((len(p) for p in timed), default=0)
    return [statistics.median(p[j] for p in timed if len(p) > j) for j in range(width)]


class ForcedStops:
    """What our forced-stop generators share: the draw's settings, the rollouts so far, their lengths and
    decode-time profiles."""

    def __init__(self, max_new_tokens: int, seed: int) -> None:
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.bucket = max(1, max_new_tokens // BUCKETS)
        self.lengths: list[list[int]] = []  # per rollout, as drawn
        self.produced: list[list[int]] = []  # per rollout, as generated
        self.profiles: list[list[float]] = []  # per rollout, ms per decode step per bucket

    def summary(self) -> dict[str, Any]:
        """The JSON figures of our side: the drawn lengths and the decode-time profile (rollouts after the first)."""
        timed = self.lengths[1:] or self.lengths
        pairs = [(d, p) for drawn, made in zip(self.lengths, self.produced) for d, p in zip(drawn, made)]
        return {
            "drawn": length_summary(self.lengths, self.max_new_tokens),
            "rows": len(pairs),
            "rows_off": sum(d != p for d, p in pairs),  # rows whose generated length is not the drawn one: 0
            "mean_length_per_rollout": [statistics.mean(made) for made in self.produced],
            "bucket_steps": self.bucket,
            "decode_ms_per_step": median_profile(self.profiles),
            "rows_running": rows_running(timed, self.bucket, BUCKETS),
        }


class _TimedGraph:
    """A captured decode step whose replays the clock counts."""

    def __init__(self, graph, clock: DecodeClock) -> None:
        self.graph, self.clock = graph, clock

    def replay(self) -> None:
        self.clock.tick(self.graph.replay)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)


class ForcedStopGenerator(StaticCacheGenerator):
    """``StaticCacheGenerator`` that stops each row at its drawn length (:func:`force_stops` in ``_emit``,
    on a device tensor of per-row EOS steps updated in place before each rollout, so captured graphs
    read the new values) and times its decode steps by buckets (:class:`DecodeClock`)."""

    forced: ForcedStops | None = None  # set by install_forced_stops

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._eos_at: Tensor | None = None
        self._clock = DecodeClock(self.forced.bucket)
        self._eager_clock = False

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, sampling, eos_token_id, pad_token_id, **kwargs: Any):
        rows, forced = prompt_ids.size(0), self.forced
        if rows > self.max_batch_size:
            raise ValueError(f"forced stops need one chunk: {rows} rows > max_batch_size {self.max_batch_size}")
        if sampling.max_new_tokens != forced.max_new_tokens:
            raise ValueError(f"stops drawn for {forced.max_new_tokens} new tokens, not {sampling.max_new_tokens}")
        device = model_device(self.model)
        if self._eos_at is None or self._eos_at.device != device:
            with torch.inference_mode(False):
                self._eos_at = torch.empty(self.max_batch_size, dtype=torch.long, device=device)
        lengths = stop_lengths(len(forced.lengths), rows, sampling.max_new_tokens, forced.seed)
        forced.lengths.append(lengths)
        with torch.inference_mode(False):
            self._eos_at.fill_(sampling.max_new_tokens)  # filler rows: never forced
            self._eos_at[:rows].copy_(eos_steps(lengths, sampling.max_new_tokens))
        use_graph = device.type == "cuda" if self.use_cuda_graph is None else self.use_cuda_graph
        self._eager_clock = not use_graph
        self._clock.begin(device)
        try:
            out = super().generate(prompt_ids, prompt_mask, sampling, eos_token_id, pad_token_id, **kwargs)
        finally:
            forced.profiles.append(self._clock.finish())
        forced.produced.append(produced_lengths(out[0] if isinstance(out, tuple) else out, eos_list(eos_token_id)))
        return out

    def _emit(self, logits: Tensor, sampling) -> None:
        b = self._buffers
        super()._emit(force_stops(logits, b.step, self._eos_at, b.eos), sampling)

    def _capture(self, sampling, limits: list[int]):
        return {limit: _TimedGraph(graph, self._clock) for limit, graph in super()._capture(sampling, limits).items()}

    def _first_working_step(self, sampling):
        if not self._eager_clock:  # a capture's warm-up: not timed
            return super()._first_working_step(sampling)
        step = self._clock.tick(lambda: super(ForcedStopGenerator, self)._first_working_step(sampling))
        return lambda s: self._clock.tick(lambda: step(s))


def install_forced_stops(max_new_tokens: int, seed: int) -> tuple[ForcedStops, Any]:
    """Make the rollout sampler of this process build :class:`ForcedStopGenerator`; returns the shared
    state and a function that undoes it."""
    from grpo_lightning.rollout.generation import sampler

    forced = ForcedStops(max_new_tokens, seed)
    generator = type("ForcedStopGenerator", (ForcedStopGenerator,), {"forced": forced})
    original = sampler.StaticCacheGenerator
    sampler.StaticCacheGenerator = generator

    def undo() -> None:
        sampler.StaticCacheGenerator = original

    return forced, undo


class ForcedStopsProcessor(LogitsProcessor):
    """TRL's side: a ``transformers`` logits processor applying :func:`force_stops` to one ``generate``
    call (prompts of ``prompt_len`` tokens), and counting its decode steps on ``clock``."""

    def __init__(self, eos_at: Tensor, eos_ids: list[int], prompt_len: int, clock: DecodeClock) -> None:
        self.eos_at, self.eos_ids, self.prompt_len, self.clock = eos_at, eos_ids, prompt_len, clock
        self.is_eos: Tensor | None = None

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.is_eos is None:
            self.is_eos = torch.zeros(scores.size(1), dtype=torch.bool, device=scores.device)
            self.is_eos[self.eos_ids] = True
        step = input_ids.size(1) - self.prompt_len
        return self.clock.tick(lambda: force_stops(scores, step, self.eos_at, self.is_eos))


def install_trl_forced_stops(model, max_new_tokens: int, seed: int) -> ForcedStops:
    """Wrap ``model.generate`` (the instance TRL's ``GRPOTrainer`` unwraps for generation) so each call
    passes a :class:`ForcedStopsProcessor` for its rollout; returns the shared state (lengths, profiles)."""
    forced = ForcedStops(max_new_tokens, seed)
    clock = DecodeClock(forced.bucket)
    generate = model.generate

    def generate_with_forced_stops(*args: Any, **kwargs: Any):
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        config = kwargs.get("generation_config") or model.generation_config
        eos_ids = eos_list(config.eos_token_id)
        lengths = stop_lengths(len(forced.lengths), input_ids.size(0), max_new_tokens, seed)
        forced.lengths.append(lengths)
        eos_at = eos_steps(lengths, max_new_tokens).to(input_ids.device)
        processor = ForcedStopsProcessor(eos_at, eos_ids, input_ids.size(1), clock)
        kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), processor])
        clock.begin(input_ids.device)
        try:
            out = generate(*args, **kwargs)
        finally:
            forced.profiles.append(clock.finish())
        sequences = getattr(out, "sequences", out)  # a tensor, or a GenerateOutput
        forced.produced.append(produced_lengths(sequences[:, input_ids.size(1) :], eos_ids))
        return out

    model.generate = generate_with_forced_stops
    return forced
