"""Loss aggregations: the per-token loss ``[N, T]`` and its mask ``[N, T]`` -> the scalar loss.

Each takes the counts of the whole minibatch (``num_sequences``, ``num_tokens``: every micro-batch
and device) so that summing micro-batch results gives the minibatch's result, whatever the
micro-batch size; ``max_tokens`` is the completion length limit ``L``. The math is
:mod:`grpo_lightning.algorithms.functional`'s; here each gets the name it is selected by
(``--model.aggregation NAME``), by :func:`register_aggregation`, which registers a user's too.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.parts import Registry

#: Name -> aggregation ``(loss [N, T], mask [N, T], *, num_sequences, num_tokens, max_tokens) -> []``.
AGGREGATIONS = Registry("aggregation", "a function (loss, mask [N, T], *, num_sequences, num_tokens, max_tokens) -> []")


def register_aggregation(name: str | None = None) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Decorator: register an aggregation as ``--model.aggregation NAME`` (its ``__name__`` for
    ``None``). It must divide by the minibatch's counts it is given (``num_sequences``, ``num_tokens``:
    ``None`` for those of ``loss`` and ``mask``), so that the micro-batches' results sum to the minibatch's."""
    return AGGREGATIONS.decorator(name)


@register_aggregation()
def token_mean(loss: Tensor, mask: Tensor, *, num_sequences=None, num_tokens=None, max_tokens: int = 1) -> Tensor:
    """DAPO eq. 12: ``sum_it loss_it / sum_it |mask|`` (every token of the batch weighs the same)."""
    return F.token_mean(loss, mask, num_tokens=num_tokens)


@register_aggregation()
def seq_mean_token_mean(loss: Tensor, mask: Tensor, *, num_sequences=None, num_tokens=None, max_tokens: int = 1) -> Tensor:
    """GRPO (DeepSeekMath eq. 3): ``1/N sum_i 1/|o_i| sum_t loss_it``."""
    return F.sequence_mean_token_mean(loss, mask, num_sequences=num_sequences)


@register_aggregation()
def seq_mean_token_sum(loss: Tensor, mask: Tensor, *, num_sequences=None, num_tokens=None, max_tokens: int = 1) -> Tensor:
    """RLOO (a completion is one action): ``1/N sum_i sum_t loss_it``."""
    return F.sequence_mean_token_sum(loss, mask, num_sequences=num_sequences)


@register_aggregation()
def seq_mean_token_sum_norm(
    loss: Tensor, mask: Tensor, *, num_sequences=None, num_tokens=None, max_tokens: int = 1
) -> Tensor:
    """Dr. GRPO: ``1/(N L) sum_i sum_t loss_it``, a constant normaliser (no length bias)."""
    return F.constant_normalized_sum(loss, mask, max_tokens, num_sequences=num_sequences)

