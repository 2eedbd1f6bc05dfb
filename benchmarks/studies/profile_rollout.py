"""Where a rollout's decode step spends its time: the static-cache engine on one workload's model.

    python benchmarks/studies/profile_rollout.py [--workload W1] [--rows 128] [--out profile.txt]
        [--decode-attention triton] [--fuse-projections] [--only-compiled]

Builds the workload's random-init model (as ``run.py`` does), then on CUDA:

1. times whole rollouts (``rows`` x ``max_new_tokens``, CUDA graph) with the grouped-query
   attention of ``grpo_lightning.rollout.engine.attention`` and, in the same process, with transformers' own
   attention path, and reports milliseconds per decode step;
2. profiles a few decode steps with ``torch.profiler``, eager and compiled, both without the CUDA
   graph: kernels launched per step, their summed GPU time per step (against the step's time in
   the graph: how far the step is from being bound by its kernels) and the kernels that take it.

3. with ``--ab '{"name": {engine options}, ...}'``, builds one compiled engine per entry (its options
   over the command line's) and times their rollouts in turns, ``--rounds`` times: a comparison
   on one card in one process;
4. with ``--trace``, lists the kernels of one compiled decode step in the order they run, with
   their times, and sums them by kernel: what a step is made of, and how much of the step's time
   in the graph is spent between kernels rather than in them.

``--decode-attention``, ``--fuse-projections`` and ``--compile-options`` set the engine's options
of the same names for every engine built; ``--only-compiled`` skips the uncompiled timings and
profile.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
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


def rollout_ms_per_step(generator, ids, mask, sampling, repeats: int) -> tuple[float, float]:
    """Median milliseconds per decode step after the first rollout, and the first rollout's seconds."""
    times = []
    for _ in range(repeats + 1):  # the first one captures the graph
        torch.cuda.synchronize()
        start = time.perf_counter()
        generator.generate(ids, mask, sampling, None, 0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:]) / sampling.max_new_tokens, times[0]


def compare_in_turns(generator, variants: dict, ids, mask, sampling, rounds: int) -> list[str]:
    """Milliseconds per token of whole rollouts (prefill included, as :func:`rollout_ms_per_step`) of
    one compiled engine per entry of ``variants`` (engine options), timed in turns so that every
    variant sees the same card and the same state of it."""
    engines, times = {}, {}
    for name, options in variants.items():
        engines[name] = generator(compile=True, **options)
        engines[name].generate(ids, mask, sampling, None, 0)  # compiles and captures
        times[name] = []
    for _ in range(rounds):
        for name, engine_ in engines.items():
            times[name].append(rollout_ms_per_step(engine_, ids, mask, sampling, 1)[0])
    first = next(iter(variants))
    lines = [f"in turns, {rounds} rounds: ms per token of whole rollouts (CUDA graphs), median and range"]
    for name, values in times.items():
        median = statistics.median(values)
        lines.append(f"  {name:>24}: {median:.3f} ({min(values):.3f}-{max(values):.3f}), "
                     f"{statistics.median(times[first]) / median:.3f}x {first}  {variants[name]}")  # fmt: skip
    return lines


