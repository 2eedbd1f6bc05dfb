"""The decode step of Llama-family models with each layer's input projections fused.

At a decode step the batch has one token per row, so each of a layer's seven matrix products (q, k,
v, o, gate, up, down) is a small GEMM whose time is the latency of its kernel, not the reading of its
weight.
Here ``q``, ``k`` and ``v`` are one product with their stacked weights, and ``gate`` and ``up``
another, which saves two GEMMs per layer and sends the same bytes through fewer kernels. The rest of
the layer is the model's own modules (its norms, rotary embedding, ``o_proj``, activation,
``down_proj``, final norm and LM head), and attention is ``grpo_lightning.rollout.engine.attention``'s. Optionally
the down product is computed in fp32 parts added up in the residual sum
(:func:`residual_plus_parts`), and :meth:`FusedDecoder.prefill` runs the prompts through the same
layers.

The stacked weights are not copies. :func:`fuse_projections` re-points the q/k/v (and gate/up)
parameters of every layer to consecutive rows of one buffer per layer (``param.data = rows``), so
the parameters keep their objects, names, shapes and values, the optimizer's in-place updates land
in the buffer, and every rollout reads the latest weights. ``state_dict`` and Lightning checkpoints
save the parameters as before, and ``save_pretrained`` copies parameters that share a buffer before
writing them. A parameter replaced by a new tensor (``model.to(...)``, loading with ``assign=True``)
is no longer in the buffer: :func:`fuse_projections` checks this and fuses again.

Supported: ``FUSED_MODEL_TYPES`` (decoder layers of ``nn.Linear`` projections, full attention;
Qwen3's per-head normalisation of q and k is applied as the model does). :func:`fuse_projections` returns ``None`` for other
models, which then decode through their own ``forward``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from grpo_lightning.rollout.engine.attention import gqa_sdpa_attention_forward

FUSED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""``config.model_type`` values whose decoder layers :class:`FusedDecoder` computes."""


@dataclass
class Stacked:
    """One buffer holding the weights (and biases) of ``linears`` as consecutive rows."""

    linears: tuple[nn.Linear, ...]
    weight: Tensor
    bias: Tensor | None
    sizes: tuple[int, ...]

    def holds_its_parameters(self) -> bool:
        """Whether every linear's weight and bias are still its rows of the buffer."""
        row = 0
        for linear, size in zip(self.linears, self.sizes):
            if not _is_rows_of(linear.weight, self.weight, row, size):
                return False
            if self.bias is not None and not _is_rows_of(linear.bias, self.bias, row, size):
                return False
            row += size
        return True

    def __call__(self, x: Tensor) -> tuple[Tensor, ...]:
        return torch.nn.functional.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)


def _is_rows_of(tensor: Tensor, buffer: Tensor, row: int, size: int) -> bool:
    return (
        tensor.device == buffer.device
        and tensor.dtype == buffer.dtype
        and tensor.shape == (size, *buffer.shape[1:])
        and tensor.is_contiguous()
        and tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        and tensor.data_ptr() == buffer.data_ptr() + row * buffer.stride(0) * buffer.element_size()
    )


def stack_linears(linears: tuple[nn.Linear, ...]) -> Stacked:
    """Move the weights (and biases) of ``linears`` into one buffer each, as consecutive rows, and
    make every parameter a view of its rows. Values, objects and ``requires_grad`` are unchanged."""
    sizes = tuple(linear.out_features for linear in linears)
    with torch.no_grad():
        weight = torch.cat([linear.weight.detach() for linear in linears])
        has_bias = linears[0].bias is not None
        bias = torch.cat([linear.bias.detach() for linear in linears]) if has_bias else None
        row = 0
        for linear, size in zip(linears, sizes):
            linear.weight.data = weight[row : row + size]
            if bias is not None:
                linear.bias.data = bias[row : row + size]
            row += size
    return Stacked(linears, weight, bias, sizes)


@dataclass
class FusedLayer:
    layer: nn.Module
    qkv: Stacked
    gate_up: Stacked

    def holds_its_parameters(self) -> bool:
        return self.qkv.holds_its_parameters() and self.gate_up.holds_its_parameters()


