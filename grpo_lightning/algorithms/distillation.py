"""On-policy distillation: the per-token reverse KL to a frozen teacher as the advantage.

The student samples completions, the teacher scores each sampled token, and every token's
advantage is the negative single-sample estimate of the reverse KL there (discount 0)::

    A_it = -distill_weight * (log pi_student(y_it) - log pi_teacher(y_it)) + reward_weight * A_i

``A_i``: the task reward's advantage of completion ``i`` (``[P, G]``; ``reward_weight`` 0 is pure
distillation). Forms this follows:

* Thinking Machines' "On-Policy Distillation" (Lu et al. 2025) and its tinker cookbook
  (``distillation/train_on_policy.py``): ``advantage = -kl_penalty_coef * (sampled_logprobs -
  teacher_logprobs)`` per token, added to the reward's advantage, discount 0.
* verl's distillation (``distillation_loss_mode: k1`` with ``use_policy_gradient``): the per-token
  log-ratio ``log pi - log pi_teacher`` of the student's own tokens as a policy-gradient reward.
* TRL's ``GKDTrainer`` (Agarwal et al. 2024, "On-Policy Distillation of Language Models", eq. 1):
  ``lmbda=1`` (only student samples) and ``beta=1`` gives the reverse KL ``KL(pi_student || pi_teacher)``,
  there summed over the vocabulary at each position instead of estimated at the sampled token.

Its expectation under the student's samples is ``-KL(pi_student || pi_teacher)`` per position, so a
policy gradient on it lowers the reverse KL (mode-seeking: the student moves onto the teacher's modes).
"""

from __future__ import annotations

from torch import Tensor


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
