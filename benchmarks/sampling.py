"""The sampling of one decode step: an exponential race over ``[rows, vocabulary]`` logits.

    python benchmarks/sampling.py --device cuda      # W1's shape: 128 rows x 151936 tokens
    python benchmarks/sampling.py                    # CPU, W0's shape

Times ``argmax(logits - log E)`` (the engine's draw at temperature 1, ``E ~ Exponential(1)``,
``engine.blocked_argmax(logits, race=True)``) with the argmax in one level and in two, compiled
with ``torch.compile`` and, on CUDA, replayed in a CUDA graph as the decode step is. Prints a
table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_lightning.engine import blocked_argmax  # noqa: E402


def time_us(function, logits: torch.Tensor, cuda: bool, repeats: int) -> float:
    for _ in range(3):
        function(logits)
    if not cuda:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            function(logits)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        function(logits)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(repeats):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / repeats)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, help="default 128 on CUDA, 32 on CPU")
    parser.add_argument("--vocab", type=int, help="default 151936 on CUDA, 512 on CPU")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    rows, vocab = args.rows or (128 if cuda else 32), args.vocab or (151936 if cuda else 512)
    logits = torch.randn(rows, vocab, device=args.device, dtype=torch.bfloat16).float()
    figures = {}
    for name, two_levels in (("one level", False), ("two levels", True)):
        race = torch.compile(lambda x, two=two_levels: blocked_argmax(x, race=True, two_levels=two), dynamic=False)
        figures[name] = time_us(race, logits, cuda, args.repeats)
        torch._dynamo.reset()
    where = "in a CUDA graph" if cuda else "per call"
    for name, us in figures.items():
        print(f"{name:>10}: {us:8.1f} us {where} ({figures['one level'] / us:.2f}x)")
    device = torch.cuda.get_device_name() if cuda else "cpu"
    print(json.dumps({"device": device, "torch": torch.__version__, "rows": rows, "vocab": vocab, "us": figures}))


if __name__ == "__main__":
    main()
