"""The draw of one decode step over ``[rows, vocabulary]`` logits: PyTorch compiled against the Triton kernels.

* ``race``: the engine's PyTorch draw on CUDA, ``torch.compile``d: fp32 logits with EOS masked, then
  the exponential race ``argmax(logits - log E)`` (``engine.sample_tokens``);
* ``race + log-prob``: the same, and the sampled token's log-probability (a ``logsumexp``);
* ``keyed``: inverse-CDF sampling of keyed uniforms (``engine.inverse_cdf_sample``), compiled;
* ``kernel``: ``grpo_lightning.rollout.engine.kernels.sampling.sample_by_blocks`` with one ``torch.rand`` number per
  row, at each block size of ``--blocks`` (the module's ``SAMPLING_BLOCK`` is the default), with
  and without the log-probability.

Each is captured in a CUDA graph and timed per call, on bf16 logits as the LM head writes them
(W1's shape by default). The kernels' keyed tokens are checked against ``keyed``'s. Prints a table
and one JSON line::

    python benchmarks/studies/sampling.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from qkv_kernel import time_per_call  # noqa: E402

from grpo_lightning.rollout.engine.kernels import sampling as sampling_kernel  # noqa: E402
from grpo_lightning.rollout.engine import inverse_cdf_sample, keyed_uniforms, sample_tokens  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--blocks", default="1024,2048,4096,8192", help="block sizes of the kernel to time")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    torch.manual_seed(0)
    rows, vocab = args.rows, args.vocab
    logits = (torch.randn(rows, vocab, device="cuda") * 2).bfloat16()
    banned = torch.zeros(vocab, dtype=torch.bool, device="cuda")
    banned[vocab - 1] = True  # EOS, blocked as before min_new_tokens
    blocked = torch.ones((), dtype=torch.bool, device="cuda")
    keys = torch.arange(rows, device="cuda") * 7919 + 11
    step = torch.zeros(1, dtype=torch.long, device="cuda")

    def race(with_logprob: bool):
        fp32 = logits.float()
        token = sample_tokens(fp32.masked_fill(banned & blocked, float("-inf")), 1.0)
        if with_logprob:
            return token, fp32.gather(1, token[:, None]).squeeze(1) - fp32.logsumexp(-1)
        return token

    def keyed():
        probs = logits.float().masked_fill(banned & blocked, float("-inf")).softmax(-1)
        return inverse_cdf_sample(probs, keyed_uniforms(keys, step))

    def kernel(with_logprob: bool, uniforms=None):
        uniforms = torch.rand(rows, device="cuda") if uniforms is None else uniforms
        return sampling_kernel.sample_by_blocks(logits, uniforms, 1.0, banned, blocked, with_logprob)

    figures: dict[str, float] = {}
    compiled_race = torch.compile(race, dynamic=False)
    figures["race"] = time_per_call(lambda _: compiled_race(False), 1, args.repeats)
    figures["race + log-prob"] = time_per_call(lambda _: compiled_race(True), 1, args.repeats)
    compiled_keyed = torch.compile(keyed, dynamic=False)
    figures["keyed"] = time_per_call(lambda _: compiled_keyed(), 1, args.repeats)
    expected = compiled_keyed()
    default_block = sampling_kernel.SAMPLING_BLOCK
    mismatches = {}
    try:
        for block in (int(b) for b in args.blocks.split(",")):
            sampling_kernel.SAMPLING_BLOCK = block
            figures[f"kernel, block {block}"] = time_per_call(lambda _: kernel(False), 1, args.repeats)
            figures[f"kernel + log-prob, block {block}"] = time_per_call(lambda _: kernel(True), 1, args.repeats)
            tokens, _ = kernel(False, keyed_uniforms(keys, step))
            mismatches[block] = int((tokens != expected).sum())
    finally:
        sampling_kernel.SAMPLING_BLOCK = default_block
    for name, us in figures.items():
        print(f"{name:>30}: {us:7.1f} us per call in a CUDA graph ({figures['race'] / us:.2f}x race)")
    print(f"keyed tokens that differ from the compiled inverse-CDF draw, per block size: {mismatches}")
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows, "vocab": vocab,
        "default_block": default_block, "us": figures, "keyed_mismatches": mismatches,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
