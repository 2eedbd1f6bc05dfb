"""Per-token log-probabilities and entropy of completions under a causal LM.

The full ``[N, T, V]`` logits of a micro-batch are never turned into fp32 at once: the LM head
output is kept to the completion positions (``logits_to_keep``) and the fp32 log-softmax runs over
chunks of rows, so the extra memory is ``chunk_rows x T x V`` floats (by default about 256 MB).

With ``fused_head`` (models whose logits are exactly ``lm_head(hidden)``, not sharded) the LM head
itself runs chunk by chunk inside the log-softmax: ``[N, T, V]`` logits never exist, in the model's
dtype either, and the backward pass recomputes each chunk's logits from the hidden states.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from grpo_lightning.models.compiled_layers import checkpoints_activations, layers_compiled, repeated_layers
from grpo_lightning.algorithms.functional import left_padding_last, position_ids_from_mask
from grpo_lightning.runtime.strategies import is_sharded

#: fp32 elements converted at a time when ``chunk_rows`` is not given (256 MB).
CHUNK_ELEMENTS = 2**26
#: The fused head's backward pass takes vocabulary blocks of a multiple of this many columns: a
#: block starting at an unaligned row of the weight makes cuBLAS fall back to slow kernels
#: (benchmarks/JOURNAL.md).
_COLUMN_ALIGNMENT = 64
#: The compiled model's passes see the sequence width rounded up to a multiple of this (the next one
#: above): a batch a few tokens shorter than the last (no completion ran to the limit) reuses its graph
#: rather than recompiling in the middle of a fit, which took 7 s of a one-minute SmolLM2 fit
#: (benchmarks/JOURNAL.md).
COMPILED_WIDTH_MULTIPLE = 16


def _chunk_forward(
    logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None, Tensor]:
    """fp32 log-prob of ``targets``, (optionally) the entropy of ``softmax(logits / temperature)``,
    and the log-normaliser ``logsumexp(logits / temperature)``."""
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    log_norm = torch.logsumexp(scaled, dim=-1)
    logp = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    if not with_entropy:
        return logp, None, log_norm
    probs = torch.exp(scaled - log_norm.unsqueeze(-1))
    return logp, log_norm - (probs * scaled).sum(-1), log_norm


def _chunk_backward(logits: Tensor, targets: Tensor, upstream: Tensor, temperature: float) -> Tensor:
    """Gradient of ``sum(upstream * logp)`` with respect to ``logits``: ``(onehot - p) * upstream / T``."""
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    grad = torch.softmax(scaled, dim=-1) * -upstream.unsqueeze(-1)
    grad = grad.scatter_add(-1, targets.unsqueeze(-1), upstream.unsqueeze(-1))
    return (grad if temperature == 1.0 else grad / temperature).to(logits.dtype)


def _columns_backward(
    logits: Tensor, log_norm: Tensor, targets: Tensor, upstream: Tensor, temperature: float, first: int
) -> Tensor:
    """:func:`_chunk_backward` for the vocabulary columns ``first .. first + C`` of the logits
    ``[tokens, C]``: the softmax normalised by the whole vocabulary's ``log_norm`` (saved by the
    forward pass), the one-hot term only where a target falls inside the block."""
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    grad = torch.exp(scaled - log_norm.unsqueeze(-1)) * -upstream.unsqueeze(-1)
    local = targets - first
    inside = (local >= 0) & (local < logits.shape[-1])
    grad = grad.scatter_add(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1), (upstream * inside).unsqueeze(-1))
    return (grad if temperature == 1.0 else grad / temperature).to(logits.dtype)


_EAGER = (_chunk_forward, _chunk_backward, _columns_backward)


class _Kernels:
    """The chunk functions, compiled with ``torch.compile`` on first use when asked (CUDA only):
    Inductor fuses each into a few passes over the logits, where eager PyTorch makes one pass per
    operation. A compiler failure is warned about once and the eager functions are used from then on."""

    def __init__(self) -> None:
        self.compiled: tuple | None = None
        self.failed = False

    def get(self, compiled: bool, device: torch.device) -> tuple:
        if not compiled or device.type != "cuda" or self.failed:
            return _EAGER
        if self.compiled is None:
            self.compiled = tuple(torch.compile(function, dynamic=True) for function in _EAGER)
        return self.compiled

    def run(self, index: int, compiled: bool, *args):
        functions = self.get(compiled, args[0].device)
        try:
            return functions[index](*args)
        except Exception as error:  # noqa: BLE001 - any compiler failure: eager from now on
            if functions[index] in _EAGER:
                raise
            warnings.warn(f"torch.compile of the log-prob kernels failed, running them eagerly: {error!r}", stacklevel=3)
            self.failed = True
            return _EAGER[index](*args)


_KERNELS = _Kernels()


class _SelectedLogProbs(torch.autograd.Function):
    """``log softmax(logits / temperature)[target]`` and the entropy, chunked over rows in fp32.

    Only the input logits (in their own dtype) are kept for the backward pass, which recomputes
    the softmax chunk by chunk: ``d logp_t / d logits_t = (onehot(target_t) - p_t) / temperature``.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_rows: int, with_entropy: bool, compiled: bool):
        rows = logits.shape[0]
        logp = logits.new_empty(logits.shape[:-1], dtype=torch.float32)
        entropy = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
        for start in range(0, rows, chunk_rows):
            chunk = slice(start, start + chunk_rows)
            logp[chunk], chunk_entropy, _ = _KERNELS.run(0, compiled, logits[chunk], targets[chunk], temperature, with_entropy)
            if with_entropy:
                entropy[chunk] = chunk_entropy
        ctx.save_for_backward(logits, targets)
        ctx.temperature, ctx.chunk_rows, ctx.compiled = temperature, chunk_rows, compiled
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        logits, targets = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            grad_logits[rows] = _KERNELS.run(1, ctx.compiled, logits[rows], targets[rows], grad_logp[rows], ctx.temperature)
        return grad_logits, None, None, None, None, None


