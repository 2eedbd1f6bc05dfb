"""Advantage estimators of one completion each: ``rewards`` ``[P, G]`` (``P`` prompts, ``G``
completions per prompt) -> advantages ``[P, G]``. The math is :mod:`grpo_lightning.algorithms.functional`'s;
here each gets the name it is selected by (``--model.advantage NAME``), by :func:`register_advantage`,
which registers a user's estimators too."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.parts import Registry

class AdvantageRegistry(Registry):
    """The advantage estimators, and the form each takes under a ``rewards.scale`` other than the
    group's std (``scaled``: name -> scale -> estimator; GRPO's ``group_std`` divided by the batch's
    std, or by none)."""

    def __init__(self) -> None:
        super().__init__("advantage", "a function rewards [P, G] -> advantages [P, G]")
        self.scaled: dict[str, dict[str, Callable[..., Tensor]]] = {}

    def estimator(self, name: str, scale: str = "group") -> Callable[..., Tensor]:
        """The estimator ``name`` under ``rewards.scale`` ``scale``: its own for ``"group"``, else its
        registered form; a ``KeyError`` for a scale it has none for (:meth:`scales`)."""
        return {"group": self[name], **self.scaled.get(name, {})}[scale]

    def scales(self, name: str) -> tuple[str, ...]:
        """The ``rewards.scale`` values ``name`` takes."""
        return ("group", *self.scaled.get(name, {}))


#: Name -> estimator ``rewards [P, G] -> advantages [P, G]`` (with the :class:`TokenStatistics` of the
#: completions for those of :data:`TOKEN_STATISTICS_ADVANTAGES`, ``[P, G, T]``); the forms it takes
#: under another ``rewards.scale`` are :meth:`AdvantageRegistry.estimator`'s.
ADVANTAGES = AdvantageRegistry()
#: Estimators that also take the completions' :class:`TokenStatistics` and give per-token advantages
#: ``[P, G, T]``: the training step computes those statistics for them alone.
TOKEN_STATISTICS_ADVANTAGES: set[str] = set()


def register_advantage(name: str | None = None, *, scale: str = "group", token_statistics: bool = False):
    """Decorator: register an estimator ``rewards [P, G] -> advantages [P, G]`` as ``--model.advantage
    NAME`` (its ``__name__`` for ``None``). ``scale``: for another ``rewards.scale``, the form the
    registered estimator ``name`` takes under it instead; ``token_statistics``: it also takes the
    completions' :class:`TokenStatistics` and gives advantages ``[P, G, T]``."""

    def register(function: Callable[..., Tensor]) -> Callable[..., Tensor]:
        key = name or function.__name__
        if scale != "group":  # a form of a registered estimator, not an estimator of its own
            ADVANTAGES.scaled.setdefault(ADVANTAGES.resolve(key), {})[scale] = function
            return function
        if token_statistics:
            TOKEN_STATISTICS_ADVANTAGES.add(key)
        return ADVANTAGES.register(key, function)

    return register


@register_advantage()
def group_std(rewards: Tensor) -> Tensor:
    """GRPO (DeepSeekMath eq. 3): ``A_pi = (r_pi - mean_g r_p) / (std_g r_p + 1e-4)``, unbiased std;
    0 for a group of equal rewards. ``[P, G]`` -> ``[P, G]``, ``G >= 2``."""
    return F.group_normalized_advantages(rewards, scale="group")


@register_advantage("group_std", scale="batch")
def group_std_over_batch_std(rewards: Tensor) -> Tensor:
    """GRPO with TRL's ``scale_rewards="batch"``: ``A_pi = (r_pi - mean_g r_p) / (std_batch r + 1e-4)``,
    the unbiased std of all ``P * G`` rewards. ``[P, G]`` -> ``[P, G]``."""
    return F.group_normalized_advantages(rewards, scale="batch")


@register_advantage("group_std", scale="none")
def group_std_unscaled(rewards: Tensor) -> Tensor:
    """GRPO with TRL's ``scale_rewards="none"``: ``A_pi = r_pi - mean_g r_p`` (Dr. GRPO's centring),
    exactly 0 for a group of equal rewards. ``[P, G]`` -> ``[P, G]``."""
    return F.group_normalized_advantages(rewards, scale="none")


