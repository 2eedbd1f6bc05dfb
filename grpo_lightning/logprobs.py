"""Per-token log-probabilities and entropy of completions under a causal LM.

The full ``[N, T, V]`` logits of a micro-batch are never turned into fp32 at once: the LM head
output is kept to the completion positions (``logits_to_keep``) and the fp32 log-softmax runs over
chunks of rows, so the extra memory is ``chunk_rows x T x V`` floats (by default about 256 MB).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

#: fp32 elements converted at a time when ``chunk_rows`` is not given (256 MB).
CHUNK_ELEMENTS = 2**26


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as ``generate`` assigns them: ``cumsum(mask) - 1``."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)


def _chunk_forward(logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """fp32 log-prob of ``targets`` and (optionally) the entropy of ``softmax(logits / temperature)``."""
    scaled = logits.float() / temperature
    log_norm = torch.logsumexp(scaled, dim=-1)
    logp = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    if not with_entropy:
        return logp, None
    probs = torch.exp(scaled - log_norm.unsqueeze(-1))
    return logp, log_norm - (probs * scaled).sum(-1)


def _chunk_backward(logits: Tensor, targets: Tensor, upstream: Tensor, temperature: float) -> Tensor:
    """Gradient of ``sum(upstream * logp)`` with respect to ``logits``: ``(onehot - p) * upstream / T``."""
    grad = torch.softmax(logits.float() / temperature, dim=-1) * -upstream.unsqueeze(-1)
    grad = grad.scatter_add(-1, targets.unsqueeze(-1), upstream.unsqueeze(-1))
    return (grad / temperature).to(logits.dtype)


class _Kernels:
    """The chunk functions, compiled with ``torch.compile`` on first use when asked (CUDA only):
    Inductor fuses each into a few passes over the logits, where eager PyTorch makes one pass per
    operation. A compiler failure is warned about once and the eager functions are used from then on."""

    def __init__(self) -> None:
        self.compiled: tuple | None = None
        self.failed = False

    def get(self, compiled: bool, device: torch.device) -> tuple:
        if not compiled or device.type != "cuda" or self.failed:
            return _chunk_forward, _chunk_backward
        if self.compiled is None:
            self.compiled = (torch.compile(_chunk_forward, dynamic=True), torch.compile(_chunk_backward, dynamic=True))
        return self.compiled

    def run(self, index: int, compiled: bool, *args):
        functions = self.get(compiled, args[0].device)
        try:
            return functions[index](*args)
        except Exception as error:  # noqa: BLE001 - any compiler failure: eager from now on
            if functions[index] in (_chunk_forward, _chunk_backward):
                raise
            warnings.warn(f"torch.compile of the log-prob kernels failed, running them eagerly: {error!r}", stacklevel=3)
            self.failed = True
            return (_chunk_forward, _chunk_backward)[index](*args)


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
            logp[chunk], chunk_entropy = _KERNELS.run(0, compiled, logits[chunk], targets[chunk], temperature, with_entropy)
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
) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced log-probs of ``completion_ids`` given left-padded ``prompt_ids``.

    Shapes: prompts ``[N, S]``, completions ``[N, T]``; returns ``(logp, entropy)`` of ``[N, T]``
    (``entropy`` is ``None`` unless ``with_entropy``).
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    completion_length = completion_ids.size(1)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=completion_length + 1,
    ).logits
    # The logit at position t predicts token t + 1: drop the last one.
    logits = logits[:, -completion_length - 1 : -1]
    return token_logprobs_from_logits(logits, completion_ids, temperature, chunk_rows, with_entropy, compiled)
