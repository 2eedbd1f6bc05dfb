"""The models a run trains and compares against, each loaded by name (:func:`load_causal_lm`): the policy (with LoRA adapters under
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

from transformers import AutoModelForCausalLM, PreTrainedModel

from grpo_lightning.models.fingerprint import weights_fingerprint
from grpo_lightning.models.lora import add_adapters
from grpo_lightning.models.sources import dense_copy, resolve_model_source
from grpo_lightning.errors import ConfigError
from grpo_lightning.runtime.dtypes import DTYPES
from grpo_lightning.runtime.compute import matmul_parameters
from grpo_lightning.runtime.strategies import shard


def disable_dropout(model: nn.Module) -> None:
    """Zero every dropout probability of ``model``: the log-probs of the update are then those of
    the distribution the rollout sampled from."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def load_causal_lm(name: str, dtype: str, attn_implementation: str | None) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` of the checkpoint ``name`` names (a hub id, a
    directory or a GGUF file, read through its :func:`~grpo_lightning.models.sources.dense_copy`) in
    ``dtype`` (``"auto"`` or a name of ``DTYPES``)."""
    source = dense_copy(resolve_model_source(name))
    kwargs: dict[str, Any] = source.from_pretrained_kwargs(dense=True)
    kwargs["dtype"] = dtype if dtype == "auto" else DTYPES[dtype]
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    return AutoModelForCausalLM.from_pretrained(source.location, **kwargs)


def load_models(name: str, hparams: Mapping[str, Any], needs_reference: bool, strategy: Any = None
                ) -> tuple[nn.Module, nn.Module | None]:  # fmt: skip
    """``(policy, reference model or None)`` of the checkpoint ``name`` with the module's ``policy``
    options as plain values, ``hparams`` (``dtype``, ``attn_implementation``, ``disable_dropout``,
    ``gradient_checkpointing``, ``peft_config``); the policy in training mode, its ``matmul_parameters``
    (the whole model's N of :mod:`grpo_lightning.runtime.compute`) counted before sharding, and its
    ``base_fingerprint`` (:mod:`grpo_lightning.models.fingerprint`) taken before adapters."""
    adapters = hparams.get("peft_config")
    if adapters and isinstance(strategy, FSDPStrategy):
        raise ConfigError(
            "policy.peft_config: LoRA runs on one device or under DDP (--trainer.strategy ddp), not FSDP."
        )
    policy = load_causal_lm(name, hparams["dtype"], hparams["attn_implementation"]).train()
    fingerprint = weights_fingerprint(policy)  # of the base, as a checkpoint records it
    if hparams["gradient_checkpointing"]:
        policy.gradient_checkpointing_enable()
    if adapters:
        policy = add_adapters(policy, adapters, hparams["gradient_checkpointing"])
    if hparams["disable_dropout"]:  # the adapters' dropout too
        disable_dropout(policy)
    parameters = matmul_parameters(policy)
    policy = shard(policy)
    policy.matmul_parameters = parameters  # an FSDP root's attributes fall through to the module's
    policy.base_fingerprint = fingerprint
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
