"""DPPO: "Rethinking the Trust Region in LLM Reinforcement Learning" (arXiv 2602.04879),
Divergence Proximal Policy Optimization.

A ratio clip over-penalises rare tokens (1e-5 -> 1e-3 is a ratio of 100) and under-penalises
likely ones (0.99 -> 0.8 is within it). DPPO bounds a divergence of the token's probability
instead, and drops a token that moved past the bound in the direction its advantage pushes; the
others keep the policy gradient, weighted by the truncated, detached ratio (TIS)::

    binary TV:  valid_it = (p - p_old <= eps_high) if A > 0 else (p - p_old >= -eps_low)
    binary KL:  D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))
                valid_it = (D <= eps_high or p <= p_old) if A > 0 else (D <= eps_low or p >= p_old)
    loss_it  = -valid_it * sg(min(r_it, c)) * A_i * log pi_it,    p = pi(o_it), r = pi / pi_old

``clip_eps_low`` / ``clip_eps_high`` are these divergence bounds, ``clip_ratio_c`` is ``c``. Defaults
are the authors' recipe (verl's example): TV 0.15 / 0.15, binary KL 0.05 / 0.05; ``c`` 20 (verl's
default); GRPO advantages; token mean; no KL term.
"""

from __future__ import annotations

from typing import Literal

from grpo_lightning.settings import require
from variants.grpo import GRPO

#: Divergence -> (surrogate, its default bound).
DIVERGENCES = {"tv": ("dppo_tv", 0.15), "kl": ("dppo_kl", 0.05)}


class DPPO(GRPO):
    """GRPO advantages; tokens past a probability-divergence bound dropped; token mean.

    Args:
        divergence: ``"tv"`` (binary total variation) or ``"kl"`` (binary KL).
        clip_eps_low, clip_eps_high: the divergence bounds; ``None``: the divergence's default.
        clip_ratio_c: the cap of the detached IS weight.
    """

    default_surrogate = "dppo_tv"
    default_aggregation = "token_mean"

    def __init__(self, model: str, *, divergence: Literal["tv", "kl"] = "tv", beta: float = 0.0,
                 clip_eps_low: float | None = None, clip_eps_high: float | None = None, clip_ratio_c: float = 20.0,
                 **kwargs) -> None:  # fmt: skip
        require(divergence in DIVERGENCES, f"divergence: {divergence!r} is not 'tv' or 'kl'.")
        surrogate, bound = DIVERGENCES[divergence]
        require(kwargs.get("surrogate") in (None, surrogate),
                f"divergence: {divergence} is the surrogate {surrogate}; drop --model.surrogate or --model.divergence.")  # fmt: skip
        kwargs["surrogate"] = None if divergence == "tv" else surrogate
        low = bound if clip_eps_low is None else clip_eps_low
        high = bound if clip_eps_high is None else clip_eps_high
        super().__init__(model, beta=beta, clip_eps_low=low, clip_eps_high=high, clip_ratio_c=clip_ratio_c, **kwargs)
        self.clip_ratio_c = clip_ratio_c
