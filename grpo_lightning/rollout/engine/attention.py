"""Grouped-query attention on ``scaled_dot_product_attention`` without copying the keys and values.

With grouped-query attention (GQA) a layer has ``Hq`` query heads and ``Hkv < Hq`` key/value heads;
each KV head serves ``g = Hq // Hkv`` consecutive query heads (query head ``h`` reads KV head
``h // g``, the layout of transformers' ``repeat_kv``). When the model passes an attention mask,
transformers' ``"sdpa"`` path expands the keys and values to ``Hq`` heads with ``repeat_kv`` before
calling SDPA, which copies the whole KV cache of the layer ``g`` times at every decode step
(transformers 5.17 does it for every mask; 5.24 avoids it for a single query, not for several).

The queries of one group can instead be stacked along the query axis:
``[B, Hkv * g, S, D] -> [B, Hkv, g * S, D]`` (a view for ``S == 1``). One SDPA call over the ``Hkv``
heads then reads each KV head once: row ``j * S + s`` of head ``k`` is query position ``s`` of query
head ``k * g + j``, and the mask ``[B, 1, S, L]`` is tiled ``g`` times along its query axis (for a
single query it broadcasts as it is). The output ``[B, Hkv, g * S, D]`` reshapes back to
``[B, Hq, S, D]``. The result is the same attention, with no host synchronisation and only static
shapes, so it can be captured in a CUDA graph.

``gqa_sdpa_attention_forward`` is registered in transformers' ``AttentionInterface`` as
``"grpo_gqa_sdpa"`` (with the ``"sdpa"`` mask builder, so models given a 2-D padding mask still get
their 4-D mask); ``grouped_query_attention(model)`` switches a model from ``"sdpa"`` or ``"eager"``
to it for the duration of a ``with`` block. Cases it does not speed up (no mask with several
queries, which relies on ``is_causal``; position biases; soft-capping; devices other than CPU and
CUDA) go to transformers' own SDPA function.

How a single query (a decode step) is computed can be chosen with ``decode_attention(kind)``, a
``with`` block (``"auto"`` by default); see ``DECODE_ATTENTION_KINDS``.
Several queries (a prefill) always take PyTorch's dispatch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpo_lightning.rollout.engine.kernels.availability import TRITON_INTERPRETED, kernels_run_on

try:
    from transformers import AttentionInterface
except ImportError:  # pragma: no cover - older layout
    from transformers.modeling_utils import AttentionInterface

try:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
except ImportError:  # pragma: no cover - releases before masking_utils build masks without a registry
    ALL_MASK_ATTENTION_FUNCTIONS = AttentionMaskInterface = None

GQA_ATTENTION = "grpo_gqa_sdpa"
"""The name under which ``gqa_sdpa_attention_forward`` is registered."""

_SWITCHABLE = ("sdpa", "eager")
_FAST_DEVICES = ("cpu", "cuda")
_EFFICIENT_DEVICES = ("cuda",)  # where SDPA has a memory-efficient kernel

DECODE_ATTENTION_KINDS = ("auto", "sdpa", "efficient", "math", "triton")
"""How ``gqa_sdpa_attention_forward`` computes a single query (``S == 1``):

* ``"auto"`` (the default): ``"triton"`` on CUDA when the ``triton`` package imports, ``"math"`` on
  a CPU, ``"sdpa"`` otherwise: the fastest on each. On a CPU PyTorch's ``"sdpa"`` picks a flash
  kernel that is slower at one query per row than ``"math"`` compiled;
* ``"sdpa"``: ``scaled_dot_product_attention`` with PyTorch's choice of kernel;
* ``"efficient"``: the same call restricted to the memory-efficient kernel on CUDA
  (``sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)``, which ``torch.compile`` traces); other devices
  have no such kernel and keep PyTorch's choice;
* ``"math"``: ``softmax(q @ k^T * scale + mask) @ v`` written out, the softmax in fp32, so that
  ``torch.compile`` fuses the scaling, mask and softmax into one kernel around two matmuls. The
  scores are rounded to the query's dtype before the softmax, as in transformers' eager attention;