@register_advantage()
def group_mean(rewards: Tensor) -> Tensor:
    """Dr. GRPO: ``A_pi = r_pi - mean_g r_p`` (no division by a std). ``[P, G]`` -> ``[P, G]``."""
    return F.group_centered_advantages(rewards)


@register_advantage()
def leave_one_out(rewards: Tensor) -> Tensor:
    """RLOO: ``A_pi = r_pi - 1/(G-1) sum_{j != i} r_pj``. ``[P, G]`` -> ``[P, G]``, ``G >= 2``."""
    return F.leave_one_out_advantages(rewards)


@register_advantage()
def batch_std(rewards: Tensor) -> Tensor:
    """REINFORCE++ with baseline: ``A'_pi = r_pi - mean_g r_p``, ``A_pi = A'_pi / std_batch(A')``
    (unbiased, over all ``P * G``; 0 everywhere when that std is 0). ``[P, G]`` -> ``[P, G]``."""
    return F.batch_normalized_advantages(rewards)


@register_advantage()
def gpg(rewards: Tensor) -> Tensor:
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv 2504.02546), in verl's form: ``A_pi = alpha (r_pi - mean_g r_p) / F_norm``,
    ``F_norm = 1``, ``alpha = P G / #{r != 0}`` (the batch's completions over those rewarded, 1 when
    none is): the gradient the zero-advantage groups leave out is made up. On each device, its
    share of the batch. ``[P, G]`` -> ``[P, G]``."""
    alpha = rewards.numel() / max(int(torch.count_nonzero(rewards)), 1)
    return alpha * F.group_centered_advantages(rewards)


@register_advantage()
def max_rl(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """MaxRL ("Maximum Likelihood Reinforcement Learning"; prime-rl's ``max_rl``):
    ``A_pi = (r_pi - mean_g r_p) / (mean_g r_p + eps)``, the centred reward over the group's success
    rate instead of its std: with 0/1 rewards the gradient of ``log p(success)``, so hard prompts
    (low success rate) weigh more. 0 for a group of equal rewards. Rewards must not be negative:
    a group with differing rewards and a mean <= 0 is a ``ValueError``. ``[P, G]`` -> ``[P, G]``."""
    mean, centred = rewards.mean(dim=1, keepdim=True), F.group_centered_advantages(rewards)
    if bool(((mean <= 0) & (centred != 0).any(dim=1, keepdim=True)).any()):
        raise ValueError(
            "max_rl: a group's rewards differ with a mean <= 0; MaxRL divides by the mean as a success rate and "
            "needs rewards >= 0 (drop negative reward terms, e.g. overlong shaping, or pick another advantage)."
        )
    return torch.where(mean > 0, centred / (mean + eps), torch.zeros_like(centred))


@dataclass(frozen=True)
class TokenStatistics:
    """Per-token statistics of the sampled completions under the policy that sampled them, from one
    forward pass without gradient, all ``[P, G, T]``: ``logp``, the sampled token's ``log pi_t(y_t)``;
    ``sum_pi_squared``, ``sum_v pi_t(v)^2``; ``mask``, 1 on the model's tokens."""

    logp: Tensor
    sum_pi_squared: Tensor
    mask: Tensor


@register_advantage(token_statistics=True)
def optimal_token_baseline(rewards: Tensor, tokens: TokenStatistics, eps: float = 1e-8) -> Tensor:
    """OTB, the Optimal Token Baseline (arXiv 2602.07078; verl's ``optimal_token_baseline``): a baseline
    per token position that weighs each completion by its realized energy.
    ``w_t = 1 - 2 pi_t(y_t) + sum_v pi_t(v)^2`` (``||e_{y_t} - pi_t||^2``, the logit-gradient proxy of
    ``||grad log pi(y_t)||^2``), ``W_t = sum_{j<=t} w_j``, and at the ``k``-th model token
    ``B*_k = sum_i G_ik W_ik / (sum_i W_ik + eps)`` over the group's completions that have one;
    ``A_ik = G_ik - B*_k``, with ``G = r`` (outcome reward-to-go) at every token. Where one completion
    alone has a ``k``-th token (the longest's tail, or ``G = 1``) the baseline is 0 (verl's
    ``handle_zero_tail``): a baseline of its own return would leave it no gradient.
    ``k`` counts the model's tokens only (an environment's replies are skipped, verl's multi-turn form).
    ``rewards`` ``[P, G]`` -> advantages ``[P, G, T]``, 0 off the mask."""
    mask = tokens.mask.to(rewards.dtype)
    num_groups, width = mask.shape[0], mask.shape[-1]
    realized = ((1 - 2 * tokens.logp.exp() + tokens.sum_pi_squared) * mask).cumsum(-1)  # W_t [P, G, T]
    returns = rewards.unsqueeze(-1) * mask  # G_t [P, G, T]
    index = (mask.cumsum(-1) - 1).clamp(min=0).long().flatten(1)  # k of each token, [P, G * T]

    def per_index(values: Tensor) -> Tensor:  # sum over the group at each k: [P, T]
        return values.new_zeros(num_groups, width).scatter_add_(1, index, (values * mask).flatten(1))

    baseline = per_index(returns * realized) / (per_index(realized) + eps)
    baseline = torch.where(per_index(torch.ones_like(mask)) > 1, baseline, torch.zeros_like(baseline))
    return (returns - baseline.gather(1, index).view_as(mask)) * mask


# ------------------------------------------------------------------ on-policy distillation
# Not registered: it reads a teacher's log-probs, which only grpo_lightning.variants.OnPolicyDistillation loads.
#
# The student samples completions, a frozen teacher scores each sampled token, and every token's
# advantage is the negative single-sample estimate of the reverse KL there (discount 0)::
#
#     A_it = -distill_weight * (log pi_student(y_it) - log pi_teacher(y_it)) + reward_weight * A_i
#
# Its expectation under the student's samples is -KL(pi_student || pi_teacher) per position, so a
# policy gradient on it lowers the reverse KL (mode-seeking). The forms it follows:
# * Thinking Machines' "On-Policy Distillation" (Lu et al. 2025) and the tinker cookbook's
#   distillation/train_on_policy.py: advantage = -kl_penalty_coef * (sampled_logprobs -
#   teacher_logprobs) per token, added to the reward's advantage, discount 0;
# * verl's distillation (distillation_loss_mode k1 with use_policy_gradient): the per-token log-ratio
#   log pi - log pi_teacher of the student's own tokens as a policy-gradient reward;
# * TRL's GKDTrainer (Agarwal et al. 2024, "On-Policy Distillation of Language Models", eq. 1): lmbda=1
#   (student samples only) and beta=1 is the reverse KL(pi_student || pi_teacher), there summed over
#   the vocabulary at each position instead of estimated at the sampled token.


def reverse_kl_per_token(student_logp: Tensor, teacher_logp: Tensor, mask: Tensor) -> Tensor:
    """``k_t = log pi_student(y_t) - log pi_teacher(y_t)``, 0 off ``mask``; all ``[..., T]``. Its mean
    over a student's samples estimates ``KL(pi_student || pi_teacher)`` (the k1 estimator)."""
    return (student_logp - teacher_logp) * mask


def distillation_advantages(
    student_logp: Tensor,
    teacher_logp: Tensor,
    mask: Tensor,
    reward_advantages: Tensor | None = None,
    distill_weight: float = 1.0,
    reward_weight: float = 0.0,
) -> Tensor:
    """``A_it = -distill_weight * k_it + reward_weight * A_i`` on ``mask``, 0 off it (detached inputs:
    the advantage carries no gradient).

    ``student_logp``, ``teacher_logp``, ``mask``: ``[P, G, T]`` (the sampled tokens' log-probs under
    the policy that sampled them and under the teacher; 1 on the model's tokens);
    ``reward_advantages``: ``[P, G]`` (or ``[P, G, T]``), ``None`` for none. Returns ``[P, G, T]``."""
    mask = mask.to(student_logp.dtype)
    advantages = -distill_weight * reverse_kl_per_token(student_logp.detach(), teacher_logp.detach(), mask)
    if reward_advantages is not None and reward_weight != 0:
        per_token = reward_advantages if reward_advantages.dim() == mask.dim() else reward_advantages.unsqueeze(-1)
        advantages = advantages + reward_weight * per_token.detach() * mask
    return advantages