class _LinearSelectedLogProbs(torch.autograd.Function):
    """``log softmax(hidden @ weight.T / temperature)[target]`` and the entropy, over chunks of tokens.

    Keeps only ``hidden``, ``weight``, the targets and each token's fp32 log-normaliser for the
    backward pass, which recomputes the logits ``z = h W^T`` one block of vocabulary columns at a
    time (for all tokens) and backpropagates ``g_z = (onehot - p) g / T`` (as in
    :class:`_SelectedLogProbs`, with ``p`` normalised by the saved log-normaliser):
    ``g_W[block] = g_z^T h`` is written in one matrix product per block, so no buffer of the
    weight's size is accumulated, and ``g_h = sum over blocks of g_z W[block]`` accumulates in fp32.
    A block holds as many logits as a forward chunk. The logits' dtype is the forward's (autocast's,
    if on), and the backward computes in that same dtype.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk_tokens: int, with_entropy: bool, compiled: bool):
        tokens = hidden.shape[0]
        logp = hidden.new_empty(tokens, dtype=torch.float32)
        log_norm = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
        ctx.logits_dtype = hidden.dtype
        for start in range(0, tokens, chunk_tokens):
            chunk = slice(start, start + chunk_tokens)
            logits = hidden[chunk] @ weight.T
            ctx.logits_dtype = logits.dtype
            logp[chunk], chunk_entropy, log_norm[chunk] = _KERNELS.run(0, compiled, logits, targets[chunk], temperature, with_entropy)
            if with_entropy:
                entropy[chunk] = chunk_entropy
        ctx.save_for_backward(hidden, weight, targets, log_norm)
        ctx.temperature, ctx.chunk_elements, ctx.compiled = temperature, chunk_tokens * weight.shape[0], compiled
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        hidden, weight, targets, log_norm = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[:2]
        low_hidden, low_weight = hidden.to(ctx.logits_dtype), weight.to(ctx.logits_dtype)
        accumulate = torch.promote_types(hidden.dtype, torch.float32)
        grad_hidden = torch.zeros_like(hidden, dtype=accumulate) if need_hidden else None
        grad_weight = torch.empty_like(weight) if need_weight else None
        columns = max(1, ctx.chunk_elements // max(1, hidden.shape[0]))
        if columns > _COLUMN_ALIGNMENT:  # blocks that start at aligned rows of the weight get fast GEMM kernels
            columns -= columns % _COLUMN_ALIGNMENT
        for first in range(0, weight.shape[0], columns):
            block = slice(first, first + columns)
            logits = low_hidden @ low_weight[block].T
            grad_logits = _KERNELS.run(2, ctx.compiled, logits, log_norm, targets, grad_logp, ctx.temperature, first)
            if need_hidden:
                grad_hidden += grad_logits @ low_weight[block]
            if need_weight:
                grad_weight[block] = grad_logits.T @ low_hidden
        if grad_hidden is not None:
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def linear_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
    with_entropy: bool = True,
    compiled: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """:func:`token_logprobs_from_logits` of ``logits = hidden @ weight.T``, the LM head fused in.

    Args:
        hidden: ``[..., H]`` final hidden states (e.g. ``[N, T, H]``, or ``[tokens, H]``); each
            predicts the target at the same index of ``targets`` ``[...]``.
        weight: ``[V, H]`` LM head weight (no bias).
        chunk_tokens: tokens whose logits exist at a time; by default as many as fit in
            ``CHUNK_ELEMENTS`` logits.

    Returns:
        ``(logp, entropy)`` of the shape of ``targets``, fp32; ``entropy`` carries no gradient.
    """
    if chunk_tokens is None:
        chunk_tokens = max(1, CHUNK_ELEMENTS // weight.shape[0])
    logp, entropy = _LinearSelectedLogProbs.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), float(temperature), chunk_tokens, with_entropy, compiled
    )
    return logp.view(targets.shape), entropy.view(targets.shape) if with_entropy else None


#: Model types whose causal-LM logits are exactly ``lm_head(final hidden state)`` (no soft-capping
#: or scaling after the head), so that :func:`completion_logprobs` may fuse the head.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "smollm3"})


def plain_lm_head(model: nn.Module) -> nn.Linear | None:
    """The model's output projection if its logits are exactly ``lm_head(hidden)`` and the head can
    be called apart from the model (a known model type, no bias, not sharded); else ``None``."""
    if isinstance(model, FullyShardedDataParallel) or not isinstance(model, PreTrainedModel):
        return None
    head = model.get_output_embeddings()
    if (
        model.config.model_type not in PLAIN_HEAD_MODEL_TYPES
        or model.base_model is model
        or type(head) is not nn.Linear
        or head.bias is not None
        or isinstance(head.weight, DTensor)
    ):
        return None
    return head


def token_logprobs_from_logits(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    with_entropy: bool = True,
    compiled: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target token and the entropy of each predictive distribution.

    Args:
        logits: ``[N, T, V]`` in any dtype; position ``t`` predicts ``targets[:, t]``.
        targets: ``[N, T]`` token ids.
        temperature: the sampling temperature; the distribution is ``softmax(logits / temperature)``.
        chunk_rows: rows converted to fp32 at a time (forward and backward); by default as many
            as fit in ``CHUNK_ELEMENTS`` floats (one row of a 150k vocabulary x 256 tokens is 39M).
        with_entropy: compute the entropy (two more passes over the logits); else it is ``None``.
        compiled: on CUDA, run the per-chunk fp32 arithmetic as ``torch.compile``-fused kernels.

    Returns:
        ``(logp, entropy)``, both fp32 ``[N, T]``; ``entropy`` carries no gradient.
    """
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))
    logp, entropy = _SelectedLogProbs.apply(logits, targets, float(temperature), chunk_rows, with_entropy, compiled)
    return logp, entropy if with_entropy else None


