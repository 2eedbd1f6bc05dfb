"""Training compute in FLOP-proportional units: an x-axis on which arms that sample, re-score or
update differently compare fairly.

A transformer of N parameters spends about 2N FLOPs per token of a forward pass and 4N per token of
a backward pass (Kaplan et al., 2020, "Scaling Laws for Neural Language Models", sec. 2.1: C = 6ND
for training). A GRPO step passes over its rollout's tokens (prompt, completion and any environment
tokens) several times: sampling (prefill and decode, one forward per token), the old-policy and
reference log-prob passes where they run, and a forward and backward per update epoch. The meter
counts those *token passes*, a backward counting as two, and ``perf/flops`` is 2N times their sum.

N counts the parameters that multiply activations: every parameter but the input embeddings (an
embedding lookup is no product), the output projection included even where it is tied to them.
Not counted: attention's sequence-length term, padding tokens, validation, a critic (PPO), and a
forward recomputed under gradient checkpointing (as model-FLOPs utilisation counts).
"""

from __future__ import annotations

import torch
from torch import Tensor


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters of ``model`` (a Hugging Face causal LM, possibly wrapped) that multiply
    activations: all but the input embeddings, plus the output projection if tied to them."""
    model = getattr(model, "module", model)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embedding_ids = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    total = sum(p.numel() for p in model.parameters() if id(p) not in embedding_ids)
    if head is not None and any(id(p) in embedding_ids for p in head.parameters()):
        total += sum(p.numel() for p in head.parameters())
    return int(total)


def policy_parameters(policy: torch.nn.Module) -> int:
    """N of ``policy``: as :func:`~grpo_lightning.models.policy.load_models` counted it before sharding, or
    counted now."""
    return getattr(policy, "matmul_parameters", None) or matmul_parameters(policy)


class ComputeMeter:
    """Token passes of training so far; :meth:`flops` turns them into FLOPs for a model of N
    parameters. Counts stay on the device until read, so counting adds no synchronisation."""

    def __init__(self) -> None:
        self.token_passes: Tensor | float = 0.0

    def add(self, tokens: Tensor | int, passes: float = 1.0) -> None:
        """``tokens`` processed ``passes`` times (a forward 1, a forward and backward 3)."""
        self.token_passes = self.token_passes + tokens * passes

    def add_forward(self, *masks: Tensor, backward: bool = False) -> None:
        """The real tokens of ``masks`` through one forward (and ``backward``: its backward too)."""
        self.add(sum(mask.sum() for mask in masks), 3.0 if backward else 1.0)

    def total(self) -> float:
        return float(self.token_passes)

    def flops(self, parameters: int) -> float:
        """2N FLOPs per token pass (:data:`token_passes` counts a backward as two)."""
        return 2.0 * parameters * self.total()

    def state_dict(self) -> dict[str, float]:
        return {"token_passes": self.total()}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.token_passes = float(state.get("token_passes", 0.0))
