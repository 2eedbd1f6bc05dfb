"""LoRA through PEFT: train low-rank adapters on a frozen policy (Hu et al. 2021, "LoRA").

``--model.policy.peft_config`` takes a ``peft.LoraConfig`` (``class_path``/``init_args``, as TRL's
``peft_config``) or a dict of its fields. Then:

* The policy is ``peft.get_peft_model(policy, config)``: only the adapters ``A``, ``B`` require
  gradients, so the optimizer holds only them; a layer computes ``W x + (alpha / r) B A x``.
* The reference model is the same network with its adapters disabled (:func:`reference_model`):
  ``pi_ref`` is the base model and no second copy of its weights is loaded.
* Rollouts sample from a plain copy of the model holding the merged weights
  ``W + (alpha / r) B A`` (:func:`merged_weights`), refreshed after each optimizer step, so the
  fast engine decodes an ordinary Hugging Face model with no adapter arithmetic per token.
* Forward passes through the adapters run under :func:`adapter_autocast`: float32 adapters on a
  bf16 base compute their products in bf16.
* Checkpoints hold the adapters (the frozen base weights are reloaded from ``model``);
  ``save_pretrained`` and :mod:`grpo_lightning.checkpoints.export` write the merged model, or the adapter
  alone with ``--adapter``.

``peft`` is an optional extra: ``pip install grpo-lightning[peft]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from grpo_lightning.errors import ConfigError

ADAPTER = "default"  # the name PEFT gives the one adapter
#: Fields the hyperparameters always show, default or not.
SHOWN_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules")


def _peft():
    try:
        import peft
    except ImportError as error:
        raise ConfigError("policy.peft_config: LoRA needs the peft package: pip install 'grpo-lightning[peft]'.") from error
    return peft


def adapter_settings(config: Any) -> dict[str, Any] | None:
    """``peft_config`` as plain values for the hyperparameters (checkpoints load with
    ``weights_only``): the rank, scale, dropout and target modules, and every other field of the
    ``LoraConfig`` that differs from its default. ``config``: a ``peft.LoraConfig``, a dict of its
    fields, or the CLI's ``{"class_path": "peft.LoraConfig", "init_args": {...}}``."""
    if config is None:
        return None
    peft = _peft()
    if isinstance(config, peft.LoraConfig):
        values = {field.name: getattr(config, field.name) for field in dataclasses.fields(config) if field.init}
    elif isinstance(config, dict) and "class_path" in config:
        if str(config["class_path"]).rpartition(".")[2] != "LoraConfig":
            raise ConfigError(f"policy.peft_config: only LoRA is supported (peft.LoraConfig), got {config['class_path']}.")
        values = dict(config.get("init_args") or {})
    elif isinstance(config, dict):
        values = dict(config)
    else:
        raise ConfigError(f"policy.peft_config: give a peft.LoraConfig or a dict of its fields, got {type(config).__name__}.")
    default = peft.LoraConfig()
    settings = {name: plain_value(value) for name, value in values.items()
                if name not in ("peft_type", "task_type") and plain_value(value) != plain_value(getattr(default, name, None))}
    config = lora_config(settings)  # unknown fields and invalid values fail here, before any model is loaded
    check_supported(config)
    return {**{name: plain_value(getattr(config, name)) for name in SHOWN_FIELDS}, **settings}


#: LoRA options whose trained network the rollout copy's merge (``merged_weights``), the merged export and
#: the reference model (the adapters off) would not reproduce, refused by name: ``field: (refused, why)``.
UNSUPPORTED = {
    "use_dora": (lambda value: bool(value), "DoRA's magnitude vectors are not merged: rollouts would sample from "
                 "another network than the one trained"),
    "bias": (lambda value: value not in (None, "none"), "trained biases of the base stay on with the adapters off, "
             "so the reference model would not be the base"),
}


def check_supported(config: Any) -> None:
    """Refuse the :data:`UNSUPPORTED` options of a ``peft.LoraConfig``, naming the field and why."""
    for name, (refused, why) in UNSUPPORTED.items():
        value = plain_value(getattr(config, name, None))
        if refused(value):
            raise ConfigError(f"policy.peft_config.{name}={value!r} is not supported: {why}. Leave it at its default.")


def check_adapted_model(model: nn.Module) -> None:
    """Refuse adapters the rollout copy and the merged export would leave out or corrupt: LoRA on an
    embedding (its adapters are not merged) and ``modules_to_save`` where the input and output embeddings
    are one tied tensor (the trained head's copy would overwrite the input embedding)."""
    for name, module in model.named_modules():
        if getattr(module, "lora_embedding_A", None):
            raise ConfigError(f"policy.peft_config.target_modules: {name.removeprefix('base_model.model.')!r} is an "
                              "embedding, whose LoRA adapters rollouts would not see (they are not merged); target "
                              "linear layers only, e.g. 'all-linear'.")  # fmt: skip
    config = getattr(model, "peft_config", {}).get("default")
    tied = getattr(getattr(model.get_base_model(), "config", None), "tie_word_embeddings", False)
    if config is not None and config.modules_to_save and tied:
        raise ConfigError(f"policy.peft_config.modules_to_save={sorted(config.modules_to_save)!r} is not supported on a "
                          "model that ties its input and output embeddings: the trained copy would overwrite the input "
                          "embedding in the rollout copy. Leave modules_to_save unset.")  # fmt: skip


