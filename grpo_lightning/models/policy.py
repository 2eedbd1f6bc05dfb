"""The models a run trains and compares against: the policy (with LoRA adapters under
``peft_config``: :mod:`grpo_lightning.models.lora`) and the frozen models that score its tokens: the
reference model, a distillation teacher (:func:`load_frozen_model`).

Under an FSDP strategy each model is sharded on its own (:func:`grpo_lightning.runtime.strategies.shard`),
the reference model unless the strategy keeps it whole (``reference_weights="unsharded"``). With
adapters no reference model is loaded: it is the policy with its adapters disabled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

from grpo_lightning.rollout.generation import disable_dropout, load_causal_lm
from grpo_lightning.models.lora import add_adapters
from grpo_lightning.errors import ConfigError
from grpo_lightning.runtime.compute import matmul_parameters
from grpo_lightning.runtime.strategies import shard


def load_models(name: str, hparams: Mapping[str, Any], needs_reference: bool, strategy: Any = None
                ) -> tuple[nn.Module, nn.Module | None]:  # fmt: skip
    """``(policy, reference model or None)`` of the checkpoint ``name`` with the module's ``policy``
    options as plain values, ``hparams`` (``dtype``, ``attn_implementation``, ``disable_dropout``,
    ``gradient_checkpointing``, ``peft_config``); the policy in training mode, its ``matmul_parameters``
    (the whole model's N of :mod:`grpo_lightning.runtime.compute`) counted before sharding."""
    adapters = hparams.get("peft_config")
    if adapters and isinstance(strategy, FSDPStrategy):
        raise ConfigError(
            "policy.peft_config: LoRA runs on one device or under DDP (--trainer.strategy ddp), not FSDP."
        )
    policy = load_causal_lm(name, hparams["dtype"], hparams["attn_implementation"]).train()
    if hparams["gradient_checkpointing"]:
        policy.gradient_checkpointing_enable()
    if adapters:
        policy = add_adapters(policy, adapters, hparams["gradient_checkpointing"])
    if hparams["disable_dropout"]:  # the adapters' dropout too
        disable_dropout(policy)
    parameters = matmul_parameters(policy)
    policy = shard(policy)
    policy.matmul_parameters = parameters  # an FSDP root's attributes fall through to the module's
    if not needs_reference or adapters:
        return policy, None
    return policy, load_frozen_model(name, hparams, strategy)


def load_frozen_model(name: str, hparams: Mapping[str, Any], strategy: Any = None) -> nn.Module:
    """The checkpoint ``name`` as a frozen model that only scores tokens (the reference model, a
    distillation teacher): in eval mode, without gradients, in the policy's ``dtype``, sharded under
    FSDP unless the strategy keeps frozen models whole (``reference_weights="unsharded"``)."""
    model = load_causal_lm(name, hparams["dtype"], hparams["attn_implementation"])
    model.eval().requires_grad_(False)
    if getattr(strategy, "reference_weights", "sharded") == "sharded":
        model = shard(model)
    return model
