"""One update micro-batch's forward and backward pass, padded against packed without padding.

``grpo_lightning.models.logprobs.completion_logprobs`` on a batch whose prompts are left-padded and whose
completions end early (an EOS, then padding), as real rollouts do: once as the padded
``[rows, prompt + completion]`` batch, once packed (``packed=True``: every row's real tokens in one
sequence, positions restarting at 0), the same log-probs either way. The workload's model shape
(random weights, ``benchmarks/run.py``'s files), its rows per micro-batch and lengths; each row
keeps a uniform random fraction in ``[--min-fill, 1]`` of its prompt and of its completion::

    python benchmarks/studies/padding_free.py --workload W0                  # CPU, seconds
    python benchmarks/studies/padding_free.py --workload W1 --attn sdpa      # one GPU
    python benchmarks/studies/padding_free.py --workload W1 --attn flex_attention

Prints milliseconds per pass for each and their ratio. Under ``sdpa`` the packed rows are kept
apart by a dense mask over the whole packed sequence (attention grows with its squared length);
``flex_attention`` and ``flash_attention_2`` attend within each row only.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("benchmarks_run", Path(__file__).resolve().parents[1] / "run.py")
bench = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

from grpo_lightning.models.logprobs import completion_logprobs  # noqa: E402


def ragged_batch(rows: int, prompt_len: int, completion_len: int, vocab: int, min_fill: float, device: torch.device):
    """Left-padded prompts and early-ending completions; each row keeps a random fraction of each."""
    generator = torch.Generator().manual_seed(0)

    def lengths(full: int) -> torch.Tensor:
        fill = min_fill + (1 - min_fill) * torch.rand(rows, generator=generator)
        return (fill * full).ceil().clamp(1, full).long()

    slots = torch.arange(prompt_len)
    prompt_mask = (slots >= prompt_len - lengths(prompt_len)[:, None]).long()
    completion_mask = (torch.arange(completion_len) < lengths(completion_len)[:, None]).long()
    prompt_ids = torch.randint(0, vocab, (rows, prompt_len), generator=generator)
    completion_ids = torch.randint(0, vocab, (rows, completion_len), generator=generator)
    return [t.to(device) for t in (prompt_ids, prompt_mask, completion_ids, completion_mask)]


def milliseconds(step, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats + 1):  # the first one warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W0", choices=sorted(bench.WORKLOADS))
    parser.add_argument("--attn", default="sdpa", help="the model's attn_implementation")
    parser.add_argument("--min-fill", type=float, default=0.25, help="smallest fraction of a prompt or completion kept")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--fused-lm-head", action="store_true", help="run the LM head inside the log-softmax")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    workload = bench.WORKLOADS[args.workload]
    dtype = getattr(torch, workload.dtype) if device.type == "cuda" else torch.float32
    with tempfile.TemporaryDirectory() as workdir:
        paths = bench.build_workdir(Path(workdir), dataclasses.replace(workload), rows=1, seed=0)
        model = AutoModelForCausalLM.from_pretrained(paths["model"], dtype=dtype, attn_implementation=args.attn)
    model = model.to(device).train()
    batch = ragged_batch(
        workload.micro_batch_size, workload.prompt_tokens, workload.max_new_tokens, workload.vocab_size, args.min_fill, device
    )
    real = int(batch[1].sum() + batch[3].sum())
    padded_tokens = batch[1].numel() + batch[3].numel()

    def step(packed: bool):
        def run() -> None:
            logp, _ = completion_logprobs(model, *batch, fused_head=args.fused_lm_head, packed=packed)
            logp.sum().backward()
            model.zero_grad(set_to_none=True)

        return run

    with torch.no_grad():
        padded_logp, _ = completion_logprobs(model, *batch, fused_head=args.fused_lm_head)
        packed_logp, _ = completion_logprobs(model, *batch, fused_head=args.fused_lm_head, packed=True)
    difference = float((padded_logp - packed_logp).abs().max())
    result = {
        "padded_ms": milliseconds(step(False), args.repeats, device),
        "packed_ms": milliseconds(step(True), args.repeats, device),
        "real_tokens": real,
        "padded_tokens": padded_tokens,
        "max_abs_logp_difference": difference,
    }
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.workload} ({name}, {dtype}, attn {args.attn}): {workload.micro_batch_size} rows, "
          f"{real} real of {padded_tokens} tokens ({real / padded_tokens:.0%})")  # fmt: skip
    print(f"forward + backward: padded {result['padded_ms']:.2f} ms, packed {result['packed_ms']:.2f} ms "
          f"({result['padded_ms'] / result['packed_ms']:.2f}x); max |logp difference| {difference:.2e}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
