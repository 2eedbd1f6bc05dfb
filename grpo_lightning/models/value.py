"""The critic of PPO: a value model of the policy's architecture, loaded from the same checkpoint.

The value model is the causal LM's own backbone (its decoder without the LM head) with a scalar
head ``Linear(hidden, 1)`` initialised to zero, rather than ``AutoModelForTokenClassification``
with ``num_labels=1``:

* It loads through :func:`grpo_lightning.models.policy.load_causal_lm`, so whatever ``model`` names
  (a hub id, a directory, a GGUF file: :mod:`grpo_lightning.models.sources`) gives the critic too;
  transformers has token-classification classes for about half its causal-LM architectures (none
  for OLMo 2, Gemma 3, Granite or Cohere, say).
* A zero head makes every value 0 at first, whatever the seed: the first advantages are the plain
  returns, not returns minus the noise of a randomly drawn head. (The backbone's gradient is 0 in
  the critic's first step, ``dV/dh = w = 0``, and flows from the second on.)

Either way the ``[V, H]`` LM head is left out. What the critic costs is one more copy of the
backbone's weights, their gradients and AdamW's two moments, and a forward and backward pass per
minibatch: what GRPO saves by dropping it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from grpo_lightning.algorithms import functional
from grpo_lightning.algorithms.gae import explained_variance
from grpo_lightning.models.policy import disable_dropout, load_causal_lm
from grpo_lightning.runtime.metrics import StepMetrics
from grpo_lightning.runtime.optimization.compensated import adamw
from grpo_lightning.runtime.strategies import clip_policy_gradients

if TYPE_CHECKING:  # the rollout wing samples with the models: this one names its type only
    from grpo_lightning.rollout.types import Rollout


class ValueHead(nn.Linear):
    """``Linear(hidden, 1)`` in fp32, zero at first; it casts the hidden states to its own dtype."""

    def __init__(self, hidden_size: int, device: torch.device) -> None:
        super().__init__(hidden_size, 1, dtype=torch.float32, device=device)
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return super().forward(hidden.to(self.weight.dtype))


class ValueModel(nn.Module):
    """``V(s_t)`` for each completion token: the backbone's last hidden state at the position before
    token ``t`` (the prompt and the completion's tokens before ``t``), through the scalar head.

    Under FSDP (:func:`grpo_lightning.runtime.strategies.shard`) each decoder layer is a unit and so is the
    head (``_no_split_modules``): an fp32 head cannot share a flat parameter with bf16 weights."""

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = ValueHead(backbone.config.hidden_size, backbone.device)
        self._no_split_modules = [*(backbone._no_split_modules or ()), ValueHead.__name__]

    def forward(self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor):
        """Values ``[N, T]`` (fp32) of left-padded prompts ``[N, S]`` and completions ``[N, T]``; 0
        where ``completion_mask`` is 0."""
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        # no position attends to nothing
        order, shift = functional.left_padding_last(attention_mask, most=prompt_ids.size(1) - 1)
        input_ids, attention_mask = input_ids.gather(1, order), attention_mask.gather(1, order)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask,
            position_ids=functional.position_ids_from_mask(attention_mask), use_cache=False,
        ).last_hidden_state  # fmt: skip
        # The state at position p has read the tokens up to p: the one before token t is s_t, at
        # column S - 1 + t of row i before its padding moved, S - 1 + t - shift[i] now.
        length = completion_ids.size(1)
        before = prompt_ids.size(1) - 1 - shift[:, None] + torch.arange(length, device=shift.device)
        hidden = hidden.gather(1, before[..., None].expand(-1, -1, hidden.size(-1)))
        values = self.head(hidden).squeeze(-1).float()
        return values.masked_fill(completion_mask == 0, 0.0)


def backbone_settings(policy: Any) -> dict[str, Any]:
    """The arguments of :func:`load_value_model` that load the backbone as the policy's ``policy`` options do."""
    return {"dtype": policy.dtype, "attn_implementation": policy.attn_implementation,
            "no_dropout": policy.disable_dropout, "gradient_checkpointing": policy.gradient_checkpointing}  # fmt: skip


def load_value_model(
    name: str, dtype: str, attn_implementation: str | None, *, no_dropout: bool = True,
    gradient_checkpointing: bool = False,
) -> ValueModel:
    """The value model of the checkpoint ``name`` names, its backbone in ``dtype`` (as the policy's:
    :func:`~grpo_lightning.models.policy.load_causal_lm`), in training mode."""
    backbone = load_causal_lm(name, dtype, attn_implementation).base_model  # the LM head is let go
    if no_dropout:
        disable_dropout(backbone)
    if gradient_checkpointing:
        backbone.gradient_checkpointing_enable()
    return ValueModel(backbone).train()


def critic_optimizer(model: nn.Module, policy: dict[str, Any], learning_rate: float) -> dict[str, Any]:
    """The critic's AdamW at ``learning_rate``, with the weight decay and the warm-up of the policy's
    (``policy``: what the base module's ``configure_optimizers`` returns)."""
    defaults, warmup = policy["optimizer"].defaults, policy["lr_scheduler"]["scheduler"].lr_lambdas[0]
    optimizer = adamw(list(model.parameters()), learning_rate, defaults["weight_decay"], trained="the critic's")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


@torch.no_grad()
def compute_values(model: ValueModel, rollout: Rollout, micro_batches: Sequence[Tensor]) -> Tensor:
    """Values ``[N, T]`` of the rollout's completions under ``model``, one pass per micro-batch of
    ``micro_batches`` (index tensors that cover ``0 .. N - 1`` once, in any order)."""
    values = torch.cat([model(*rollout.model_inputs(part)) for part in micro_batches])
    return values[torch.cat(list(micro_batches)).to(values.device).argsort()]


def record_critic(metrics: StepMetrics, values: Tensor, returns: Tensor, advantages: Tensor, mask: Tensor) -> None:
    """The critic's metrics over the valid tokens: ``value/mean``, ``returns/mean``,
    ``value/explained_variance`` and ``advantages/mean_abs`` (of the advantages before whitening)."""
    metrics.update("value/mean", functional.masked_mean(values, mask))
    metrics.update("returns/mean", functional.masked_mean(returns, mask))
    metrics.update("value/explained_variance", explained_variance(values, returns, mask))
    metrics.update("advantages/mean_abs", functional.masked_mean(advantages.abs(), mask))


def clip_and_step(module: Any, optimizer: Any, model: nn.Module, max_norm: float | None) -> None:
    """Clip ``model``'s gradient to ``max_norm`` (``None``: no clipping; its norm before clipping is
    ``value/grad_norm``; a non-finite one drops the gradient) and step ``optimizer`` with :func:`step_uncounted`."""
    norm = clip_policy_gradients(module, optimizer, max_norm, model=model)
    if norm is not None:
        module.step_metrics.update("value/grad_norm", norm)
        if not module.nonfinite.allows(norm, module.global_step, what="critic's gradient"):
            optimizer.zero_grad(set_to_none=True)  # the critic's step changes nothing either
    step_uncounted(module, optimizer)


def step_uncounted(module: Any, optimizer: Any) -> None:
    """``optimizer.step()`` through the Trainer's strategy (its precision plugin: gradient scaler,
    ``on_before_optimizer_step`` hooks) without counting it in ``trainer.global_step``: under manual
    optimization Lightning counts the steps of every optimizer it wraps, and ``global_step`` must keep
    counting policy updates (``max_steps``, logging, checkpoints)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # the torch optimizer inside Lightning's wrapper
    module.trainer.strategy.optimizer_step(inner, closure=lambda: None)
