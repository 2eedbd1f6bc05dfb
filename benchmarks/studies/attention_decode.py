"""One decode-step attention call (one query per row over a masked KV cache).

First three ways of reading grouped KV heads, each called eagerly:

* ``repeat_kv``: keys and values repeated to every query head, then SDPA (transformers' ``"sdpa"``
  path whenever a mask is passed in 5.17; 5.24 packs a single query itself);
* ``transformers``: the installed ``sdpa_attention_forward`` as it is;
* ``grouped``: ``grpo_lightning.rollout.engine.attention.gqa_sdpa_attention_forward`` (no copy of the cache).

Then the ways ``grouped`` can compute the step (``grpo_lightning.rollout.engine.attention.decode_attention``), eager
and compiled (``torch.compile`` of a function of query, keys, values and mask; on CUDA, or with
``--compile``):

* ``sdpa``: PyTorch's choice of SDPA kernel (the default);
* ``sdpa[cudnn]``, ``sdpa[flash] no mask``, ``sdpa[math]``: SDPA restricted to one backend with
  ``sdpa_kernel`` (flash attention takes no mask: it runs without one, a bound on what a kernel
  that reads the cache once can do, not the same attention);
* ``efficient``: the decode kind, SDPA's memory-efficient kernel on CUDA (PyTorch's choice elsewhere);
* ``math``: the decode kind, matmuls around an fp32 softmax;
* ``triton``: the decode kind, one Triton kernel per step (``grpo_lightning.rollout.engine.kernels.decode_attention``; on a
  CPU it computes as ``math``).

A variant that raises, or whose result differs from ``repeat_kv``'s, is skipped with the reason. On
CUDA each variant is timed two ways: ``call`` (a Python call, kernel launches included) and
``graph`` (calls captured in a CUDA graph, as in the engine's decode step, over one KV cache per
layer so that the caches do not stay in L2; the time per call). Microseconds per call are printed
as a table and as one JSON line at the end.

Defaults are W1's shapes on CUDA (Qwen2.5-0.5B: 14 query heads, 2 KV heads, head dim 64, 24 layers;
128 rows, a cache of 320 tokens; bf16) and small fp32 ones on the CPU::

    python benchmarks/studies/attention_decode.py --device cuda
    python benchmarks/studies/attention_decode.py            # CPU, a few seconds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.benchmark import Timer
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from grpo_lightning.rollout.engine.attention import decode_attention, gqa_sdpa_attention_forward

# name: (decode kind, SDPA backend it is restricted to or None, whether the mask is passed)
DECODE_VARIANTS = {
    "sdpa": ("sdpa", None, True),
    "sdpa[cudnn]": ("sdpa", SDPBackend.CUDNN_ATTENTION, True),
    "sdpa[flash] no mask": ("sdpa", SDPBackend.FLASH_ATTENTION, False),
    "sdpa[math]": ("sdpa", SDPBackend.MATH, True),
    "efficient": ("efficient", None, True),
    "math": ("math", None, True),
    "triton": ("triton", None, True),
}


class _Layer(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _repeat_kv_attention(layer, query, key, value, mask):
    key, value = repeat_kv(key, layer.num_key_value_groups), repeat_kv(value, layer.num_key_value_groups)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return out.transpose(1, 2).contiguous()


def _restricted(layer, backend):
    """``gqa_sdpa_attention_forward`` with SDPA restricted to ``backend`` (``None``: unrestricted)."""

    def attend(query, key, value, mask):
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            return gqa_sdpa_attention_forward(layer, query, key, value, mask)[0]

    return attend


def _graph_us(fn, query, caches, mask, replays: int = 20, repeats: int = 5) -> float:
    """Microseconds per call of ``fn`` captured in a CUDA graph, one call per ``(key, value)`` cache."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for key, value in caches:
                fn(query, key, value, mask)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for key, value in caches:
            fn(query, key, value, mask)
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * len(caches)))
    return statistics.median(times)


def _reason(error: Exception) -> str:
    text = str(error).strip()
    inner = re.search(r"got (\w+\(.*)", text)  # Dynamo's report of the error a traced call raised
    return f"{type(error).__name__}: {(inner.group(1) if inner else text.partition(chr(10))[0])[:240]}"


