"""The decode attention kernel's launch settings compared: cache slots per loop step, warps, pipeline
stages and cache splits (``grpo_lightning.rollout.engine.kernels.decode_attention.launch_decode_attention``).

Every setting is timed on W1's shapes (128 rows, 14 query heads over 2 KV heads of dimension 64, a
cache of 320 slots, bf16), in a CUDA graph over 24 caches as in the decode step, with the mask of a
cache in use (the last quarter of the slots not written yet); its result is checked against the
default settings'. The fastest few and the default are then timed on the other shapes given. Prints
a table and one JSON line::

    python benchmarks/studies/decode_attention_configs.py [--shapes 128x320,256x1024,32x4096]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from qkv_kernel import time_per_call  # noqa: E402

from grpo_lightning.rollout.engine.kernels import decode_attention as decode_kernel  # noqa: E402

DEFAULT = (decode_kernel.BLOCK_L, decode_kernel.DECODE_NUM_WARPS, decode_kernel.DECODE_NUM_STAGES, 0)


def _inputs(rows: int, cache_len: int, heads: int, kv_heads: int, head_dim: int, layers: int):
    query = torch.randn(rows, kv_heads, heads // kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    caches = [
        tuple(torch.randn(rows, kv_heads, cache_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in "kv")
        for _ in range(layers)
    ]
    written = torch.arange(cache_len, device="cuda") < cache_len - cache_len // 4
    mask = written.expand(rows, cache_len)[:, None, None, :]
    return query, caches, mask


def time_setting(setting, query, caches, mask, expected) -> float:
    """Microseconds per call of the kernel launched with ``setting``, after checking its result."""
    block, warps, stages, splits = setting
    scale = query.shape[-1] ** -0.5

    def call(layer: int):
        key, value = caches[layer]
        return decode_kernel.launch_decode_attention(query, key, value, mask, scale, splits, block, warps, stages)

    torch.testing.assert_close(call(0), expected, atol=2e-2, rtol=2e-2)
    return time_per_call(call, len(caches))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="256x1024,32x4096", help="rows x cache length, for the fastest settings")
    parser.add_argument("--blocks", default="32,64,128,256")
    parser.add_argument("--warps", default="2,4,8")
    parser.add_argument("--stages", default="1,2,3,4")
    parser.add_argument("--splits", default="1,2", help="cache splits tried at W1's shape (0: the kernel's choice)")
    parser.add_argument("--top", type=int, default=5, help="settings timed on the other shapes")
    args = parser.parse_args()
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    heads, kv_heads, head_dim, layers = 14, 2, 64, 24
    torch.manual_seed(0)

    def sweep(rows: int, cache_len: int, settings) -> dict:
        query, caches, mask = _inputs(rows, cache_len, heads, kv_heads, head_dim, layers)
        key, value = caches[0]
        expected = decode_kernel.launch_decode_attention(query, key, value, mask, head_dim**-0.5)
        figures = {}
        for setting in settings:
            try:
                figures[setting] = time_setting(setting, query, caches, mask, expected)
            except Exception as error:  # noqa: BLE001 - a setting Triton cannot build: report it and go on
                print(f"{rows}x{cache_len} {setting}: skipped ({type(error).__name__}: {str(error)[:120]})")
        return figures

    settings = [DEFAULT] + list(itertools.product(ints(args.blocks), ints(args.warps), ints(args.stages), ints(args.splits)))
    results = {"128x320": sweep(128, 320, settings)}
    ranked = sorted(results["128x320"], key=results["128x320"].get)
    print(f"decode attention, 128 rows x 320 slots, {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'block':>6} {'warps':>6} {'stages':>7} {'splits':>7} {'us':>8}")
    for setting in ranked:
        marker = "  (default)" if setting == DEFAULT else ""
        print(" ".join(f"{v:>{w}}" for v, w in zip(setting, (6, 6, 7, 7))) + f" {results['128x320'][setting]:8.2f}{marker}")
    best = [DEFAULT] + [s for s in ranked if s != DEFAULT][: args.top]
    for shape in args.shapes.split(","):
        if not shape:
            continue
        rows, cache_len = (int(x) for x in shape.split("x"))
        # A split count fixed for 128 x 320 is not the kernel's choice elsewhere: let it choose.
        figures = sweep(rows, cache_len, list(dict.fromkeys((b, w, s, 0) for b, w, s, _ in best)))
        results[shape] = figures
        print(f"\n{shape}: " + ", ".join(f"{setting[:3]} {us:.2f} us" for setting, us in sorted(figures.items(), key=lambda kv: kv[1])))
    print(json.dumps({
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "default": DEFAULT,
        "us": {shape: {"/".join(map(str, s)): us for s, us in figures.items()} for shape, figures in results.items()},
    }))  # fmt: skip


if __name__ == "__main__":
    with torch.no_grad():
        main()
