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

``loss.clip_eps_low`` / ``loss.clip_eps_high`` are these divergence bounds, ``loss.clip_ratio_c`` is ``c``. Defaults
are the authors' recipe (verl's example): TV 0.15 / 0.15, binary KL 0.05 / 0.05; ``c`` 20 (verl's
default); GRPO advantages; token mean; no KL term.
"""

from __future__ import annotations

from typing import Literal

import dataclasses

from grpo_lightning.training.options import KLOptions, LossOptions
from grpo_lightning.training.settings import preset
from grpo_lightning.errors import require
from grpo_lightning.variants.grpo import GRPO

#: Divergence -> its surrogate (whose defaults are its bounds: TV 0.15, binary KL 0.05).
DIVERGENCES = {"tv": "dppo_tv", "kl": "dppo_kl"}


class DPPO(GRPO):
    """GRPO advantages; tokens past a probability-divergence bound dropped; token mean.

    Args:
        divergence: ``"tv"`` (binary total variation) or ``"kl"`` (binary KL).

    ``loss.clip_eps_low``, ``loss.clip_eps_high``: the divergence bounds; ``None``: the divergence's
    default. ``loss.clip_ratio_c``: the cap of the detached IS weight.
    """

    default_surrogate = "dppo_tv"
    default_aggregation = "token_mean"

    def __init__(self, model: str, *, divergence: Literal["tv", "kl"] = "tv",
                 loss: LossOptions = LossOptions(clip_eps_low=None, clip_eps_high=None, clip_ratio_c=20.0),
                 kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:  # fmt: skip
        require(divergence in DIVERGENCES, f"divergence: {divergence!r} is not 'tv' or 'kl'.")
        surrogate = DIVERGENCES[divergence]
        loss = LossOptions.of(loss, preset(DPPO, "loss"))
        require(loss.surrogate in (None, surrogate),
                f"divergence: {divergence} is the surrogate {surrogate}; drop --model.loss.surrogate or --model.divergence.")  # fmt: skip
        loss = dataclasses.replace(loss, surrogate=None if divergence == "tv" else surrogate)
        super().__init__(model, loss=loss, kl=kl, **kwargs)