def _hidden_states(model: nn.Module, inputs: dict) -> Tensor:
    return model.base_model(**inputs, use_cache=False).last_hidden_state


def _logits(model: nn.Module, inputs: dict, logits_to_keep: int | Tensor) -> Tensor:
    return model(**inputs, use_cache=False, logits_to_keep=logits_to_keep).logits


class _ModelForwards:
    """The model calls of the log-prob passes, compiled with ``torch.compile`` when asked: Inductor
    fuses each decoder layer's normalisations, rotary embedding, activation and residual additions
    (dozens of element-wise kernels per layer in eager mode) in the forward and the backward pass,
    and saves fewer intermediate tensors for the backward. Compilation is regional: one decoder
    layer is compiled and its code runs every layer, of the policy and of the reference model alike
    (:func:`~grpo_lightning.models.compiled_layers.layers_compiled`), so compile time does not grow with
    depth; a model without repeated layers is compiled whole. Sharded models run eagerly. A compiler
    failure in the forward pass is warned about once and the model runs eagerly from then on."""

    def __init__(self) -> None:
        self.compiled: dict = {}
        self.failed = False

    def run(self, function, compiled: bool, model: nn.Module, *args):
        if not compiled or self.failed or is_sharded(model):
            return function(model, *args)
        # Gradient checkpointing recomputes layers after the context: they are compiled with the whole pass.
        layers = None if checkpoints_activations(model) else repeated_layers(model)
        if layers is None and function not in self.compiled:
            self.compiled[function] = torch.compile(function)
        try:
            if layers is None:
                return self.compiled[function](model, *args)
            with layers_compiled(layers):
                return function(model, *args)
        except Exception as error:  # noqa: BLE001 - any compiler failure: eager from now on
            warnings.warn(f"torch.compile of the model's forward failed, running it eagerly: {error!r}", stacklevel=3)
            self.failed = True
            return function(model, *args)


