"""Which decoder and kernels a generator runs on a device, from its settings.

``None`` settings choose what runs there; ``True`` raises where the kernel cannot run. The Triton
kernels run on CUDA (or under ``TRITON_INTERPRET=1``) when the ``triton`` package imports.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import torch
from torch import nn

from grpo_lightning.rollout.engine.attention import resolve_decode_kind
from grpo_lightning.rollout.engine.fused_decode import (
    FUSED_MODEL_TYPES,
    QKV_KERNEL_MODEL_TYPES,
    FusedDecoder,
    FusedLayer,
    down_parts_apply,
    qkv_kernel_applies,
)
from grpo_lightning.rollout.engine.kernels.availability import importable, kernels_run_on

DOWN_PARTS = 2
"""Parts of a decode step's down product on CUDA by default (``down_parts``): the parts are added in
the residual sum, one kernel fewer than cuBLAS splitting the product and adding its parts itself."""

_QKV_MODULE = "grpo_lightning.rollout.engine.kernels.qkv"
_SAMPLING_MODULE = "grpo_lightning.rollout.engine.kernels.sampling"
_ATTENTION_MODULE = "grpo_lightning.rollout.engine.kernels.decode_attention"


def check_fused_settings(
    fuse_projections: bool, down_parts: int | None, compile_prefill: bool | None, qkv_kernel: bool | None
) -> None:
    """Raise a ``ValueError`` for settings of the fused decoder asked for without ``fuse_projections``."""
    if down_parts is not None and down_parts < 1:
        raise ValueError(f"down_parts must be at least 1 (or None), got {down_parts}")
    if down_parts not in (None, 1) and not fuse_projections:
        raise ValueError(f"down_parts={down_parts} splits the fused decoder's down product: set fuse_projections=True too")
    if compile_prefill and not fuse_projections:
        raise ValueError("compile_prefill=True compiles the fused layers' prefill: set fuse_projections=True too")
    if qkv_kernel and not fuse_projections:
        raise ValueError("qkv_kernel=True computes the fused projections: set fuse_projections=True too")


def fused_decoder(
    model: nn.Module, fused: list[FusedLayer] | None, device: torch.device, qkv_kernel: bool | None, down_parts: int | None
) -> FusedDecoder | None:
    """The decoder of ``model``'s fused projections ``fused`` (``None``: the model has none), on the
    q/k/v kernel where ``qkv_kernel`` asks for it and it runs."""
    if fused is None:
        if qkv_kernel:
            raise ValueError(
                f"qkv_kernel=True: {type(model).__name__} has no fused decode step (model types "
                f"{FUSED_MODEL_TYPES}); set qkv_kernel to None or False"
            )
        return None
    runs_here = kernels_run_on(device) and qkv_kernel_applies(model, fused)
    if qkv_kernel is None:
        qkv_kernel = runs_here and importable(_QKV_MODULE)
    elif qkv_kernel and not runs_here:
        raise ValueError(
            f"qkv_kernel=True needs a CUDA device (or TRITON_INTERPRET=1) and a model of "
            f"fused_decode.QKV_KERNEL_MODEL_TYPES {QKV_KERNEL_MODEL_TYPES} with a head dimension of 32 to "
            f"256; this one is a {model.config.model_type} model on {device}. Set qkv_kernel to None "
            "or False."
        )
    if down_parts is None:
        down_parts = DOWN_PARTS if device.type == "cuda" and down_parts_apply(fused, DOWN_PARTS) else 1
    return FusedDecoder(model, fused, qkv_kernel=bool(qkv_kernel), down_parts=down_parts)


def sampling_kernels(device: torch.device, sampling_kernel: bool | None) -> Any:
    """``grpo_lightning.rollout.engine.kernels.sampling`` where it draws the tokens, else ``None``."""
    if sampling_kernel is False:
        return None
    if kernels_run_on(device) and importable(_SAMPLING_MODULE):
        return importlib.import_module(_SAMPLING_MODULE)
    if sampling_kernel:
        raise ValueError(
            f"sampling_kernel=True needs Triton and a CUDA device (or TRITON_INTERPRET=1); the model is on "
            f"{device}. Set sampling_kernel to None or False."
        )
    return None


def reads_slots_in_use(attend_slots_in_use: bool, decode_attention: str, device: torch.device) -> bool:
    """Whether decode steps run the Triton attention kernel, which can read only the cache slots in
    use (``kernels.decode_attention.slots_in_use``); other kinds read the whole cache."""
    if not attend_slots_in_use or resolve_decode_kind(decode_attention, device, True) != "triton":
        return False  # a kind that never runs the kernel: no import of its module (and Triton's, ~1 s)
    triton_runs = kernels_run_on(device) and importable(_ATTENTION_MODULE)
    return resolve_decode_kind(decode_attention, device, triton_runs) == "triton"


def slots_in_use(limit: int, cache_len: int) -> Any:
    """``kernels.decode_attention.slots_in_use(limit)`` for a bound below ``cache_len`` (there are
    such bounds only where the kernel runs: :func:`reads_slots_in_use`), else a context that does
    nothing."""
    if limit >= cache_len:
        return contextlib.nullcontext()
    return importlib.import_module(_ATTENTION_MODULE).slots_in_use(limit)
