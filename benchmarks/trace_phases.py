"""Where each phase of a profiled step spends its time, from the Chrome trace that ``run.py`` writes.

    python benchmarks/run.py --workload W1 ... --profile-step 3 --profile-trace step3.json.gz
    python benchmarks/trace_phases.py step3.json.gz [--phases grpo.update grpo.logprobs] [--top 20]

For each phase (a ``record_function`` range of the module, as it ran on the GPU): its span, the
time some GPU kernel ran (busy) and the time none did (idle, with the gaps by size), the kernels
that take the time, and on the host the outermost PyTorch calls and compiled regions, with how
many times each ran: what the GPU waited for while it was idle.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path

GAP_BINS = (
    (2, "<2 us"), (5, "2-5 us"), (20, "5-20 us"), (100, "20-100 us"), (1000, "0.1-1 ms"), (float("inf"), ">=1 ms"),
)  # fmt: skip
"""Idle gaps by size: (upper bound in microseconds, label)."""


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def outermost(events: list[dict]) -> list[dict]:
    """The events not nested in an earlier one of their thread (on one thread they nest or follow;
    the backward pass runs on a thread of its own)."""
    threads = collections.defaultdict(list)
    for event in events:
        threads[event.get("pid"), event.get("tid")].append(event)
    kept = []
    for thread in threads.values():
        end = float("-inf")
        for event in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            if event["ts"] >= end:
                kept.append(event)
                end = event["ts"] + event["dur"]
    return kept


def phase_summary(events: list[dict], phase: str) -> dict | None:
    """The figures of one phase (all times in ms), or ``None`` if the trace lacks it on the GPU or
    on the host."""
    gpu = [e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"] == phase]
    host = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == phase]
    if not gpu or not host:
        return None
    lo, hi = gpu[0]["ts"], gpu[0]["ts"] + gpu[0]["dur"]
    kernels = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and lo <= e["ts"] < hi),
        key=lambda e: e["ts"],
    )
    busy, end, gaps = 0.0, lo, []
    for kernel in kernels:
        start, stop = kernel["ts"], kernel["ts"] + kernel["dur"]
        if start > end:
            gaps.append(start - end)
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    if hi > end:
        gaps.append(hi - end)
    idle_by_gap = collections.Counter()
    for gap in gaps:
        idle_by_gap[next(label for bound, label in GAP_BINS if gap < bound)] += gap / 1e3
    kernel_ms, kernel_calls = collections.Counter(), collections.Counter()
    for kernel in kernels:
        kernel_ms[kernel["name"][:90]] += kernel["dur"] / 1e3
        kernel_calls[kernel["name"][:90]] += 1
    host_lo, host_hi = host[0]["ts"], host[0]["ts"] + host[0]["dur"]
    calls = [
        e
        for e in events
        if e.get("cat") in ("cpu_op", "user_annotation") and host_lo <= e["ts"] < host_hi and e is not host[0]
    ]
    host_ms, host_calls = collections.Counter(), collections.Counter()
    for call in outermost(calls):
        host_ms[call["name"][:90]] += call["dur"] / 1e3
        host_calls[call["name"][:90]] += 1
    compiled_ms, compiled_calls = collections.Counter(), collections.Counter()
    for call in calls:
        if call["name"].startswith(("Torch-Compiled Region", "TorchDynamo Cache Lookup")):
            compiled_ms[call["name"][:60]] += call["dur"] / 1e3
            compiled_calls[call["name"][:60]] += 1
    return {
        "span_ms": (hi - lo) / 1e3, "kernels": len(kernels), "busy_ms": busy / 1e3, "idle_ms": sum(gaps) / 1e3,
        "idle_by_gap": idle_by_gap, "kernel_ms": kernel_ms, "kernel_calls": kernel_calls,
        "host_span_ms": (host_hi - host_lo) / 1e3, "host_ms": host_ms, "host_calls": host_calls,
        "compiled_ms": compiled_ms, "compiled_calls": compiled_calls,
    }  # fmt: skip


def format_summary(phase: str, summary: dict | None, top: int) -> list[str]:
    if summary is None:
        return [f"== {phase}: not in the trace"]
    idle = summary["idle_by_gap"]
    lines = [
        f"== {phase}: span {summary['span_ms']:.1f} ms on the GPU, {summary['kernels']} kernels, "
        f"busy {summary['busy_ms']:.1f} ms, idle {summary['idle_ms']:.1f} ms",
        "  idle by gap size: " + ", ".join(f"{label} {idle[label]:.1f} ms" for _, label in GAP_BINS if idle[label]),
        "  kernels (ms, launches, name):",
    ]
    lines += [f"    {t:8.2f} {summary['kernel_calls'][n]:6d}  {n}" for n, t in summary["kernel_ms"].most_common(top)]
    lines.append(f"  host: span {summary['host_span_ms']:.1f} ms; outermost calls (ms, calls, name):")
    lines += [f"    {t:8.2f} {summary['host_calls'][n]:6d}  {n}" for n, t in summary["host_ms"].most_common(top)]
    lines += [
        f"    compiled: {t:8.2f} ms {summary['compiled_calls'][n]:5d}  {n}"
        for n, t in summary["compiled_ms"].most_common(top)
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--phases", nargs="+", default=["grpo.rollout", "grpo.logprobs", "grpo.update"])
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    events = load(args.trace)
    for phase in args.phases:
        print("\n".join(format_summary(phase, phase_summary(events, phase), args.top)))


if __name__ == "__main__":
    main()
