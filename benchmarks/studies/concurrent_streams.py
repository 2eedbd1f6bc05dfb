"""Decode steps of a batch's parts on concurrent CUDA streams, against one step of the whole batch.

    python benchmarks/studies/concurrent_streams.py [--workload W1] [--parts 1 2 4] [--rounds 8]

A W1 decode step is latency-bound: about 230 kernels of 2 to 10 us, most filling a fraction of
the GPU, with about 1 us between two of them. Splitting the rows in ``k`` parts, each on its own
engine (cache, buffers, CUDA graph) and replaying their graphs on ``k`` streams lets the kernels
of one part run while another part's kernels wait or leave multiprocessors idle; each weight is
read once per part, from L2 when the parts run the same layer at about the same time.

For each ``k`` of ``--parts`` this builds ``k`` compiled engines of ``rows / k`` rows each (the
fast paths' options), runs one rollout on each (compile and capture), then times ``--steps``
decode steps of every part in turns with the other settings, ``--rounds`` times: milliseconds per
decode step of the whole batch, median and range. ``k = 1`` is the engine as it is. Also times
the ``k`` parts one after the other on one stream (``serial``): what the parts cost without
overlap.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("benchmarks_run", Path(__file__).resolve().parents[1] / "run.py")
bench = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

import grpo_lightning.rollout.engine.generator as engine  # noqa: E402
from grpo_lightning.rollout.types import SamplingParams  # noqa: E402


def restart(generator, prompt_len: int) -> None:
    """Put an engine's step buffers back at the first decode step (the cache keeps its values)."""
    generator._buffers.cache_position.fill_(prompt_len)
    generator._buffers.positions.fill_(prompt_len)
    generator._buffers.step.zero_()
    generator._buffers.finished.zero_()


def graphs_by_step(generator, prompt_len: int, steps: int) -> list:
    """The graph an engine replays at each of ``steps`` decode steps after one rollout: the one of
    the first bound on the slots read that covers the slots the step uses (``engine.slot_limits``)."""
    graphs = next(iter(generator._graphs.values()))  # the rollout's sampling setting: bound -> graph
    return [graphs[min(limit for limit in graphs if limit >= prompt_len + step)] for step in range(1, steps + 1)]


def time_steps(generators, streams, steps: int, prompt_len: int) -> float:
    """Milliseconds per decode step of all ``generators``' graphs, part ``i`` on ``streams[i]``."""
    graphs = [graphs_by_step(g, prompt_len, steps) for g in generators]
    for generator in generators:
        restart(generator, prompt_len)
    main = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record(main)
    for stream in set(streams):
        stream.wait_stream(main)
    for step in range(steps):
        for part, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                part[step].replay()
    for stream in set(streams):
        main.wait_stream(stream)
    end.record(main)
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="decode steps timed (default: max_new_tokens - 1)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    from transformers import AutoModelForCausalLM

    workload = bench.WORKLOADS[args.workload]
    rows = workload.prompts * workload.group_size
    with tempfile.TemporaryDirectory() as workdir:
        paths = bench.build_workdir(Path(workdir), dataclasses.replace(workload), rows=1, seed=0)
        model = AutoModelForCausalLM.from_pretrained(paths["model"], dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.cuda().eval()
    prompt_len = workload.prompt_tokens
    ids = torch.randint(100, workload.vocab_size, (rows, prompt_len), device="cuda")
    mask = torch.ones_like(ids)
    sampling = SamplingParams(workload.max_new_tokens, temperature=1.0, min_new_tokens=workload.max_new_tokens)
    steps = args.steps or workload.max_new_tokens - 1
    cache_len = prompt_len + workload.max_new_tokens
    print(f"{args.workload}: {rows} rows, {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)

    began = time.perf_counter()
    settings: dict[str, tuple[list, list]] = {}
    for parts in args.parts:
        if rows % parts:
            raise SystemExit(f"--parts {parts} does not divide {rows} rows")
        size = rows // parts
        generators = []
        for part in range(parts):
            generator = engine.StaticCacheGenerator(model, size, cache_len, compile=True, fuse_projections=True)
            generator.generate(ids[part * size : (part + 1) * size], mask[:size], sampling, None, 0)
            generators.append(generator)
        streams = [torch.cuda.Stream() for _ in range(parts)]
        settings[f"{parts} part(s), {parts} stream(s)"] = (generators, streams)
        if parts > 1:
            settings[f"{parts} parts, serial"] = (generators, [streams[0]] * parts)
        probe = time_steps(generators, streams, 4, prompt_len)
        print(f"built {parts} part(s) of {size} rows at {time.perf_counter() - began:.0f} s: "
              f"{probe:.3f} ms per step over 4 steps", flush=True)  # fmt: skip
        if probe > 20:
            raise SystemExit("the parts' graphs do not run concurrently as they should")

    times: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, (generators, streams) in settings.items():
            times[name].append(time_steps(generators, streams, steps, prompt_len))
    first = next(iter(times))
    print(f"ms per decode step of {rows} rows, {args.rounds} rounds in turns, {steps} steps each")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:>24}: {median:.3f} ({min(values):.3f}-{max(values):.3f}), "
              f"{statistics.median(times[first]) / median:.3f}x {first}")  # fmt: skip


if __name__ == "__main__":
    main()