def _supported_layers(model: nn.Module) -> nn.ModuleList | None:
    """The decoder layers of ``model`` (``model.model.layers``), if it is of a supported kind."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if getattr(config, "model_type", None) not in FUSED_MODEL_TYPES or inner is None:
        return None
    if not all(hasattr(inner, name) for name in ("embed_tokens", "rotary_emb", "norm", "layers")):
        return None
    for layer in inner.layers:
        attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projections = [getattr(attention, f"{p}_proj", None) for p in "qkvo"]
        projections += [getattr(mlp, f"{p}_proj", None) for p in ("gate", "up", "down")]
        if any(type(p) is not nn.Linear for p in projections):
            return None  # adapters (LoRA) wrap the projections
        if hasattr(attention, "q_norm") != (config.model_type == "qwen3"):
            return None  # per-head q/k norms are Qwen3's; other placements are not handled
        if any((p.bias is None) != (projections[0].bias is None) for p in projections[:3]):
            return None
        if (projections[4].bias is None) != (projections[5].bias is None):
            return None
    return inner.layers


def fuse_projections(model: nn.Module, previous: list[FusedLayer] | None = None) -> list[FusedLayer] | None:
    """Stack each layer's q/k/v and gate/up parameters into one buffer each (see the module
    docstring); ``previous`` is reused while its buffers still hold the parameters. ``None`` for
    models of other kinds."""
    layers = _supported_layers(model)
    if layers is None:
        return None
    if previous is not None and all(layer.holds_its_parameters() for layer in previous):
        return previous
    fused = []
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = stack_linears((attention.q_proj, attention.k_proj, attention.v_proj))
        gate_up = stack_linears((mlp.gate_proj, mlp.up_proj))
        fused.append(FusedLayer(layer, qkv, gate_up))
    return fused


def down_parts_apply(layers: list[FusedLayer], parts: int) -> bool:
    """Whether every layer's down projection can be computed in ``parts`` slices of its input by
    :func:`residual_plus_parts`: half-precision weights (fp32 outputs of half products are what
    ``out_dtype`` offers) and an input size that ``parts`` divides."""
    return all(
        fused.layer.mlp.down_proj.weight.dtype in (torch.bfloat16, torch.float16)
        and fused.layer.mlp.down_proj.in_features % parts == 0
        for fused in layers
    )


def residual_plus_parts(hidden: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, parts: int) -> Tensor:
    """``hidden + x @ weight^T (+ bias)`` with the product as ``parts`` products over consecutive
    slices of ``x``'s last dimension, each in fp32 (one ``bmm``), summed with ``hidden`` in fp32 and
    rounded once to ``hidden``'s dtype. ``weight`` ``[N, K]`` is read in place (a view per slice).
    On CUDA the fp32 products come from cuBLAS's half-precision ``bmm`` (``out_dtype``); elsewhere,
    where PyTorch has no such ``bmm``, from an fp32 ``bmm`` of the same values."""
    n, k = weight.shape
    rows = x.reshape(-1, parts, k // parts).transpose(0, 1)  # [S, M, K/S]
    slices = weight.view(n, parts, k // parts).permute(1, 2, 0)  # [S, K/S, N]
    if x.device.type == "cuda":
        products = torch.bmm(rows, slices, out_dtype=torch.float32)
    else:
        products = torch.bmm(rows.float(), slices.float())
    total = products.sum(0) if bias is None else products.sum(0) + bias.float()
    return (hidden.float() + total.view(hidden.shape)).to(hidden.dtype)


QKV_KERNEL_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""``config.model_type`` values whose q/k/v step can run on ``grpo_lightning.rollout.engine.kernels.qkv``."""


def qkv_kernel_applies(model: nn.Module, layers: list[FusedLayer]) -> bool:
    """Whether ``grpo_lightning.rollout.engine.kernels.qkv`` can compute the start of ``model``'s decode layers: a
    model type of ``QKV_KERNEL_MODEL_TYPES`` with input norms of the Llama kind (``weight``,
    ``variance_epsilon``) and a head dimension of 32, 64, 128 or 256 (half a head is one block of
    ``tl.dot``)."""
    if model.config.model_type not in QKV_KERNEL_MODEL_TYPES:
        return False
    for fused in layers:
        norm = fused.layer.input_layernorm
        if not (type(norm).__name__.endswith("RMSNorm") and hasattr(norm, "variance_epsilon")):
            return False
        if fused.layer.self_attn.head_dim not in (32, 64, 128, 256):
            return False
    return True