_FORWARDS = _ModelForwards()


def supports_packed_sequences() -> bool:
    """Whether the installed transformers tells packed sequences apart by their position ids
    (each restarting at 0) when no attention mask is given: what ``packed=True`` relies on."""
    from transformers import masking_utils

    return hasattr(masking_utils, "find_packed_sequence_indices")


def completion_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    with_entropy: bool = True,
    compiled: bool = False,
    fused_head: bool = False,
    packed: bool = False,
    compiled_model: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced log-probs of ``completion_ids`` given left-padded ``prompt_ids``.

    Shapes: prompts ``[N, S]``, completions ``[N, T]``; returns ``(logp, entropy)`` of ``[N, T]``
    (``entropy`` is ``None`` unless ``with_entropy``), 0 where ``completion_mask`` is 0.

    ``fused_head``: where :func:`plain_lm_head` finds the head, run it inside the chunked
    log-softmax (:func:`linear_token_logprobs`), and only at the completion tokens that count: the
    padding after an EOS costs no LM head work.

    ``packed``: the rows' tokens without their padding (the prompts' left padding, the completions'
    after EOS) go through the model as one sequence, each row's position ids restarting at 0 and no
    attention mask, so padding costs no work at all. The model's attention must keep the rows apart
    (transformers detects the packing from the position ids, :func:`supports_packed_sequences`):
    ``flash_attention_2`` and ``flex_attention`` then attend within each row only; ``sdpa`` and
    ``eager`` use a dense block-diagonal mask over the whole packed sequence, correct but with
    attention cost growing with its squared length.

    ``compiled_model``: run the model's forward (and so its backward) through ``torch.compile``
    (:class:`_ModelForwards`), the completions padded by 1 to :data:`COMPILED_WIDTH_MULTIPLE` columns
    to a width that is a multiple of it; sharded models run eagerly.

    A PEFT model runs as the Hugging Face model inside it, whose layers hold the adapters (and
    honour ``disable_adapter``): the fused head and packing then apply as to any model.
    """
    if hasattr(model, "get_base_model") and hasattr(model, "disable_adapter"):
        model = model.get_base_model()
    width = completion_ids.size(1)
    if compiled_model and not packed and not _FORWARDS.failed and not is_sharded(model):
        # At least one column of padding: a mask that is never all ones, which transformers would drop,
        # tracing the layer again without one.
        extra = COMPILED_WIDTH_MULTIPLE - (prompt_ids.size(1) + width) % COMPILED_WIDTH_MULTIPLE
        completion_ids, completion_mask = (nn.functional.pad(t, (0, extra)) for t in (completion_ids, completion_mask))
    logp, entropy = _completion_logprobs(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature, chunk_rows, with_entropy,
        compiled, fused_head, packed, compiled_model,
    )  # fmt: skip
    return logp[:, :width], None if entropy is None else entropy[:, :width]


def _completion_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float,
    chunk_rows: int | None,
    with_entropy: bool,
    compiled: bool,
    fused_head: bool,
    packed: bool,
    compiled_model: bool,
) -> tuple[Tensor, Tensor | None]:
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    completion_length = completion_ids.size(1)
    counted = completion_mask.bool()
    if not packed:  # no position attends to nothing (NaN gradients from some attention kernels)
        order, shift = left_padding_last(attention_mask, most=prompt_ids.size(1) - 1)
        input_ids, attention_mask = input_ids.gather(1, order), attention_mask.gather(1, order)
    position_ids = position_ids_from_mask(attention_mask)
    head = plain_lm_head(model) if fused_head else None
    if head is None and not packed:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        # Row i's completion starts ``shift[i]`` columns earlier: keep the logits of every row's
        # (reading the longest shift waits for the device once), then each row's own window.
        most = int(shift.max())
        logits = _FORWARDS.run(_logits, compiled_model, model, inputs, completion_length + 1 + most)
        logp, entropy = token_logprobs_from_logits(
            logits[:, :-1], input_ids[:, -completion_length - most :], temperature, chunk_rows, with_entropy, compiled
        )  # fmt: skip
        window = (most - shift)[:, None] + torch.arange(completion_length, device=shift.device)
        logp, entropy = logp.gather(1, window), None if entropy is None else entropy.gather(1, window)
        return logp.masked_fill(~counted, 0.0), None if entropy is None else entropy.masked_fill(~counted, 0.0)

    # Only the counted tokens from here on (selecting them waits for the device once).
    # The state at position t predicts token t + 1: these positions predict the counted tokens.
    predicts = torch.zeros_like(attention_mask, dtype=torch.bool)
    predicts[:, -completion_length - 1 : -1] = counted
    if packed:
        if (counted[:, 1:] & ~counted[:, :-1]).any():
            raise ValueError("packed log-probs need each row's completion_mask to be ones then zeros (no holes)")
        kept = attention_mask.bool()
        inputs = {"input_ids": input_ids[kept][None], "position_ids": position_ids[kept][None], "attention_mask": None}
        where = predicts[kept].nonzero().squeeze(1)  # in the packed sequence, row by row like ``counted``
    else:
        predicts = predicts.gather(1, order)  # in the order the model sees
        inputs = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": attention_mask}
    targets = completion_ids[counted]
    if head is not None:
        hidden = _FORWARDS.run(_hidden_states, compiled_model, model, inputs)
        hidden = hidden[0, where] if packed else hidden[predicts]
        logp, entropy = linear_token_logprobs(hidden, head.weight, targets, temperature, None, with_entropy, compiled)
    else:  # packed, unfused: logits at the predicting positions only
        logits = _FORWARDS.run(_logits, compiled_model, model, inputs, where)
        logp, entropy = token_logprobs_from_logits(logits, targets[None], temperature, chunk_rows, with_entropy, compiled)
        logp, entropy = logp[0], None if entropy is None else entropy[0]
    zeros = torch.zeros(counted.shape, dtype=torch.float32, device=counted.device)
    return zeros.masked_scatter(counted, logp), None if entropy is None else zeros.masked_scatter(counted, entropy)
