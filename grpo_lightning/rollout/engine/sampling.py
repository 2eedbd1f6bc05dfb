"""Token draws of a decode step: temperature, top-k and top-p sampling without host synchronisation.

Three draws of one token per row, each suited to a device or a caller:

* :func:`exponential_race_sample` (CUDA, default generator): ``argmax(p / E)`` with
  ``E ~ Exponential(1)``, which picks token ``i`` with probability ``p[i]`` (the Gumbel-max trick in
  another form);
* :func:`cumulative_count_sample` (CPU, default generator): one uniform per row located in the
  cumulative distribution, as a CPU generates random numbers more slowly than it scans;
* :func:`inverse_cdf_sample` (keyed sampling, any device): the same location in two short scans
  that ``torch.compile`` can generate code for.

*Keyed* sampling draws row ``b``'s token ``t`` from :func:`keyed_uniforms`, a counter-based hash of
the row's key and ``t``, so a row's completion does not depend on the other rows of the batch nor on
the device it runs on.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

def sample_tokens(
    logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, uniforms: Tensor | None = None
) -> Tensor:
    """One token per row of ``logits`` ``[B, V]``; no host synchronisation, safe inside a CUDA graph.

    ``temperature == 0`` is greedy (argmax). Otherwise the distribution is ``softmax(logits /
    temperature)`` restricted to the ``top_k`` most likely tokens (``0`` keeps all; ties at the
    k-th value are kept) and then to the nucleus: the most likely tokens whose preceding mass is below
    ``top_p`` (the most likely token is always kept).

    Without ``uniforms`` the draw uses the default generator of the device, so ``torch.manual_seed``
    makes it reproducible: exponential races on CUDA, one uniform per row and the cumulative
    distribution on a CPU. With ``uniforms`` ``[B]`` in ``[0, 1)`` (e.g. :func:`keyed_uniforms`) row
    ``b`` takes the token where ``uniforms[b]`` falls in the cumulative distribution (inverse-CDF
    sampling): the token of a row then depends on that row alone.
    """
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.size(-1):
        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if uniforms is not None:
        return inverse_cdf_sample(logits.softmax(dim=-1), uniforms)
    if logits.device.type == "cpu":
        # One uniform per row: Inductor's CPU code draws random numbers slowly, and a race needs
        # one per token.
        return cumulative_count_sample(logits, torch.rand(logits.size(0), device=logits.device))
    return exponential_race_sample(logits)


def draw_tokens(
    logits: Tensor, blocked: Tensor, sampling: Any, uniforms: Tensor | None, with_logprobs: bool
) -> tuple[Tensor, Tensor | None]:
    """:func:`sample_tokens` from fp32 ``logits`` ``[B, V]`` with the ``blocked`` tokens (``[V]`` or
    ``[B, V]``) excluded, with the ``temperature``, ``top_k`` and ``top_p`` of ``sampling``. With
    ``with_logprobs`` also the tokens' log-probabilities under ``softmax(logits / temperature)``
    (temperature 1 when greedy) before top-k, top-p and the block, as a teacher-forced forward pass
    computes them; else ``None``."""
    token = sample_tokens(
        logits.masked_fill(blocked, float("-inf")), sampling.temperature, sampling.top_k, sampling.top_p, uniforms
    )
    if not with_logprobs:
        return token, None
    tempered = logits if sampling.temperature in (0, 1) else logits / sampling.temperature
    return token, tempered.gather(1, token.unsqueeze(1)).squeeze(1) - tempered.logsumexp(dim=-1)


def exponential_race_sample(logits: Tensor) -> Tensor:
    """One token per row of ``softmax(logits)`` ``[B, V]`` by exponential races: ``argmax(p / E)``
    with ``E ~ Exponential(1)`` draws from ``p``. As ``p`` is proportional to ``exp(logits)``, that is
    ``argmax(logits - log E)``: one pass over the logits, no softmax. ``E = -log(U)``,
    ``U ~ Uniform[0, 1)`` (faster than ``exponential_`` on a CPU); ``U = 0`` gives
    ``E = inf``, a score of ``-inf``, never NaN."""
    noise = torch.rand_like(logits).log_().neg_()
    return (logits - noise.log_()).argmax(dim=-1)


def cumulative_count_sample(logits: Tensor, uniforms: Tensor) -> Tensor:
    """Row ``b`` of ``logits`` ``[B, V]`` takes the token where ``uniforms[b]`` (in ``[0, 1)``) falls in
    the cumulative distribution of ``softmax(logits)``: the number of tokens whose cumulative
    (unnormalised) mass is at most the target. One pass and one short scan over the vocabulary; for
    a CPU (on CUDA, :func:`inverse_cdf_sample` splits the scan in blocks that Inductor can generate).
    A token of probability zero is never drawn."""
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp()
    cdf = weights.cumsum(dim=-1)
    target = uniforms.to(cdf.dtype).unsqueeze(1) * cdf[:, -1:]
    return torch.minimum((cdf <= target).sum(dim=-1), last_positive(weights))


#: Tokens per block of :func:`inverse_cdf_sample`'s first level.
INVERSE_CDF_BLOCK = 1024


def last_positive(values: Tensor) -> Tensor:
    """Index of the last entry > 0 along the last dimension (0 if there is none)."""
    positive = (values > 0).flip(-1).int()
    return values.size(-1) - 1 - positive.argmax(dim=-1)


def inverse_cdf_sample(probs: Tensor, uniforms: Tensor, block: int = INVERSE_CDF_BLOCK) -> Tensor:
    """Row ``b`` of ``probs`` ``[B, V]`` takes the token where ``uniforms[b]`` (in ``[0, 1)``) falls in
    its cumulative distribution, found in two levels: the block of ``block`` tokens whose cumulative
    mass crosses the target, then the token inside that block. The same draw as one cumulative
    sum over the whole vocabulary (up to rounding), but every scan is short: Inductor cannot
    generate code for a scan over a whole vocabulary of ~150k tokens, so a compiled decode step
    can keep its sampling compiled. A token of probability zero
    is never drawn, even where rounding puts the target at or past the total mass.
    """
    rows, vocab = probs.shape
    blocks = -(-vocab // block)
    per_block = torch.nn.functional.pad(probs, (0, blocks * block - vocab)).view(rows, blocks, block)
    block_mass = per_block.sum(dim=-1)  # [B, blocks]
    block_cdf = block_mass.cumsum(dim=-1)
    target = uniforms.to(probs.dtype) * block_cdf[:, -1]
    # The first block whose cumulative mass exceeds the target (never one of zero mass) ...
    chosen = torch.searchsorted(block_cdf, target.unsqueeze(1), right=True).squeeze(1)
    chosen = torch.minimum(chosen, last_positive(block_mass))
    before = (block_cdf - block_mass).gather(1, chosen.unsqueeze(1)).squeeze(1)
    inside = per_block.gather(1, chosen.view(rows, 1, 1).expand(rows, 1, block)).squeeze(1)  # [B, block]
    # ... then the first token in it whose cumulative mass exceeds the target.
    cdf = inside.cumsum(dim=-1) + before.unsqueeze(1)
    token = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
    return chosen * block + torch.minimum(token, last_positive(inside))


_MASK32 = 0xFFFFFFFF


def _mul32(x: Tensor, factor: int) -> Tensor:
    """``x * factor mod 2**32`` for ``x`` in ``[0, 2**32)`` held in int64, without int64 overflow."""
    low = x * (factor & 0xFFFF)
    high = ((x * (factor >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) with good avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniforms(keys: Tensor, counter: Tensor) -> Tensor:
    """``[B]`` numbers in ``(0, 1)``, a hash of each row's 64-bit ``keys`` ``[B]`` and ``counter``
    (e.g. the index of the token being sampled): counter-based random numbers, the same for a row
    whatever the other rows of the batch are."""
    h = _mix32(keys & _MASK32)
    h = _mix32(h ^ ((keys >> 32) & _MASK32))
    h = _mix32(h ^ (counter & _MASK32))
    return ((h >> 8).float() + 0.5) / 2**24
