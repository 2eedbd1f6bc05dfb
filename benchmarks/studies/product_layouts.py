"""A decode step's matrix products in two orientations: ``x @ W^T`` and ``(W @ x^T)^T``.

    python benchmarks/studies/product_layouts.py [--rows 128]

At a decode step each product is ``[rows, K] @ [K, N]`` with few rows; cuBLAS picks its kernel from
the shape, and at W1's shapes it splits the down product over K and adds a reduction kernel. The
same product computed as ``W @ x^T`` (``[N, K] @ [K, rows]``, the result read transposed) is
another shape to cuBLAS's heuristics, perhaps one kernel. Each is captured in a CUDA graph over one
weight per layer (24 at W1), so that the weights do not stay in L2, and timed per call; the
results are checked against each other.
"""

from __future__ import annotations

import argparse
import json

import torch
from qkv_kernel import time_per_call  # benchmarks/studies/qkv_kernel.py, beside this file
from torch.nn import functional as F

W1_PRODUCTS = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    generator = torch.Generator(device="cuda").manual_seed(0)
    results = {}
    print(f"{args.rows} rows, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, (n, k) in W1_PRODUCTS.items():
        x = torch.randn(args.rows, k, device="cuda", generator=generator).bfloat16()
        weights = (torch.randn(args.layers, n, k, device="cuda", generator=generator) * k**-0.5).bfloat16()
        ways = {
            "x @ W^T": lambda layer: F.linear(x, weights[layer]),
            "(W @ x^T)^T": lambda layer: torch.mm(weights[layer], x.t()).t(),
        }
        reference = ways["x @ W^T"](0).float()
        row = {}
        for way_name, way in ways.items():
            error = (way(0).float() - reference).abs().max().item()
            row[way_name] = {"us_per_call": round(time_per_call(way, args.layers), 2), "max_abs_difference": error}
        results[name] = row
        timings = "  ".join(f"{w}: {r['us_per_call']:6.2f} us" for w, r in row.items())
        print(f"  {name:8s} [{args.rows}, {k}] @ [{k}, {n}]  {timings}")
    print(json.dumps({"rows": args.rows, "device": torch.cuda.get_device_name(), "results": results}))


if __name__ == "__main__":
    main()
