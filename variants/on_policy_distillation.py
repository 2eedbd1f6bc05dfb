"""On-policy distillation: Agarwal et al. 2024, "On-Policy Distillation of Language Models:
Learning from Self-Generated Mistakes" (GKD, eq. 1 with the reverse KL); Lu et al. 2025, Thinking
Machines, "On-Policy Distillation" (the per-token reverse KL as an RL advantage).

The student samples ``G`` completions per prompt; a frozen teacher scores each sampled token; each
token's advantage is the negative reverse KL estimated there, optionally mixed with the task
reward's group advantage (:func:`grpo_lightning.algorithms.advantages.distillation_advantages`)::

    A_it = -distill_weight * (log pi_old(y_it) - log pi_teacher(y_it)) + reward_weight * A_i
    J    = 1/N_tok sum_i sum_t min(r_it A_it, clip(r_it, 1 - eps, 1 + eps) A_it)

``pi_old`` is the policy that sampled (the rollout's old log-probs: recomputed, or the sampler's
under ``sampling.old_logprobs bypass``); both log-probs are taken at the sampling temperature, as
the reference model's are. ``A_i`` is GRPO's group-normalised advantage of the rewards
(``group_std``, divided as ``rewards.scale`` says). No KL to a reference model (beta 0): the teacher
is the anchor.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.advantages import distillation_advantages, reverse_kl_per_token
from grpo_lightning.models.policy import load_frozen_model
from grpo_lightning.models.sources import load_tokenizer
from grpo_lightning.rollout.types import Rollout
from grpo_lightning.training.options import KLOptions
from grpo_lightning.errors import ConfigError, require
from grpo_lightning.training.settings import check_model_path
from grpo_lightning.variants.grpo import GRPO


class OnPolicyDistillation(GRPO):
    """The per-token reverse KL to a frozen teacher as the advantage, on the student's own samples.

    Args:
        teacher: hub id or local directory of the teacher, a causal LM with the student's tokenizer
            (loaded like the reference model: frozen, eval, in ``policy.dtype``, sharded under FSDP).
        distill_weight: weight of the distillation term ``-(log pi_old - log pi_teacher)`` per token.
        reward_weight: weight of the task reward's advantage ``A_i`` added at every token; 0 (the
            default) is pure distillation.
    """

    inapplicable_options = {
        "advantage": "its advantage is the per-token reverse KL to the teacher, plus reward_weight times group_std's",
        "environment": "the teacher pass and its per-token advantages are not yet checked on environment replies",
    }
    token_advantages = True  # a per-sequence surrogate cannot take them
    #: Every token counts once: its advantage is its own.
    default_aggregation = "token_mean"

    def __init__(
        self,
        model: str,
        *,
        teacher: str | None = None,
        distill_weight: float = 1.0,
        reward_weight: float = 0.0,
        kl: KLOptions = KLOptions(beta=0.0),
        **kwargs,
    ) -> None:
        super().__init__(model, kl=kl, **kwargs)
        if teacher is not None:
            require(isinstance(teacher, str) and teacher != "", "teacher: give a hub id or a local directory.")
            check_model_path("teacher", teacher)
        for name, value in (("distill_weight", distill_weight), ("reward_weight", reward_weight)):
            require(isinstance(value, (int, float)) and math.isfinite(value) and value >= 0,
                    f"{name}: must be a finite number >= 0, got {value!r}.")  # fmt: skip
        self.teacher_model: torch.nn.Module | None = None

    def configure_model(self) -> None:
        """The policy as the base loads it, then the teacher through the reference model's path
        (:func:`~grpo_lightning.models.policy.load_frozen_model`), once its tokenizer matches."""
        if self.policy is not None:
            return
        teacher = self.hparams.teacher
        if teacher is None:
            raise ConfigError(f"teacher: {type(self).__name__} distils from a teacher model; give --model.teacher "
                              "MODEL (a hub id or a local directory, as --model.model).")  # fmt: skip
        teacher_tokenizer = load_tokenizer(teacher, "teacher")
        super().configure_model()
        if teacher_tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ConfigError(
                f"teacher: {teacher}'s tokenizer differs from the student's ({self.tokenizer_name}): the teacher "
                "scores the student's token ids, so both need the same vocabulary; pick a teacher of the same family."
            )
        strategy = self.trainer.strategy if self._trainer is not None else None
        self.teacher_model = load_frozen_model(teacher, self.hparams.policy, strategy)

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """The base's shaping; the teacher's log-probs ``[N, T]`` of the sampled tokens and the
        student's (``old_logp``, else a pass of the policy) go in ``rollout.derived``."""
        rewards = super().shape_rewards(rewards, rollout)
        student = rollout.old_logp if rollout.old_logp is not None else self.compute_logprobs(self.policy, rollout)
        teacher = self.compute_logprobs(self.teacher_model, rollout)
        rollout.derived.update(student_logp=student, teacher_logp=teacher)
        mask = rollout.completion_mask
        kl = reverse_kl_per_token(student, teacher, mask)
        self.step_metrics.update("distill/reverse_kl", F.masked_mean(kl, mask), mask.sum())
        self.step_metrics.update("distill/teacher_logp", F.masked_mean(teacher, mask), mask.sum())
        return rewards

    def advantages(self, rewards: Tensor, rollout: Rollout | None = None) -> Tensor:
        """``[P, G, T]``: the distillation advantage of each token, from the log-probs
        :meth:`shape_rewards` put in ``rollout.derived``, plus ``reward_weight`` times the reward's."""
        if rollout is None or "teacher_logp" not in rollout.derived:
            raise RuntimeError("OnPolicyDistillation.advantages needs the teacher's log-probs: call "
                               "shape_rewards(rewards, rollout) first, then advantages(rewards, rollout).")  # fmt: skip
        reward_weight = self.hparams.reward_weight
        reward = super().advantages(rewards, rollout) if reward_weight else None
        shaped = [rollout.derived[name].view(*rewards.shape, -1) for name in ("student_logp", "teacher_logp")]
        mask = rollout.completion_mask.view(*rewards.shape, -1)
        return distillation_advantages(*shaped, mask, reward, self.hparams.distill_weight, reward_weight)
