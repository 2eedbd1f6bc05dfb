"""Where a LoRA update's time goes: one W3 micro-batch's forward and backward, in four settings.

W3's model shape (Qwen2.5-7B widths, ``--layers`` of its 28 decoder layers, random weights) with
LoRA r 64 on every linear layer, added by ``grpo_lightning.models.lora.add_adapters`` as the module does.
PEFT keeps the adapters in float32 next to bf16 base weights, so by default their products run in
float32; the module runs them under ``adapter_autocast`` (bf16 products, float32 adapters). Each
setting times the policy's forward and backward through ``completion_logprobs`` (the update) and
the adapters-off forward without gradients (the reference pass)::

    python benchmarks/studies/lora_update.py --layers 4            # one GPU, about a minute

Settings: ``fp32 adapters`` (PEFT's default), ``tf32`` (the same with TF32 matrix products),
``bf16 autocast`` (``adapter_autocast``: the adapters' products in bf16, float32 master weights),
and ``micro-batch 16 checkpointed`` (gradient checkpointing, four times the rows). Prints
milliseconds per row of each, and the profiler's top kernels of the first setting.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from grpo_lightning.models.logprobs import completion_logprobs
from grpo_lightning.models.lora import adapter_autocast, add_adapters, reference_model


def w3_model(layers: int) -> torch.nn.Module:
    config = Qwen2Config(
        vocab_size=152064, hidden_size=3584, num_hidden_layers=layers, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=False,
    )
    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def batch(rows: int, prompt: int, completion: int, vocab: int):
    ids = torch.randint(0, vocab, (rows, prompt + completion), device="cuda")
    ones = torch.ones_like(ids)
    return ids[:, :prompt], ones[:, :prompt], ids[:, prompt:], ones[:, prompt:]


def timed(step, repeats: int) -> float:
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4, help="rows per micro-batch (W3's runs: 4)")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    policy = add_adapters(w3_model(args.layers), {"r": 64, "lora_alpha": 128, "lora_dropout": 0.0,
                                                  "target_modules": "all-linear"}, gradient_checkpointing=True)
    dtypes = {p.dtype for n, p in policy.named_parameters() if p.requires_grad}
    print(f"W3 shape, {args.layers} layers, LoRA r 64 all-linear; trainable dtypes {dtypes}; "
          f"{args.rows} rows x ({args.prompt} + {args.completion}) tokens per micro-batch")

    def update(rows: int, autocast: bool = False):
        inputs = batch(rows, args.prompt, args.completion, 152064)

        def step():
            context = adapter_autocast(policy) if autocast else contextlib.nullcontext()
            with context:
                logp, entropy = completion_logprobs(policy, *inputs, with_entropy=True)
            (logp.mean() + 0 * entropy.mean()).backward()
        return step

    def reference(rows: int):
        inputs = batch(rows, args.prompt, args.completion, 152064)

        @torch.no_grad()
        def step():
            with reference_model(policy, None) as model:
                completion_logprobs(model, *inputs, with_entropy=False)
        return step

    results = {}
    policy.train()
    results["reference pass (adapters off, no grad)"] = timed(reference(args.rows), args.repeats) / args.rows
    results["fp32 adapters (PEFT default)"] = timed(update(args.rows), args.repeats) / args.rows
    torch.backends.cuda.matmul.allow_tf32 = True
    results["tf32"] = timed(update(args.rows), args.repeats) / args.rows
    torch.backends.cuda.matmul.allow_tf32 = False
    results["bf16 autocast (adapter_autocast)"] = timed(update(args.rows, autocast=True), args.repeats) / args.rows
    policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    results["micro-batch 16 checkpointed"] = timed(update(16), args.repeats) / 16
    results["micro-batch 16 checkpointed, bf16 autocast"] = timed(update(16, autocast=True), args.repeats) / 16
    policy.gradient_checkpointing_disable()
    for name, ms in results.items():
        print(f"{name:50s} {ms:8.2f} ms/row   x{results['fp32 adapters (PEFT default)'] / ms:5.2f}")
    print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")

    step = update(args.rows)
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        step()
        torch.cuda.synchronize()
    print(profile.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    main()