class FusedDecoder:
    """``model``'s forward pass for one token per row, on a ``transformers`` static cache, with the
    projections of :func:`fuse_projections`; returns the logits ``[B, V]`` in the model's dtype.
    :meth:`prefill` is the same layers' pass over the prompts.

    With ``qkv_kernel`` each layer's norm, q/k/v product, rotary embedding and cache write are one
    Triton kernel (``grpo_lightning.rollout.engine.kernels.qkv``; the caller checks :func:`qkv_kernel_applies`);
    otherwise they are the model's own modules around the fused product.

    With ``down_parts`` ``S > 1`` a decode step computes each down product as ``S`` fp32 products
    over slices of its input (:func:`residual_plus_parts`), which the residual sum adds up: on CUDA
    cuBLAS otherwise splits this product over K itself and adds the parts in a kernel of its own
    (see :func:`down_parts_apply`)."""

    def __init__(self, model: nn.Module, layers: list[FusedLayer], qkv_kernel: bool = False, down_parts: int = 1) -> None:
        if down_parts > 1 and not down_parts_apply(layers, down_parts):
            raise ValueError(
                f"down_parts={down_parts} needs bf16 or fp16 down projections whose input size it divides; "
                "use down_parts=1"
            )
        self.model = model
        self.inner = model.model
        self.layers = layers
        self.down_parts = down_parts
        # The model's own rotary helper: the module that defines its attention layer has it.
        self.apply_rotary = sys.modules[type(layers[0].layer.self_attn).__module__].apply_rotary_pos_emb
        self.qkv_kernel = qkv_kernel
        if qkv_kernel:
            from grpo_lightning.rollout.engine.kernels import qkv as kernel

            self.kernel = kernel

    def __call__(
        self, input_ids: Tensor, mask: Tensor, position_ids: Tensor, cache: Any, cache_position: Tensor,
        layer_step: Callable | None = None,
    ) -> Tensor:
        """The logits ``[B, V]`` of one token per row. ``layer_step``: :meth:`decode_layer` or a
        compiled copy of it (compiled once, the same code for every layer), where the cache has
        ``layers`` (transformers 5)."""
        hidden = self.inner.embed_tokens(input_ids)  # [B, 1, H]
        cos, sin = self.inner.rotary_emb(hidden, position_ids)
        cache_layers = getattr(cache, "layers", None)
        for index, fused in enumerate(self.layers):
            if cache_layers is not None:
                hidden = (layer_step or FusedDecoder.decode_layer)(self, fused, hidden, cos, sin, cache_layers[index], cache_position, mask)
            else:
                query, key, value = self._project_qkv(fused, hidden, cos, sin)
                keys, values = cache.update(key, value, index, {"cache_position": cache_position})
                hidden = self._layer_rest(fused, hidden, query, keys, values, mask)
        hidden = self.inner.norm(hidden)
        return self.model.get_output_embeddings()(hidden[:, -1])

    def decode_layer(
        self, fused: FusedLayer, hidden: Tensor, cos: Tensor, sin: Tensor, cache_layer: Any, cache_position: Tensor, mask: Tensor
    ) -> Tensor:
        """One layer of a decode step: its keys and values written to ``cache_layer`` at ``cache_position``."""
        if self.qkv_kernel:
            query, keys, values = self._kernel_qkv(fused, hidden[:, 0], cos[:, 0], sin[:, 0], cache_layer, cache_position)
        else:
            query, key, value = self._project_qkv(fused, hidden, cos, sin)
            keys, values = cache_layer.update(key, value, {"cache_position": cache_position})
        return self._layer_rest(fused, hidden, query, keys, values, mask)

    def prefill(
        self, input_ids: Tensor, mask: Tensor, position_ids: Tensor, cache: Any, cache_position: Tensor, rows: Tensor,
        layer_step: Callable | None = None,
    ) -> Tensor:
        """The forward pass of prompts ``input_ids`` ``[P, S]`` (a GRPO batch's distinct prompts); row
        ``i`` of the cache gets the keys and values of prompt ``rows[i]``, at slots ``cache_position``
        ``[S]``. Attention is over the prompts' own keys, with ``mask`` ``[P, 1, S, S]``. Returns the
        logits ``[P, V]`` of the last position. ``layer_step``: :meth:`prefill_layer` or a compiled copy."""
        hidden = self.inner.embed_tokens(input_ids)  # [P, S, H]
        cos, sin = self.inner.rotary_emb(hidden, position_ids)
        for cache_layer, fused in zip(cache.layers, self.layers, strict=True):
            hidden = (layer_step or FusedDecoder.prefill_layer)(self, fused, hidden, cos, sin, cache_layer, cache_position, mask, rows)
        hidden = self.inner.norm(hidden[:, -1:])
        return self.model.get_output_embeddings()(hidden[:, -1])

    def prefill_layer(
        self, fused: FusedLayer, hidden: Tensor, cos: Tensor, sin: Tensor, cache_layer: Any, cache_position: Tensor,
        mask: Tensor, rows: Tensor,
    ) -> Tensor:
        """One layer of :meth:`prefill`."""
        query, key, value = self._project_qkv(fused, hidden, cos, sin)
        cache_layer.update(key[rows], value[rows], {"cache_position": cache_position})
        return self._layer_rest(fused, hidden, query, key, value, mask)

    def _layer_rest(self, fused: FusedLayer, hidden: Tensor, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
        """The layer after its q/k/v: attention, ``o_proj`` and the residual sum, then the MLP."""
        layer = fused.layer
        attention = layer.self_attn
        out, _ = gqa_sdpa_attention_forward(attention, query, keys, values, mask, scaling=attention.scaling)
        hidden = hidden + attention.o_proj(out.reshape(*hidden.shape[:2], -1))
        gate, up = fused.gate_up(layer.post_attention_layernorm(hidden))
        down, activated = layer.mlp.down_proj, layer.mlp.act_fn(gate) * up
        if self.down_parts > 1 and hidden.shape[1] == 1:
            return residual_plus_parts(hidden, activated, down.weight, down.bias, self.down_parts)
        return hidden + down(activated)

    def _project_qkv(self, fused: FusedLayer, hidden: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The query, key and value ``[B, heads, S, D]`` of ``hidden`` ``[B, S, H]``, through the
        model's modules: the norm, the fused product, (Qwen3) the per-head norms, the rotary embedding."""
        layer = fused.layer
        attention = layer.self_attn
        shape = (*hidden.shape[:2], -1, attention.head_dim)
        query, key, value = fused.qkv(layer.input_layernorm(hidden))
        query, key, value = query.view(shape), key.view(shape), value.view(shape)
        if hasattr(attention, "q_norm"):  # Qwen3: each head's query and key normalised
            query, key = attention.q_norm(query), attention.k_norm(key)
        query, key = self.apply_rotary(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
        return query, key, value.transpose(1, 2)

    def _kernel_qkv(
        self, fused: FusedLayer, hidden: Tensor, cos: Tensor, sin: Tensor, cache_layer: Any, cache_position: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The same through ``grpo_lightning.rollout.engine.kernels.qkv``, for ``hidden``, ``cos`` and ``sin`` ``[B, H]``
        and ``[B, D]``; the keys and values are written to the cache layer's tensors in place, at
        ``cache_position`` (the engine resets the cache, and any count of its own, at each prefill)."""
        norm = fused.layer.input_layernorm
        gained, squares = self.kernel.gain_inputs(hidden, norm.weight)
        keys, values = cache_layer.keys, cache_layer.values
        q_heads = fused.qkv.sizes[0] // fused.layer.self_attn.head_dim
        query = self.kernel.gained_qkv_rope(
            gained, squares, norm.variance_epsilon, fused.qkv.weight, fused.qkv.bias, cos, sin, keys, values,
            cache_position, q_heads,
        )  # fmt: skip
        return query.unsqueeze(2), keys, values
