"""The supervised pass the warm starts share: the tiny model's shape and optimiser settings, and its training steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedTokenizerBase

from grpo_lightning.progress import step_progress
from grpo_lightning.quickstart.cached_build import reproducible_cpu
from grpo_lightning.quickstart.tiny import tiny_config

#: How a warm start's training steps are labelled on stderr.
PROGRESS_LABEL = "warm start"


@dataclass(frozen=True)
class SupervisedSettings:
    """The fields every warm start's settings have: the optimiser's and the tiny model's shape."""

    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    seed: int = 0
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 64

    def model_config(self, tokenizer: PreTrainedTokenizerBase, **options: Any) -> PretrainedConfig:
        """The tiny model of this shape for ``tokenizer`` (``options``: more of :func:`tiny_config`'s)."""
        return tiny_config(
            tokenizer,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            **options,
        )


def train_steps(
    settings: SupervisedSettings,
    config: PretrainedConfig,
    steps: int,
    batch: Callable[[torch.Generator], dict[str, torch.Tensor]],
    after_step: Callable[[int, float, torch.nn.Module], bool],
) -> tuple[torch.nn.Module, bool]:
    """Fit a fresh model of ``config`` for at most ``steps`` AdamW steps, on one reproducible CPU thread.

    ``batch(generator)`` gives each step's model inputs (with ``labels``), drawn from a generator
    seeded with ``settings.seed``; see :func:`fit_steps` for the schedule and ``after_step``.
    Returns the model in eval mode, and whether ``after_step`` stopped it.
    """
    with torch.random.fork_rng(devices=[]), reproducible_cpu():
        torch.manual_seed(settings.seed)
        model = AutoModelForCausalLM.from_config(config)
        generator = torch.Generator().manual_seed(settings.seed)
        stopped = fit_steps(model, settings, steps, lambda: batch(generator), after_step)
    return model, stopped


def fit_steps(
    model: torch.nn.Module,
    settings: Any,
    steps: int,
    next_batch: Callable[[], dict[str, torch.Tensor]],
    after_step: Callable[[int, float, torch.nn.Module], bool],
    autocast_dtype: torch.dtype | None = None,
) -> bool:
    """At most ``steps`` AdamW steps on ``model`` (``settings``: ``learning_rate``, ``warmup_steps``,
    ``weight_decay``): the learning rate warms up linearly over ``warmup_steps``, then stays constant
    (so stopping early leaves a consistent schedule); gradients are clipped to norm 1.
    ``after_step(step, loss, model)`` returns whether to stop; so does this function. The model is
    left in eval mode. The steps done, the time taken and an ETA show on stderr as it goes."""
    stopped = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay)
    device_type = next(model.parameters()).device.type
    model.train()
    with step_progress(PROGRESS_LABEL, steps) as advance:
        for step in range(1, steps + 1):
            for group in optimizer.param_groups:
                group["lr"] = settings.learning_rate * min(1.0, step / max(1, settings.warmup_steps))
            with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = model(**next_batch()).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            stopped = after_step(step, loss.item(), model)
            advance(step)
            if stopped:
                break
    model.eval()
    return stopped


def mean_losses(steps: int, every: int = 50) -> tuple[Callable[[int, float, torch.nn.Module], bool], list]:
    """An ``after_step`` for :func:`fit_steps` that never stops, and the list it fills with
    ``(step, mean loss)`` every ``every`` steps and at the last."""
    losses: list[tuple[int, float]] = []
    running: list[float] = []

    def after_step(step: int, loss: float, model: torch.nn.Module) -> bool:
        running.append(loss)
        if step % every == 0 or step == steps:
            losses.append((step, sum(running) / len(running)))
            running.clear()
        return False

    return after_step, losses


def padded_rows(rows: Sequence[tuple[list[int], list[int]]], pad_token_id: int) -> tuple[torch.Tensor, ...]:
    """``input_ids``, ``attention_mask`` and ``labels`` of ``(ids, labels)`` rows, right-padded to the
    longest (``pad_token_id``, attention 0, label ``-100``)."""
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.tensor([ids + [pad_token_id] * (width - len(ids)) for ids, _ in rows])
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    return input_ids, attention_mask, labels
