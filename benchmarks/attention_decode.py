"""One decode-step attention call (one query per row over a masked KV cache), three ways:

* ``repeat_kv``: keys and values repeated to every query head, then SDPA (transformers' ``"sdpa"``
  path whenever a mask is passed in 5.17; 5.24 packs a single query itself);
* ``transformers``: the installed ``sdpa_attention_forward`` as it is;
* ``grouped``: ``grpo_lightning.attention.gqa_sdpa_attention_forward`` (no copy of the cache).

Defaults are W1's shapes on CUDA (Qwen2.5-0.5B: 14 query heads, 2 KV heads, head dim 64; 128 rows,
a cache of 320 tokens; bf16) and small fp32 ones on the CPU::

    python benchmarks/attention_decode.py --device cuda
    python benchmarks/attention_decode.py            # CPU, a few seconds
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.benchmark import Timer
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from grpo_lightning.attention import gqa_sdpa_attention_forward


class _Layer(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _repeat_kv_attention(layer, query, key, value, mask):
    key, value = repeat_kv(key, layer.num_key_value_groups), repeat_kv(value, layer.num_key_value_groups)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return out.transpose(1, 2).contiguous()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, help="rows (default 128 on CUDA, 16 on CPU)")
    parser.add_argument("--cache-len", type=int, help="KV cache length (default 320 on CUDA, 128 on CPU)")
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="default bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of measurement per variant")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    batch = args.batch or (128 if cuda else 16)
    cache_len = args.cache_len or (320 if cuda else 128)
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))

    torch.manual_seed(0)
    layer = _Layer(args.heads // args.kv_heads)
    query = torch.randn(batch, 1, args.heads, args.head_dim, device=device, dtype=dtype).transpose(1, 2)
    key = torch.randn(batch, args.kv_heads, cache_len, args.head_dim, device=device, dtype=dtype)
    value = torch.randn_like(key)
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
        f"heads {args.heads}/{args.kv_heads}, head dim {args.head_dim}, cache {cache_len}"
    )
    times = {}
    for name, fn in variants.items():
        fn()  # warm-up
        times[name] = Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=args.min_time).median * 1e3
    for name, ms in times.items():
        print(f"{name:>13}: {ms:8.4f} ms  ({times['repeat_kv'] / ms:5.2f}x vs repeat_kv)")


if __name__ == "__main__":
    with torch.no_grad():
        main()