def decode_step_trace(generator, ids, mask, sampling, graph_ms: float, steps: int = 6) -> list[str]:
    """The kernels of one decode step (run without a CUDA graph) in the order they ran, and their
    times summed by kernel. A one-cycle ``torch.cuda._sleep`` kernel marks the start of each step."""
    first_working_step = generator._first_working_step

    def marked(sampling):
        step = first_working_step(sampling)

        def run(sampling):
            torch.cuda._sleep(1)
            step(sampling)

        return run

    generator._first_working_step = marked
    short = dataclasses.replace(sampling, max_new_tokens=3, min_new_tokens=3)
    generator.generate(ids, mask, short, None, 0)  # compiles
    traced = dataclasses.replace(sampling, max_new_tokens=steps + 1, min_new_tokens=steps + 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        generator.generate(ids, mask, traced, None, 0)
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    starts = [i for i, e in enumerate(kernels) if "spin" in e.name.lower() or "sleep" in e.name.lower()]
    if len(starts) < 3:
        return [f"trace: no step markers found among {len(kernels)} kernels"]
    step = kernels[starts[-2] + 1 : starts[-1]]  # a whole step, neither the first nor the last
    busy = sum(e.time_range.elapsed_us() for e in step)
    span = step[-1].time_range.end - step[0].time_range.start
    lines = [f"\none decode step, compiled, no CUDA graph: {len(step)} kernels, {busy:.0f} us in kernels, "
             f"{span:.0f} us from the first kernel's start to the last one's end; the step in the CUDA graph: "
             f"{graph_ms * 1000:.0f} us, so about {graph_ms * 1000 - busy:.0f} us between kernels"]  # fmt: skip
    totals: dict[str, list[float]] = {}
    for index, event in enumerate(step):
        lines.append(f"  {index:4d} {event.time_range.elapsed_us():8.2f} us  {event.name[:110]}")
        totals.setdefault(event.name, []).append(event.time_range.elapsed_us())
    lines.append("by kernel: calls, us per step, us per call")
    for name, times in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {len(times):4d} {sum(times):9.1f} {sum(times) / len(times):8.2f}  {name[:110]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--rows", type=int, default=None, help="rollout rows (default: the workload's prompts x G)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profiled-steps", type=int, default=8, help="0: time the rollouts only")
    parser.add_argument("--out", default=None, help="also write the report here")
    parser.add_argument("--decode-attention", default="auto", help="the engine's decode_attention")
    parser.add_argument("--fuse-projections", action="store_true", help="the engine's fuse_projections")
    parser.add_argument(
        "--qkv-kernel", choices=["auto", "on", "off"], default="auto", help="the engine's qkv_kernel (auto: None)"
    )
    parser.add_argument(
        "--sampling-kernel", choices=["auto", "on", "off"], default="auto", help="the engine's sampling_kernel (auto: None)"
    )
    parser.add_argument("--only-compiled", action="store_true", help="time and profile the compiled step only")
    parser.add_argument("--ab", type=json.loads, default=None, help="engine options per name, timed in turns")
    parser.add_argument("--rounds", type=int, default=5, help="turns of --ab")
    parser.add_argument("--trace", action="store_true", help="list the kernels of one compiled decode step in order")
    parser.add_argument(
        "--compile-options", type=json.loads, default=None,
        help="the engine's compile_options as JSON, e.g. '{}' (default: engine.default_compile_options)",
    )  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    from transformers import AutoModelForCausalLM

    workload = bench.WORKLOADS[args.workload]
    rows = args.rows or workload.prompts * workload.group_size
    with tempfile.TemporaryDirectory() as workdir:
        paths = bench.build_workdir(Path(workdir), dataclasses.replace(workload), rows=1, seed=0)
        model = AutoModelForCausalLM.from_pretrained(paths["model"], dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.cuda().eval()
    ids = torch.randint(100, workload.vocab_size, (rows, workload.prompt_tokens), device="cuda")
    mask = torch.ones_like(ids)
    sampling = SamplingParams(workload.max_new_tokens, temperature=1.0, min_new_tokens=workload.max_new_tokens)
    lines = [f"{args.workload}: {rows} rows x {workload.max_new_tokens} new tokens, prompt {workload.prompt_tokens}, "
             f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"]  # fmt: skip

    cache_len = workload.prompt_tokens + workload.max_new_tokens
    options = {
        "decode_attention": args.decode_attention,
        "fuse_projections": args.fuse_projections,
        "compile_options": args.compile_options,
        "qkv_kernel": {"auto": None, "on": True, "off": False}[args.qkv_kernel],
        "sampling_kernel": {"auto": None, "on": True, "off": False}[args.sampling_kernel],
    }
    lines[0] += f", {options}"

    def generator(**kwargs):
        return engine.StaticCacheGenerator(model, rows, cache_len, **{**options, **kwargs})

    if args.ab:
        lines.extend(compare_in_turns(generator, args.ab, ids, mask, sampling, args.rounds))

    compiled_engine = generator(compile=True)
    compiled, first_s = rollout_ms_per_step(compiled_engine, ids, mask, sampling, args.repeats)
    del compiled_engine
    if args.only_compiled:
        lines.append(f"decode step (CUDA graph): {compiled:.2f} ms compiled (first rollout {first_s:.0f} s)")
    else:
        grouped, _ = rollout_ms_per_step(generator(), ids, mask, sampling, args.repeats)
        original = engine.grouped_query_attention
        engine.grouped_query_attention = lambda model: contextlib.nullcontext(False)
        try:
            plain, _ = rollout_ms_per_step(generator(), ids, mask, sampling, args.repeats)
        finally:
            engine.grouped_query_attention = original
        lines.append(f"decode step (CUDA graph): {grouped:.2f} ms with grouped-query attention, "
                     f"{plain:.2f} ms with transformers' attention ({plain / grouped:.2f}x), "
                     f"{compiled:.2f} ms compiled (torch.compile; first rollout {first_s:.0f} s)")  # fmt: skip

    if args.trace:
        lines.extend(decode_step_trace(generator(use_cuda_graph=False, compile=True), ids, mask, sampling, compiled))

    steps = args.profiled_steps
    short = dataclasses.replace(sampling, max_new_tokens=2, min_new_tokens=2)
    profiled = dataclasses.replace(sampling, max_new_tokens=steps + 1, min_new_tokens=steps + 1)
    for name, compile_step in (("eager", False), ("compiled", True)):
        if (args.only_compiled and not compile_step) or steps == 0:
            continue
        # Without the CUDA graph, so that the profiler sees each kernel of a decode step.
        profiled_engine = generator(use_cuda_graph=False, compile=compile_step)
        profiled_engine.generate(ids, mask, short, None, 0)  # warm-up: allocations, cuBLAS handles, compilation
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
            profiled_engine.generate(ids, mask, profiled, None, 0)
            torch.cuda.synchronize()
        del profiled_engine
        events = prof.key_averages()
        gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = sum(e.count for e in gpu)
        busy_ms = sum(e.self_device_time_total for e in gpu) / 1000 / (steps + 1)
        lines.append(f"{name}, no CUDA graph: {kernels / (steps + 1):.0f} GPU kernels per token, "
                     f"{busy_ms:.2f} ms of kernel time per token (prefill included, {steps + 1} tokens)")  # fmt: skip
        try:
            table = events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70)
        except (AttributeError, KeyError, ValueError):  # releases that name it self_cuda_time_total
            table = events.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70)
        lines.append(table)
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
