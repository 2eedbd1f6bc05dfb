"""The start of a decode layer (norm, q/k/v product, rotary embedding, cache write), three ways.

* ``product``: the q/k/v product alone (cuBLAS), the part no way can skip;
* ``compiled``: the model's way, ``torch.compile``d: RMS norm, product with bias, rotary embedding of q
  and k, ``index_copy_`` of k and v into the cache;
* ``kernel``: ``grpo_lightning.rollout.engine.kernels.qkv.gained_qkv_rope`` on precomputed ``x * g`` and sums of
  squares (in the decode step ``torch.compile`` computes those inside the previous residual sum);
* ``kernel + inputs``: the same with ``gain_inputs`` compiled in front of it, as a separate kernel.

Each is captured in a CUDA graph over one weight matrix and cache per layer (24 at W1's shapes), so
that the weights do not stay in L2, and timed per call. Every way's q, k and v are checked against
``compiled``'s. Prints a table and one JSON line::

    python benchmarks/studies/qkv_kernel.py            # W1's shapes, bf16, on CUDA
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn import functional as F
from transformers.models.qwen2.modeling_qwen2 import rotate_half


def rms_norm(x, gain, eps):
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return gain * normed.to(x.dtype)


def time_per_call(step, layers: int, repeats: int = 50) -> float:
    """Microseconds per call of ``step(layer)`` in a CUDA graph of all layers."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for layer in range(layers):
                step(layer)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(layers):
            step(layer)
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats / layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--q-heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--cache-len", type=int, default=320)
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    from grpo_lightning.rollout.engine.kernels import qkv as qkv_kernel

    rows, hidden, q_heads, kv_heads, head_dim = args.rows, args.hidden, args.q_heads, args.kv_heads, args.head_dim
    sizes = [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    eps, position = 1e-6, torch.tensor([args.cache_len // 2], device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=generator) * scale).to(torch.bfloat16)

    x = randn(rows, hidden)
    gains = randn(args.layers, hidden).abs() + 0.5
    weights = randn(args.layers, sum(sizes), hidden, scale=hidden**-0.5)
    biases = randn(args.layers, sum(sizes), scale=0.1)
    caches = [torch.zeros(args.layers, rows, kv_heads, args.cache_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    angles = torch.randn(rows, head_dim // 2, device="cuda", generator=generator) * 3
    cos, sin = torch.cat([angles.cos()] * 2, -1).bfloat16(), torch.cat([angles.sin()] * 2, -1).bfloat16()

    @torch.compile(dynamic=False)
    def compiled(x, gain, weight, bias, keys, values):
        q, k, v = F.linear(rms_norm(x, gain, eps), weight, bias).split(sizes, dim=-1)
        q, k, v = q.view(rows, -1, head_dim), k.view(rows, -1, head_dim), v.view(rows, -1, head_dim)
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        keys.index_copy_(2, position, k.unsqueeze(2))
        values.index_copy_(2, position, v.unsqueeze(2))
        return q

    gain_inputs = torch.compile(qkv_kernel.gain_inputs, dynamic=False)
    inputs = [qkv_kernel.gain_inputs(x, gains[layer]) for layer in range(args.layers)]

    def kernel(layer, gained, squares):
        return qkv_kernel.gained_qkv_rope(
            gained, squares, eps, weights[layer], biases[layer], cos, sin, caches[0][layer], caches[1][layer], position, q_heads
        )

    ways = {
        "product": lambda layer: F.linear(x, weights[layer], biases[layer]),
        "compiled": lambda layer: compiled(x, gains[layer], weights[layer], biases[layer], caches[0][layer], caches[1][layer]),
        "kernel": lambda layer: kernel(layer, *inputs[layer]),
        "kernel + inputs": lambda layer: kernel(layer, *gain_inputs(x, gains[layer])),
    }
    expected = ways["compiled"](0).float(), caches[0][0, :, :, position[0]].float(), caches[1][0, :, :, position[0]].float()
    results = {}
    for name, way in ways.items():
        error = None
        if name.startswith("kernel"):
            for cache in caches:
                cache.zero_()
            q = way(0).float()
            got = q, caches[0][0, :, :, position[0]].float(), caches[1][0, :, :, position[0]].float()
            error = max((a - b).abs().max().item() for a, b in zip(got, expected))
        results[name] = {"us_per_call": round(time_per_call(way, args.layers), 2), "max_abs_error": error}
    print(f"{rows} rows, hidden {hidden}, {q_heads} q and {kv_heads} KV heads of {head_dim}, bf16, {torch.cuda.get_device_name()}")
    for name, result in results.items():
        error = "" if result["max_abs_error"] is None else f"  (max abs difference from compiled: {result['max_abs_error']:.3g})"
        print(f"  {name:16s} {result['us_per_call']:7.2f} us{error}")
    best = getattr(qkv_kernel._qkv_tuned, "best_config", None)
    print(f"  the kernel's tuned configuration: {best}")
    print(json.dumps({"shape": vars(args), "device": torch.cuda.get_device_name(), "results": results, "config": str(best)}))


if __name__ == "__main__":
    main()
