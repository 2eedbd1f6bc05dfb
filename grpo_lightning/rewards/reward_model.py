"""Reward function backed by a sequence-classification reward model."""

from __future__ import annotations

from typing import Any

import torch

from grpo_lightning.rewards.scoring import completion_text

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RewardModel:
    """Scores ``prompt + completion`` with ``AutoModelForSequenceClassification`` (the logit of label 0).

    Nothing is loaded until the first call. Texts longer than ``max_length`` tokens are cut from the
    left so the end of the completion is always scored. A prompt of chat messages is rendered with
    the tokenizer's chat template, the completion as the assistant's reply (the template's own special
    tokens, none added again); without a template, each message's content on a line of its own.

    Args:
        path: Local directory or hub name of the reward model and its tokenizer.
        batch_size: Texts scored per forward pass.
        max_length: Longest tokenized text scored.
        device: Torch device; ``None`` picks CUDA when available, else CPU.
        dtype: One of ``float32``, ``bfloat16``, ``float16``.
        name: Name under which the rewards are logged.
    """

    def __init__(
        self,
        path: str,
        batch_size: int = 16,
        max_length: int = 1024,
        device: str | None = None,
        dtype: str = "float32",
        name: str = "reward_model",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"RewardModel batch_size={batch_size} must be at least 1.")
        if max_length < 1:
            raise ValueError(f"RewardModel max_length={max_length} must be at least 1.")
        if dtype not in DTYPES:
            raise ValueError(f"RewardModel dtype={dtype!r} is not supported; use one of {sorted(DTYPES)}.")
        self.path = path
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.dtype = dtype
        self.__name__ = name
        self.model: Any = None
        self.tokenizer: Any = None

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        if self.model is None:
            self._load()
        rendered = [self._render(prompt, completion) for prompt, completion in zip(prompts, completions)]
        scores: list[float] = []
        for start in range(0, len(rendered), self.batch_size):
            scores.extend(self._score(rendered[start : start + self.batch_size]))
        return scores

    def _load(self) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer = AutoTokenizer.from_pretrained(self.path)
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise ValueError(
                    f"the tokenizer at RewardModel path={self.path!r} has neither a pad nor an EOS token; "
                    "add a pad_token to its tokenizer_config.json."
                )
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"
        tokenizer.truncation_side = "left"
        model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype=DTYPES[self.dtype])
        model.config.pad_token_id = tokenizer.pad_token_id
        self.tokenizer, self.model = tokenizer, model.to(device).eval()

    def _render(self, prompt: Any, completion: Any) -> tuple[str, bool]:
        """The text scored, and whether a chat template wrote it (its special tokens are in it then).
        A rollout's completion is text; after a prompt of messages it is the assistant's reply."""
        if not isinstance(prompt, list):
            return completion_text(prompt) + completion_text(completion), False
        reply = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion_text(completion)}]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(prompt + reply, tokenize=False), True
        return "\n".join(completion_text(message) for message in prompt + reply), False

    @torch.no_grad()
    def _score(self, rendered: list[tuple[str, bool]]) -> list[float]:
        texts = [text for text, _ in rendered]
        encoded = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt",
            add_special_tokens=not any(templated for _, templated in rendered),
        )
        empty = (encoded["attention_mask"].sum(dim=1) == 0).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"the tokenizer at RewardModel path={self.path!r} ({type(self.tokenizer).__name__}) turned text "
                f"{texts[empty[0]][:80]!r} into no tokens; check that AutoTokenizer loads the tokenizer the "
                "reward model was trained with (tokenizer_class in tokenizer_config.json)."
            )
        encoded = {key: value.to(self.model.device) for key, value in encoded.items()}
        logits = self.model(**encoded).logits
        return logits[:, 0].float().cpu().tolist()

