"""A decode layer's attention and products with the products' weights prefetched into L2, or not.

    python benchmarks/studies/l2_prefetch.py [--rows 128] [--slots 320]

One decode layer at W1's shapes after its q/k/v step: the attention kernel over the layer's cache,
the o product and residual sum, gate/up, SiLU, and the down product with its residual sum (in 2
fp32 parts, as the engine computes it). Each layer has its own weights and cache, 24 of them, so
that nothing stays in L2 from one layer to the next, captured in one CUDA graph and timed per
layer. The ways:

* ``none``: as the engine runs it;
* ``lines`` / ``bulk``: a kernel in front of the attention asks L2 to fetch the layer's o, gate/up
  and down weights (one ``prefetch.global.L2::evict_last`` hint per 128-byte line, or
  ``cp.async.bulk.prefetch.L2`` hints of 16 KiB: sm_90), on the layer's stream or on a stream of
  its own;
* ``warm``: every layer reads layer 0's weights and cache (an upper bound: they stay in L2).

Each way's output is checked against ``none``'s. On an H100 (``benchmarks/RESULTS.md``) ``warm`` was
no faster than ``none``: the layer is bound by its kernels' latency, not by reading its weights, so
the prefetches only added their own cost.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from qkv_kernel import time_per_call  # benchmarks/studies/qkv_kernel.py, beside this file
from torch.nn import functional as F

from grpo_lightning.rollout.engine.kernels.decode_attention import decode_attention
from grpo_lightning.rollout.engine.fused_decode import residual_plus_parts

LINE_BYTES = 128
"""Bytes per L2 line: one ``prefetch.global.L2`` hint each."""
BULK_BYTES = 16384
"""Bytes per ``cp.async.bulk.prefetch.L2`` hint (a multiple of 16)."""


@triton.jit
def _prefetch_kernel(ptr, nbytes, BULK: tl.constexpr, STEP: tl.constexpr, BLOCK: tl.constexpr):
    """Each program asks L2 to fetch its share of the bytes ``[ptr, ptr + nbytes)``: hints only, no
    data reaches the program, so it ends as soon as they are issued. ``STEP``: bytes per hint."""
    base = ptr.to(tl.pointer_type(tl.int8), bitcast=True)
    pieces = tl.cdiv(nbytes, STEP)
    share = tl.cdiv(pieces, tl.num_programs(0))
    first = tl.program_id(0) * share
    for start in range(0, share, BLOCK):
        index = first + start + tl.arange(0, BLOCK)
        offset = index.to(tl.int64) * STEP
        wanted = ((start + tl.arange(0, BLOCK)) < share) & (index < pieces)
        if BULK:
            size = tl.minimum(nbytes - offset, STEP).to(tl.int32) // 16 * 16
            wanted = wanted & (size >= 16)
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r,r", [base + offset, size, wanted.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
            )  # fmt: skip
        else:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [base + offset, wanted.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
            )  # fmt: skip


def prefetch(tensor: torch.Tensor, programs: int, bulk: bool) -> None:
    """Ask L2 to fetch ``tensor``'s bytes, in a kernel of ``programs`` programs."""
    nbytes, step = tensor.numel() * tensor.element_size(), BULK_BYTES if bulk else LINE_BYTES
    _prefetch_kernel[(programs,)](tensor, nbytes, BULK=bulk, STEP=step, BLOCK=128, num_warps=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--q-heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=320)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--programs", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    torch.manual_seed(0)
    rows, hidden, inter, layers = args.rows, args.hidden, args.intermediate, args.layers
    head_dim = hidden // args.q_heads
    group = args.q_heads // args.kv_heads

    def weights(*shape: int) -> torch.Tensor:
        return (torch.randn(layers, *shape, device="cuda") * shape[-1] ** -0.5).bfloat16()

    o, gate_up, down = weights(hidden, hidden), weights(2 * inter, hidden), weights(hidden, inter)
    keys = torch.randn(layers, rows, args.kv_heads, args.slots, head_dim, device="cuda").bfloat16()
    values = torch.randn_like(keys)
    query = torch.randn(rows, args.kv_heads, group, head_dim, device="cuda").bfloat16()
    h = torch.randn(rows, hidden, device="cuda").bfloat16()
    out = torch.empty_like(h)
    scale = head_dim**-0.5
    print(
        f"{rows} rows, hidden {hidden}, MLP {inter}, {args.slots} cache slots, {layers} layers; "
        f"o + gate/up + down weights {sum(w[0].numel() * 2 for w in (o, gate_up, down)) / 1e6:.1f} MB "
        f"per layer; {torch.cuda.get_device_name()}, torch {torch.__version__}"
    )

    def layer_rest(index: int) -> None:
        attended = decode_attention(query, keys[index], values[index], None, scale)
        h1 = h + F.linear(attended.reshape(rows, hidden), o[index])
        gate, up = F.linear(h1, gate_up[index]).chunk(2, dim=-1)
        out.copy_(residual_plus_parts(h1, F.silu(gate) * up, down[index], None, 2))

    def prefetch_layer(index: int, programs: int, bulk: bool) -> None:
        for tensor in (o[index], gate_up[index], down[index]):
            prefetch(tensor, programs, bulk)

    def prefetched(programs: int, bulk: bool):
        def step(index: int) -> None:
            prefetch_layer(index, programs, bulk)
            layer_rest(index)

        return step

    side = torch.cuda.Stream()

    def beside(programs: int, bulk: bool):
        """The prefetch kernel on a stream of its own, forked at the layer's start."""

        def step(index: int) -> None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                prefetch_layer(index, programs, bulk)
            layer_rest(index)
            torch.cuda.current_stream().wait_stream(side)

        return step

    ways = {"none": layer_rest, "warm": lambda index: layer_rest(0)}
    for programs in args.programs:
        for bulk in (False, True):
            kind = "bulk" if bulk else "lines"
            ways[f"{kind}, {programs} programs"] = prefetched(programs, bulk)
            ways[f"{kind}, {programs} programs, side stream"] = beside(programs, bulk)
    layer_rest(3)
    reference = out.clone()
    results = {}
    for name, way in ways.items():
        way(3)
        error = (out.float() - reference.float()).abs().max().item() if name != "warm" else 0.0
        results[name] = {"us_per_layer": round(time_per_call(way, layers), 2), "max_abs_difference": error}
        print(f"  {name:36s} {results[name]['us_per_layer']:7.2f} us per layer   max |difference| {error:.4f}")
    print(json.dumps({"rows": rows, "device": torch.cuda.get_device_name(), "results": results}))


if __name__ == "__main__":
    main()