def _time_decode_variants(args, layer, query, caches, mask, expected, unmasked_expected, cuda: bool):
    """``{variant: {mode: {"call": us, "graph": us}}}`` and ``{"variant/mode": reason}``."""
    key, value = caches[0]
    modes = ["eager", "compiled"] if args.compile else ["eager"]
    figures, skipped = {}, {}
    for name, (kind, backend, masked) in DECODE_VARIANTS.items():
        attend = _restricted(layer, backend)
        for mode in modes:
            label = f"{name}/{mode}"
            fn = torch.compile(attend, dynamic=False) if mode == "compiled" else attend
            this_mask = mask if masked else None
            try:
                with decode_attention(kind):
                    out = fn(query, key, value, this_mask)
                    torch.testing.assert_close(out, expected if masked else unmasked_expected, atol=2e-2, rtol=2e-2)
                    names = {"fn": fn, "query": query, "key": key, "value": value, "mask": this_mask}
                    timer = Timer("fn(query, key, value, mask)", globals=names)
                    figures.setdefault(name, {})[mode] = {
                        "call": timer.blocked_autorange(min_run_time=args.min_time).median * 1e6
                    }
                    if cuda:
                        figures[name][mode]["graph"] = _graph_us(fn, query, caches, this_mask)
            except Exception as error:  # noqa: BLE001 - any failure: report it and go on
                skipped[label] = _reason(error)
                print(f"skipped {label}: {skipped[label]}")
            if mode == "compiled":
                torch._dynamo.reset()  # every variant compiles the same function: start each afresh
    return figures, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, help="rows (default 128 on CUDA, 16 on CPU)")
    parser.add_argument("--cache-len", type=int, help="KV cache length (default 320 on CUDA, 128 on CPU)")
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=24, help="KV caches cycled through in the CUDA graph")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="default bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--min-time", type=float, help="seconds of measurement per variant (1 on CUDA, 0.1 on CPU)")
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, help="also time compiled variants (default: on CUDA)"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    batch = args.batch or (128 if cuda else 16)
    cache_len = args.cache_len or (320 if cuda else 128)
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    args.min_time = args.min_time or (1.0 if cuda else 0.1)
    args.compile = cuda if args.compile is None else args.compile
    if cuda:
        torch.cuda.set_device(device)  # the streams, events and graphs of the timings are on it

    torch.manual_seed(0)
    layer = _Layer(args.heads // args.kv_heads)
    query = torch.randn(batch, 1, args.heads, args.head_dim, device=device, dtype=dtype).transpose(1, 2)
    caches = [
        tuple(torch.randn(batch, args.kv_heads, cache_len, args.head_dim, device=device, dtype=dtype) for _ in "kv")
        for _ in range(args.layers if cuda else 1)
    ]
    key, value = caches[0]
    # Left padding of up to a quarter of the cache, and the last quarter not written yet.
    padding = torch.randint(0, cache_len // 4, (batch, 1), device=device)
    slots = torch.arange(cache_len, device=device)
    mask = ((slots >= padding) & (slots < cache_len - cache_len // 4))[:, None, None, :]

    variants = {
        "repeat_kv": lambda: _repeat_kv_attention(layer, query, key, value, mask),
        "transformers": lambda: sdpa_attention_forward(layer, query, key, value, mask)[0],
        "grouped": lambda: gqa_sdpa_attention_forward(layer, query, key, value, mask)[0],
    }
    expected = variants["repeat_kv"]()
    for name, fn in variants.items():
        torch.testing.assert_close(fn(), expected, atol=2e-2, rtol=2e-2, msg=f"{name} differs")

    print(
        f"device {device} ({torch.cuda.get_device_name(device) if cuda else 'cpu'}), {dtype}, batch {batch}, "
        f"heads {args.heads}/{args.kv_heads}, head dim {args.head_dim}, cache {cache_len}, torch {torch.__version__}"
    )
    times = {}
    for name, fn in variants.items():
        fn()  # warm-up
        times[name] = Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=args.min_time).median * 1e3
    for name, ms in times.items():
        print(f"{name:>13}: {ms:8.4f} ms  ({times['repeat_kv'] / ms:5.2f}x vs repeat_kv)")

    unmasked_expected = _repeat_kv_attention(layer, query, key, value, None)
    figures, skipped = _time_decode_variants(args, layer, query, caches, mask, expected, unmasked_expected, cuda)
    modes = ("eager", "compiled") if args.compile else ("eager",)
    columns = [(mode, how) for mode in modes for how in (("call", "graph") if cuda else ("call",))]
    graph_note = f" ('graph': in a CUDA graph over {len(caches)} caches, as in the decode step)" if cuda else ""
    print(f"\nus per call{graph_note}")
    print(f"{'variant':>20} " + " ".join(f"{mode + ' ' + how:>16}" for mode, how in columns))
    for name in DECODE_VARIANTS:
        cells = [figures.get(name, {}).get(mode, {}).get(how) for mode, how in columns]
        print(f"{name:>20} " + " ".join(f"{'-' if us is None else f'{us:.2f}':>16}" for us in cells))
    summary = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "batch": batch,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "cache_len": cache_len,
        "layers": len(caches),
        "ms_per_call": times,
        "us_per_call": figures,
        "skipped": skipped,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    with torch.no_grad():
        main()
