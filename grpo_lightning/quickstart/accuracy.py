"""Accuracy and answer format of a saved model's completions on the arithmetic task, greedy or sampled."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

_ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_STRICT_FORMAT = re.compile(r"<answer>\d+</answer>")


def _extract_answer(completion: str) -> str | None:
    match = _ANSWER_PATTERN.search(completion)
    return match.group(1) if match else None


@torch.no_grad()
def generation_metrics(
    model_dir: str | Path,
    dataset: Dataset,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    num_samples: int | None = None,
    batch_size: int = 128,
    seed: int = 0,
) -> dict[str, float]:
    """``accuracy`` and ``format_rate`` (exactly ``<answer>digits</answer>`` then EOS) on ``dataset``.

    Decodes greedily when ``temperature == 0``, else samples at that temperature (no top-k/top-p).
    ``num_samples`` limits evaluation to the first rows.
    """
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    if num_samples is not None:
        dataset = dataset.select(range(min(num_samples, len(dataset))))
    sample = temperature > 0
    options = dict(do_sample=False)
    if sample:
        options = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    correct = formatted = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(dataset), batch_size):
            rows = dataset[start : start + batch_size]
            batch = tokenizer(rows["prompt"], return_tensors="pt", padding=True, add_special_tokens=False)
            output = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **options,
            )
            for ids, answer in zip(output[:, batch["input_ids"].shape[1] :].tolist(), rows["answer"]):
                ended = tokenizer.eos_token_id in ids
                text = tokenizer.decode(ids[: ids.index(tokenizer.eos_token_id)] if ended else ids)
                correct += _extract_answer(text) == answer
                formatted += ended and _STRICT_FORMAT.fullmatch(text) is not None
    total = max(1, len(dataset))
    return {"accuracy": correct / total, "format_rate": formatted / total}


def greedy_accuracy(
    model_dir: str | Path,
    dataset: Dataset,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    num_samples: int | None = None,
) -> float:
    """Fraction of rows whose text inside ``<answer>...</answer>`` equals the ``answer`` column."""
    metrics = generation_metrics(
        model_dir, dataset, max_new_tokens=max_new_tokens, temperature=temperature, num_samples=num_samples
    )
    return metrics["accuracy"]