* ``"triton"``: one Triton kernel (``grpo_lightning.rollout.engine.kernels.decode_attention``) reads each KV head's cache once
  for the ``g`` query heads of its group, with an online fp32 softmax. It needs the ``triton``
  package and runs on CUDA (or under Triton's interpreter, ``TRITON_INTERPRET=1``); elsewhere a
  step is computed as ``"math"``.
"""

_decode_kind = "auto"  # read at every call (and guarded on by torch.compile): set by decode_attention
_triton_kernel = None  # the "triton" kind's operator, imported by decode_attention("triton")


def check_decode_attention(kind: str) -> None:
    """Raise a ``ValueError`` naming the allowed values unless ``kind`` is in ``DECODE_ATTENTION_KINDS``."""
    if kind not in DECODE_ATTENTION_KINDS:
        allowed = ", ".join(map(repr, DECODE_ATTENTION_KINDS))
        raise ValueError(f"decode_attention must be one of {allowed}, got {kind!r}")


@contextlib.contextmanager
def decode_attention(kind: str) -> Iterator[None]:
    """Compute single-query grouped attention the ``kind`` way (``DECODE_ATTENTION_KINDS``) inside the
    ``with`` block; the previous kind is restored on exit. A compiled function that reads it is
    recompiled for each kind it runs under."""
    global _decode_kind
    check_decode_attention(kind)
    if kind == "triton" and (torch.cuda.is_available() or TRITON_INTERPRETED):
        _load_triton_kernel()
    elif kind == "auto" and torch.cuda.is_available():
        with contextlib.suppress(ImportError):  # without Triton, "auto" is "sdpa" on CUDA
            _load_triton_kernel()
    previous, _decode_kind = _decode_kind, kind
    try:
        yield
    finally:
        _decode_kind = previous


def resolve_decode_kind(kind: str, device: torch.device, triton_runs: bool) -> str:
    """The way a single query is computed on ``device`` for ``kind`` (``DECODE_ATTENTION_KINDS``):
    ``"auto"`` resolved as that list's note says, and ``"triton"`` computed as ``"math"`` where the
    kernel does not run (``triton_runs``: it is imported, and the device is CUDA or Triton runs
    interpreted)."""
    if kind == "auto":
        return "math" if device.type == "cpu" else "triton" if triton_runs else "sdpa"
    return "math" if kind == "triton" and not triton_runs else kind


def _softmax_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` with the softmax in fp32; ``mask`` is boolean
    (``True`` may attend) or additive. A row with no key to attend to gives zeros, as SDPA does."""
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = scores.softmax(dim=-1)
    probs = torch.where(scores.amax(dim=-1, keepdim=True) == float("-inf"), 0.0, probs)
    return torch.matmul(probs.to(value.dtype), value)


def _load_triton_kernel() -> None:
    """Import the ``"triton"`` kind's operator (Triton is not a dependency of the package)."""
    global _triton_kernel
    if _triton_kernel is not None:
        return
    try:
        from grpo_lightning.rollout.engine.kernels.decode_attention import decode_attention as kernel
    except ImportError as error:
        raise ImportError(
            f"decode_attention='triton' needs the triton package ({error}): install triton "
            "or set decode_attention to 'math'"
        ) from error
    _triton_kernel = kernel


def _grouped_mask(mask: Tensor, kv_heads: int, group: int, q_len: int) -> Tensor:
    """``mask`` ``[b, 1 or Hq, S or 1, L]`` laid out for queries stacked as ``[B, Hkv, g * S, D]``."""
    batch, heads, _, kv_len = mask.shape
    if heads == 1 and q_len == 1:
        return mask  # [b, 1, 1, L] broadcasts over the g stacked rows
    mask = mask.expand(batch, heads, q_len, kv_len)
    if heads == 1:  # the same rows for every query head of a group: tile them g times
        return mask.unsqueeze(2).expand(batch, 1, group, q_len, kv_len).reshape(batch, 1, group * q_len, kv_len)
    return mask.reshape(batch, kv_heads, group * q_len, kv_len)  # one mask per query head


def gqa_sdpa_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention of ``query`` ``[B, Hq, S, D]`` over ``key``/``value`` ``[B, Hkv, L, D]``, as ``[B, S, Hq, D]``.

    Same signature, conventions and result as transformers' ``sdpa_attention_forward``:
    ``attention_mask`` is ``None``, a boolean ``[B, 1, S, L]`` mask (``True`` may attend) or an
    additive float one; ``scaling`` ``None`` means ``1 / sqrt(D)``; ``is_causal`` only matters when
    there is no mask and ``S > 1``, a case handed to transformers' function. The keys and values are
    never repeated: the ``Hq // Hkv`` query heads of each KV head are stacked along the query axis.
    A single query is computed the way ``decode_attention`` chose (``"math"`` only without dropout).
    """
    batch, q_heads, q_len, _ = query.shape
    kv_heads = key.shape[1]
    if (
        (attention_mask is None and q_len > 1)
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or q_heads % kv_heads != 0
        or query.device.type not in _FAST_DEVICES
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    group = q_heads // kv_heads
    mask = attention_mask
    if mask is not None:
        if mask.dtype != torch.bool and mask.dtype != query.dtype:
            # An additive mask built in another dtype (fp32 for a bf16 model): in the query's dtype the
            # fused kernels accept it; clamping keeps fp32's lowest value from becoming -inf.
            mask = mask.clamp(min=torch.finfo(query.dtype).min).to(query.dtype)
        mask = _grouped_mask(mask, kv_heads, group, q_len)
    stacked = query.reshape(batch, kv_heads, group * q_len, query.shape[-1])
    on_triton = _triton_kernel is not None and kernels_run_on(query.device)
    kind = resolve_decode_kind(_decode_kind, query.device, on_triton) if q_len == 1 else "sdpa"
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if kind == "triton" and dropout == 0.0:
        out = _triton_kernel(stacked, key, value, mask, scale)
    elif kind in ("math", "triton") and dropout == 0.0:
        out = _softmax_attention(stacked, key, value, mask, scale)
    else:
        restricted = kind == "efficient" and query.device.type in _EFFICIENT_DEVICES
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION) if restricted else contextlib.nullcontext():
            out = torch.nn.functional.scaled_dot_product_attention(
                stacked, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
            )
    # SDPA broadcasts the batch (e.g. a query of batch 1): take it from the output.
    out = out.reshape(out.shape[0], q_heads, q_len, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GQA_ATTENTION, gqa_sdpa_attention_forward)
if AttentionMaskInterface is not None:
    # Mask creation skips any implementation it has no mask builder for (it then passes no mask at
    # all, dropping padding): give the name the boolean masks that "sdpa" gets. Ready 4-D masks are
    # passed through whatever the name.
    AttentionMaskInterface.register(GQA_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def _configs(model: nn.Module) -> list[Any]:
    """Every distinct config of ``model``: the configs of its modules and their sub-configs."""
    found: dict[int, Any] = {}
    pending = [getattr(m, "config", None) for m in model.modules()]
    while pending:
        config = pending.pop()
        if config is None or not hasattr(config, "_attn_implementation") or id(config) in found:
            continue
        found[id(config)] = config
        pending.extend(getattr(config, name, None) for name in getattr(config, "sub_configs", None) or ())
    return list(found.values())


def _set_attention(config: Any, implementation: str | None) -> None:
    # The internal attribute sets this config alone (the public setter also rewrites the sub-configs).
    if hasattr(config, "_attn_implementation_internal"):
        config._attn_implementation_internal = implementation
    else:  # pragma: no cover - releases without the internal attribute
        config._attn_implementation = implementation


def _switchable(config: Any) -> bool:
    # Eager attention with soft-capped scores (Gemma 2) is not plain softmax attention.
    implementation = config._attn_implementation or "eager"
    return implementation in _SWITCHABLE and getattr(config, "attn_logit_softcapping", None) is None


@contextlib.contextmanager
def grouped_query_attention(model: nn.Module) -> Iterator[bool]:
    """Run ``model`` with ``gqa_sdpa_attention_forward`` inside the ``with`` block.

    Every config of the model whose attention implementation is ``"sdpa"`` or ``"eager"`` (or unset,
    which means eager) is switched to ``"grpo_gqa_sdpa"`` and restored on exit, also after an
    exception; other implementations (flash, flex, ...) and eager attention with soft-capped scores
    are left as they are. The attention layers look the implementation up in their config at every
    forward, so no reload is needed. Yields whether anything was switched.
    """
    switched = [(c, c._attn_implementation) for c in _configs(model) if _switchable(c)]
    try:
        for config, _ in switched:
            _set_attention(config, GQA_ATTENTION)
        yield bool(switched)
    finally:
        for config, previous in reversed(switched):
            _set_attention(config, previous)
