"""Per-token surrogates: the policy loss of each token before aggregation, registered by name
(``--model.loss.surrogate NAME``) by :func:`register_surrogate`, which registers a user's too.

Each takes ``logp``, ``old_logp``, ``mask`` ``[N, T]`` and ``advantages`` ``[N]`` (or ``[N, T]``
where the surrogate is per token) and returns ``(loss [N, T], shares)``: the loss, neither masked
nor aggregated, and the token shares to log (``name -> [N, T]`` flags or values, averaged over the
mask), kept apart from the math. Its settings are keyword arguments named as the module's options
(``loss.clip_eps_low``, ``tau_pos``, ...): a module passes those its run gives (its settings' clip
bounds, its ``loss`` options, its variant's own arguments), the function's defaults (the paper's)
stand for the rest, and one without a default is an error where the run does not give it. PPO,
GSPO, CISPO, SAPO and GMPO are in :mod:`grpo_lightning.algorithms.policy_losses`; the others are here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms import policy_losses
from grpo_lightning.algorithms.parts import Registry, function_part

#: The module's options that bound the ratio; a surrogate that reads none of some has no place for them.
CLIP_OPTIONS = ("clip_eps_low", "clip_eps_high", "delta", "clip_ratio_c")


def clip_shares(clipped_low: Tensor, clipped_high: Tensor) -> dict[str, Tensor]:
    """The ``clip_ratio/*`` shares of a clip: at the low bound, the high bound, either."""
    return {"clip_ratio/low": clipped_low, "clip_ratio/high": clipped_high, "clip_ratio/region": clipped_low | clipped_high}


def per_token(advantages: Tensor, logp: Tensor) -> Tensor:
    """``[N]`` advantages as ``[N, 1]``, to broadcast over tokens; ``[N, T]`` as they are."""
    return advantages.unsqueeze(-1) if advantages.dim() == logp.dim() - 1 else advantages


@dataclass(frozen=True)
class Surrogate:
    """A registered surrogate: the function, and what it needs from the run.

    ``per_sequence``: it needs one advantage per completion (``[N]``); ``unclipped``: why the
    options of :data:`CLIP_OPTIONS` that its function does not take have no place in it."""

    loss: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    per_sequence: bool = False
    unclipped: str = ""

    def options(self) -> tuple[str, ...]:
        """The settings it takes (keyword-only arguments of its function)."""
        code = self.loss.__code__
        return code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]

    def required(self) -> tuple[str, ...]:
        """The settings it has no default for: a run must give each."""
        defaults = self.loss.__kwdefaults__ or {}
        return tuple(option for option in self.options() if option not in defaults)

    def unused_clip_options(self) -> dict[str, str]:
        """``loss.option -> reason`` for each clip option it does not read."""
        return {f"loss.{option}": self.unclipped for option in CLIP_OPTIONS if option not in self.options()}

    def default(self, option: str) -> Any:
        """The paper's value of ``option`` that its function takes by default."""
        return self.loss.__kwdefaults__[option]


#: Name -> surrogate.
SURROGATES = Registry("loss.surrogate", "a function (logp, old_logp, advantages, mask, *, settings) -> (loss, shares)",
                      lambda given: function_part(given) and Surrogate(given))  # fmt: skip


def register_surrogate(name: str | None = None, *, per_sequence: bool = False, unclipped: str = ""):
    """Decorator: register a per-token surrogate ``(logp, old_logp, advantages, mask, *, settings) ->
    (loss [N, T], shares)`` as ``--model.loss.surrogate NAME`` (its ``__name__`` for ``None``), with
    what :class:`Surrogate` says of it. Its settings are keyword-only, named as the module's options."""
    return lambda loss: SURROGATES.register(name or loss.__name__, loss, Surrogate(loss, per_sequence, unclipped))


# ------------------------------------------------------------------ the surrogates


@register_surrogate()
def ppo_clip(logp, old_logp, advantages, mask, *, clip_eps_low=0.2, clip_eps_high=0.2, delta=None, clip_ratio_c=None):
    """PPO / DeepSeekMath eq. 3: ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, ``r = pi / pi_old``
    (:func:`grpo_lightning.algorithms.policy_losses.clipped_surrogate`; ``delta`` caps ``r`` in the unclipped term).

    Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"; verl's
    ``clip_ratio_c``): where ``A < 0`` the loss is also bounded, ``min(loss, -c A)``, so a token
    whose ratio grew far cannot dominate; ``clip_ratio/dual`` is the share it binds on. For
    ``c > 1 + eps_high`` it equals ``delta = c``."""
    loss, low, high = policy_losses.clipped_surrogate(logp, old_logp, advantages, clip_eps_low, clip_eps_high, delta)
    shares = clip_shares(low, high)
    if clip_ratio_c is not None:
        loss, shares["clip_ratio/dual"] = dual_clip(loss, per_token(advantages, logp), clip_ratio_c)
    return loss, shares


def dual_clip(loss: Tensor, advantages: Tensor, c: float) -> tuple[Tensor, Tensor]:
    """``(min(loss, -c A) where A < 0 else loss, where that bound binds)``; ``c > 1``."""
    if not c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {c}")
    bound = -c * advantages
    binds = (advantages < 0) & (loss > bound)
    return torch.where(binds, bound.expand_as(loss).to(loss.dtype), loss), binds


@register_surrogate(per_sequence=True, unclipped="it clips one ratio per sequence, not each token's")
def gspo(logp, old_logp, advantages, mask, *, clip_eps_low=3e-4, clip_eps_high=4e-4):
    """GSPO eqs. 5-7: the clipped surrogate of the sequence ratio ``s_i = exp(mean_t log r_it)``,
    on every token of sequence ``i`` (:func:`grpo_lightning.algorithms.policy_losses.sequence_clipped_surrogate`)."""
    loss, low, high = policy_losses.sequence_clipped_surrogate(logp, old_logp, advantages, mask, clip_eps_low, clip_eps_high)
    return loss, clip_shares(low, high)


@register_surrogate(unclipped="its clipped weight is detached: there is no min with an unclipped term to cap")
def cispo(logp, old_logp, advantages, mask, *, clip_eps_low=None, clip_eps_high=5.0):
    """CISPO (MiniMax-M1 eqs. 4-5): ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi``; no lower
    bound for ``eps_low = None`` (:func:`grpo_lightning.algorithms.policy_losses.clipped_weight_log_likelihood`)."""
    loss, low, high = policy_losses.clipped_weight_log_likelihood(logp, old_logp, advantages, clip_eps_low, clip_eps_high)
    return loss, clip_shares(low, high)


@register_surrogate(unclipped="its soft gate replaces the ratio clip")
def sapo(logp, old_logp, advantages, mask, *, tau_pos=1.0, tau_neg=1.05):
    """SAPO: ``-(4 / tau) sigmoid(tau (r - 1)) A``, ``tau = tau_pos`` where ``A > 0``, else ``tau_neg``
    (:func:`grpo_lightning.algorithms.policy_losses.soft_gated_surrogate`). No clip, nothing to log."""
    return policy_losses.soft_gated_surrogate(logp, old_logp, advantages, tau_pos, tau_neg), {}


@register_surrogate(per_sequence=True, unclipped="it clips log-ratios inside a geometric mean, not each token's ratio")
def gmpo(logp, old_logp, advantages, mask, *, clip_eps_low=0.4, clip_eps_high=0.4):
    """GMPO: ``-A_i exp(mean_t d'_it)``, the geometric mean of the token ratios, each clipped in log
    space by the sign of ``A`` (:func:`grpo_lightning.algorithms.policy_losses.geometric_mean_surrogate`)."""
    loss, low, high = policy_losses.geometric_mean_surrogate(logp, old_logp, advantages, mask, clip_eps_low, clip_eps_high)
    return loss, clip_shares(low, high)


@register_surrogate(unclipped="it has no ratio to clip")
def reinforce(logp, old_logp, advantages, mask):
    """Plain REINFORCE (Williams 1992), as GPG uses it: ``-A log pi``, no ratio and no clip. Its
    gradient is the policy gradient at the current policy, whatever ``old_logp``."""
    return -per_token(advantages, logp) * logp, {}


@register_surrogate(per_sequence=True, unclipped="its sequence weight replaces the ratio clip")
def vespo(logp, old_logp, advantages, mask, *, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0):
    """VESPO: ``-sg(phi_i) A_i log pi_it``, the log-likelihood weighted by a gamma-shaped function of
    the sequence's importance weight ``w_i`` (:func:`vespo_weight`), instead of a ratio clip::

        log w_i = clamp( sum_t m_it clamp(log pi_it - log pi_old,it, -20, 20), ln 1e-8, 20 )

    Logged: ``vespo/weight``, the mean ``phi`` per token."""
    log_ratio = (logp.detach() - old_logp).clamp(-20.0, 20.0)
    log_w = F.masked_sum(log_ratio, mask, dim=-1).clamp(math.log(1e-8), 20.0)
    phi = vespo_weight(log_w, advantages.reshape(-1) >= 0, k_pos, lambda_pos, k_neg, lambda_neg).unsqueeze(-1)
    return -phi * per_token(advantages.reshape(-1), logp) * logp, {"vespo/weight": phi.expand_as(logp)}


def vespo_weight(log_w: Tensor, positive: Tensor, k_pos: float, lambda_pos: float, k_neg: float, lambda_neg: float):
    """``phi(w) = exp(lambda + k log w - lambda w)`` (1 at ``w = 1``), with ``(k, lambda)`` of
    ``positive`` (``A >= 0``) or not. ``[N]`` -> ``[N]``, detached."""
    k = torch.where(positive, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(positive, lambda_pos, lambda_neg).to(log_w.dtype)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).detach()


@register_surrogate(unclipped="it drops tokens past a divergence bound: no unclipped term to cap")
def dppo_tv(logp, old_logp, advantages, mask, *, clip_eps_low=0.15, clip_eps_high=0.15, clip_ratio_c=20.0):
    """DPPO binary TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
    arXiv 2602.04879): the trust region is on the probability, not the ratio. A token is dropped
    where it moved past the bound in the direction its advantage pushes::

        valid_it = (p - p_old <= eps_high) if A > 0 else (p - p_old >= -eps_low),   p = pi(o_it)
        loss_it  = -valid_it * sg(min(r_it, c)) * A * log pi_it

    ``c`` (``clip_ratio_c``; ``None``: none) truncates the detached IS weight (TIS)."""
    p, p_old = logp.detach().exp(), old_logp.exp()
    return divergence_masked(logp, old_logp, advantages, p - p_old <= clip_eps_high, p - p_old >= -clip_eps_low,
                             clip_ratio_c)  # fmt: skip


@register_surrogate(unclipped="it drops tokens past a divergence bound: no unclipped term to cap")
def dppo_kl(logp, old_logp, advantages, mask, *, clip_eps_low=0.05, clip_eps_high=0.05, clip_ratio_c=20.0):
    """DPPO binary KL (arXiv 2602.04879): as :func:`dppo_tv`, bounding the KL of the two-outcome
    distribution (the token, or any other) instead::

        D_it = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))
        valid_it = (D <= eps_high or p <= p_old) if A > 0 else (D <= eps_low or p >= p_old)"""
    p, p_old = logp.detach().exp(), old_logp.exp()
    kl = p_old * (old_logp - logp.detach()) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    return divergence_masked(logp, old_logp, advantages, (kl <= clip_eps_high) | (p <= p_old),
                             (kl <= clip_eps_low) | (p >= p_old), clip_ratio_c)  # fmt: skip


def divergence_masked(logp, old_logp, advantages, valid_pos, valid_neg, cap) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO's loss ``-valid * sg(min(r, cap)) * A * log pi``; logs the dropped share (``clip_ratio/region``)."""
    advantages = per_token(advantages, logp)
    valid = torch.where(advantages > 0, valid_pos, valid_neg)
    weight = torch.exp((logp.detach() - old_logp).clamp(-20.0, 20.0))  # as verl: no overflow without a cap
    weight = weight if cap is None else weight.clamp(max=cap)
    loss = -valid.to(logp.dtype) * weight * advantages * logp
    dropped = ~valid
    return loss, {"clip_ratio/low": dropped & (advantages < 0), "clip_ratio/high": dropped & (advantages > 0),
                  "clip_ratio/region": dropped}  # fmt: skip


@register_surrogate(unclipped="its quadratic penalty on the log-ratio replaces the clip")
def dro(logp, old_logp, advantages, mask, *, dro_beta=0.1):
    """DRO's regularised policy gradient (the form of verl's ``dro`` loss mode): the log-likelihood
    and a quadratic penalty on the log-ratio instead of a clip::

        loss_it = -( log pi_it A_i - (beta / 2) (log pi_it - log pi_old,it)^2 )"""
    return -(logp * per_token(advantages, logp) - 0.5 * dro_beta * (logp - old_logp) ** 2), {}


