"""A decode step's down product with its residual sum: cuBLAS's split-K against fp32 parts summed
in the residual kernel.

    python benchmarks/studies/down_split.py [--rows 128] [--splits 2 4 8]

At W1's shapes (128 rows, ``[128, 4864] @ [4864, 896]``) cuBLAS splits the down product over K
into parts and adds them in a kernel of its own (``splitKreduce``), after which the compiled step
runs another kernel for the residual sum and the next norm's squares. Here the product is computed
as ``S`` products over slices of K (one ``bmm`` with fp32 outputs, ``out_dtype``: the engine's
``fused_decode.residual_plus_parts``), and the compiled residual kernel adds the parts itself: one
kernel fewer per layer. Each way is compiled with
``torch.compile`` and captured in a CUDA graph over one weight per layer (24 at W1, so that the
weights do not stay in L2), and timed per call; the results are checked against the first way.
"""

from __future__ import annotations

import argparse
import json

import torch
from qkv_kernel import time_per_call  # benchmarks/studies/qkv_kernel.py, beside this file
from torch.nn import functional as F

from grpo_lightning.rollout.engine.fused_decode import residual_plus_parts


def residual_with_product(h: torch.Tensor, a: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``h + a @ weight^T`` and its rows' sums of squares (the next norm's input), bf16 product."""
    out = h + F.linear(a, weight)
    return out, out.float().pow(2).sum(-1)


def residual_with_parts(
    h: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, splits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same with the product as ``splits`` fp32 parts summed with ``h``: the engine's
    ``fused_decode.residual_plus_parts``."""
    out = residual_plus_parts(h, a, weight, None, splits)
    return out, out.float().pow(2).sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--splits", type=int, nargs="+", default=[2, 4, 8, 16])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows, n, k = args.rows, args.hidden, args.intermediate
    h = torch.randn(rows, n, device="cuda", generator=generator).bfloat16()
    a = torch.randn(rows, k, device="cuda", generator=generator).bfloat16()
    weights = (torch.randn(args.layers, n, k, device="cuda", generator=generator) * k**-0.5).bfloat16()
    print(f"{rows} rows, [{rows}, {k}] @ [{k}, {n}] + residual, bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}")

    ways = {"cuBLAS product (its split-K)": (lambda layer: F.linear(a, weights[layer]), "product")}
    compiled = torch.compile(residual_with_product, fullgraph=True)
    ways["product + residual, compiled"] = (lambda layer: compiled(h, a, weights[layer]), "residual")
    for splits in args.splits:
        if k % splits:
            continue
        parts = torch.compile(residual_with_parts, fullgraph=True)
        ways[f"{splits} fp32 parts + residual, compiled"] = (
            lambda layer, parts=parts, splits=splits: parts(h, a, weights[layer], splits),
            "residual",
        )
    reference = residual_with_product(h, a, weights[0])
    results = {}
    for name, (way, kind) in ways.items():
        out = way(0)
        error = 0.0
        if kind == "residual":
            error = (out[0].float() - reference[0].float()).abs().max().item()
        results[name] = {"us_per_call": round(time_per_call(way, args.layers), 2), "max_abs_difference": error}
        print(f"  {name:36s} {results[name]['us_per_call']:7.2f} us   max |difference| {error:.4f}")
    print(json.dumps({"rows": rows, "device": torch.cuda.get_device_name(), "results": results}))


if __name__ == "__main__":
    main()