def default_lora_value(name: str) -> Any:
    """``peft.LoraConfig``'s default of field ``name``, as :func:`adapter_settings` writes values."""
    return plain_value(getattr(_peft().LoraConfig(), name, None))


def plain_value(value: Any) -> Any:
    """A ``LoraConfig`` field's value as :func:`adapter_settings` records it (enums, sets, dataclasses plain)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain_value(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    return list(map(plain_value, value)) if isinstance(value, (list, tuple)) else value


def lora_config(settings: dict[str, Any]) -> Any:
    """The ``peft.LoraConfig`` of ``settings`` (a causal-LM task); unknown fields are named."""
    peft = _peft()
    known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"policy.peft_config: {unknown} are not fields of peft.LoraConfig.")
    try:
        return peft.LoraConfig(**{**settings, "task_type": "CAUSAL_LM"})
    except (TypeError, ValueError) as error:  # peft's own checks of the values
        raise ConfigError(f"policy.peft_config: {error}") from error


def add_adapters(model: PreTrainedModel, settings: dict[str, Any], gradient_checkpointing: bool = False) -> nn.Module:
    """``model`` with LoRA adapters (``settings``: :func:`adapter_settings`); only they train."""
    peft = _peft()
    if gradient_checkpointing:  # the frozen embeddings' output must carry gradients into checkpointed layers
        model.enable_input_require_grads()
    adapted = peft.get_peft_model(model, lora_config(settings))
    check_adapted_model(adapted)
    return adapted


def has_adapters(model: nn.Module | None) -> bool:
    return model is not None and hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def adapter_autocast(model: nn.Module) -> contextlib.AbstractContextManager:
    """Mixed precision for float32 adapters on a bf16 or fp16 base model (PEFT's default).

    PEFT runs ``B A x`` in the adapters' float32, which on a GPU takes CUDA cores instead of tensor
    cores. Inside the returned ``torch.autocast`` the products run in the base weights' dtype,
    while ``A`` and ``B`` and their gradients stay float32, as in mixed-precision training
    (Micikevicius et al. 2018). ``nullcontext`` for a model without adapters or with float32 weights.
    """
    if not has_adapters(model):
        return contextlib.nullcontext()
    base = model.get_base_model().get_input_embeddings().weight
    adapter = next((p for name, p in model.named_parameters() if ".lora_A." in name), None)
    if adapter is None or base.dtype not in (torch.bfloat16, torch.float16) or adapter.dtype == base.dtype:
        return contextlib.nullcontext()
    return torch.autocast(base.device.type, dtype=base.dtype)


@contextlib.contextmanager
def reference_model(policy: nn.Module, ref_model: nn.Module | None) -> Iterator[nn.Module]:
    """The model of ``pi_ref`` inside the ``with`` block: ``ref_model``, or with adapters, the
    policy with its adapters disabled (the base model)."""
    if ref_model is not None or not has_adapters(policy):
        yield ref_model
        return
    with policy.disable_adapter():
        yield policy


@torch.no_grad()
def merged_weights(policy: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` of every parameter of the base model under its plain name, each LoRA
    layer's weight merged: ``W + (alpha / r) B A`` (PEFT's ``get_delta_weight``)."""
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model()
    lora_layers = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, tensor in base.named_parameters(remove_duplicate=False):
        if ".lora_" in name or ".original_module." in name:
            continue
        plain = name.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", ".")
        owner, _, leaf = plain.rpartition(".")
        layer = lora_layers.get(owner)
        if layer is not None and leaf == "weight" and ADAPTER in layer.lora_A:
            tensor = tensor + layer.get_delta_weight(ADAPTER).to(tensor.dtype)
        yield plain, tensor


@torch.no_grad()
def merged_model(policy: nn.Module) -> PreTrainedModel:
    """A plain model of the policy's architecture holding :func:`merged_weights` (on its device)."""
    base = policy.get_base_model()
    first = next(base.parameters())
    with torch.device(first.device):
        model = type(base)._from_config(base.config, dtype=first.dtype)
    targets = dict(model.named_parameters(remove_duplicate=False))
    for name, tensor in merged_weights(policy):
        targets[name].copy_(tensor)
    return model.eval()


def trainable_keys(policy: nn.Module, prefix: str) -> set[str]:
    """The state-dict keys (under ``prefix``) of the parameters that train: what a checkpoint keeps."""
    return {prefix + name for name, parameter in policy.named_parameters() if parameter.requires_grad}


def load_trained_weights(policy: nn.Module, weights: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Load a checkpoint's ``weights`` (keyed as ``policy``'s state dict; a LoRA run's hold its adapters
    only) into ``policy``: ``(missing, unexpected)``, the trained parameters it lacks and the weights that
    are not ``policy``'s (one of another shape, adapters of another rank, named by the load's error)."""
    missing = sorted(trainable_keys(policy, "") - set(weights))
    try:
        unexpected = policy.load_state_dict(weights, strict=False).unexpected_keys
    except RuntimeError as error:
        unexpected = [str(error).splitlines()[-1].strip()]
    return missing, list(unexpected)
