"""PPO with a learned critic: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", as
RLHF uses it (Ouyang et al. 2022, "Training language models to follow instructions with human
feedback", eq. 2), with GAE (Schulman et al. 2016, eqs. 11-16). The critic GRPO drops.

Each completion token ``t`` is an action; the task reward comes at the last token and the KL
penalty against the reference model at every token (k1 below; ``kl.estimator`` k2 or k3 instead;
``kl.placement loss``: no penalty in ``r_t``, a KL term in the loss instead, k3 by default)::

    r_t     = -beta * (log pi_old(y_t) - log pi_ref(y_t)) + 1[t = last] * r
    delta_t = r_t + gamma * V_old(s_{t+1}) - V_old(s_t)             (V = 0 after the last token)
    A_t     = delta_t + gamma * lam * A_{t+1},   R_t = A_t + V_old(s_t)
    A_t    <- (A_t - mean(A)) / std(A)          over the batch's tokens (``whiten_advantages``)
    L_pi    = token mean of -min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t)
    L_V     = token mean of 1/2 max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)

``rho_t = pi / pi_old``. ``V_old``: a no-grad pass of the critic over the rollout. The critic
(:mod:`grpo_lightning.models.value`: the policy's backbone and a zero scalar head, loaded from
``model``) has its own AdamW and clipping, and steps after each policy step, on its minibatch.

Defaults: gamma 1, lambda 0.95 (one completion is one episode, rewarded at its end); beta 0.01;
``value_learning_rate`` 1e-5, ten times the policy's default, as RLHF recipes give the critic the
larger rate (it regresses a fresh head onto returns); ``value_clip`` 0.2 and ``value_max_grad_norm``
1.0 as PPO2's. ``advantages/mean_abs``: ``|A_t|`` before whitening. Several devices: FSDP
(the critic is sharded too; advantages are whitened over all devices' tokens).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional
from grpo_lightning.algorithms import gae
from grpo_lightning.algorithms.kl import KL_PLACEMENTS
from grpo_lightning.models import value as critic
from grpo_lightning.runtime.metrics import PhaseTimer
from grpo_lightning.training.module import GroupPolicyOptimization
from grpo_lightning.training.options import KLOptions
from grpo_lightning.rollout.types import Rollout
from grpo_lightning.errors import ConfigError, require
from grpo_lightning.runtime.strategies import is_sharded, shard


class PPO(GroupPolicyOptimization):
    """Per-token GAE advantages from a learned critic; k1 KL in the reward; PPO clip; token mean."""

    #: Per token, ``r_t = -beta * kl_t`` (:meth:`shape_rewards`); ``kl.placement loss``: in the loss instead.
    default_kl_placement = "reward"
    inapplicable_options: ClassVar[dict[str, str]] = {"rewards.scale": "its GAE advantages are whitened instead",
        "advantage": "its advantages are GAE's, per token", "environment": "its GAE runs over one completion"}  # fmt: skip
    default_aggregation = "token_mean"  # over the whole minibatch
    token_advantages = True  # GAE's, per token: a per-sequence surrogate cannot take them

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.01), gamma: float = 1.0, lam: float = 0.95,
                 whiten_advantages: bool = True, value_learning_rate: float = 1e-5, value_clip: float | None = 0.2,
                 value_max_grad_norm: float | None = 1.0, **kwargs) -> None:  # fmt: skip
        super().__init__(model, kl=kl, **kwargs)
        require(0 <= gamma <= 1, f"gamma: must be in [0, 1], got {gamma}.")
        require(0 <= lam <= 1, f"lam: must be in [0, 1], got {lam}.")
        require(value_learning_rate > 0, f"value_learning_rate: must be positive, got {value_learning_rate}.")
        for name, value in (("value_clip", value_clip), ("value_max_grad_norm", value_max_grad_norm)):
            require(value is None or value > 0, f"{name}: must be positive (None: off), got {value}.")
        self.value_model = None

    def configure_model(self) -> None:
        super().configure_model()
        if self.value_model is None:
            self.value_model = shard(critic.load_value_model(self.model_name, **critic.backbone_settings(self.policy_options)))

    def configure_optimizers(self):
        """The policy's AdamW and warm-up (the base module's), and the critic's own at ``value_learning_rate``."""
        policy = super().configure_optimizers()
        return [policy, critic.critic_optimizer(self.value_model, policy, self.hparams.value_learning_rate)]

    def on_fit_start(self) -> None:
        if self.trainer.world_size > 1 and not is_sharded(self.value_model):
            raise ConfigError("trainer.strategy: PPO on several devices needs FSDP, which shards the critic too "
                              "(--config configs/strategy/fsdp.yaml); DDP does not sync the critic's gradients.")
        super().on_fit_start()

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """``r_t``, then GAE on ``V_old`` (in ``rollout.derived`` for :meth:`advantages` and the critic);
        returns ``sum_t r_t``. The KL in the reward is this per-token one, not the base's sum."""
        with PhaseTimer(self.step_metrics, self.device).phase("values"):
            old_values = critic.compute_values(self.value_model, rollout, self.micro_batches(rollout, torch.arange(len(rollout))))
        mask, settings, beta = rollout.completion_mask, self.settings, self.coefficients.beta
        in_reward = rollout.ref_logp is not None and KL_PLACEMENTS[settings.kl_placement].in_reward
        kl = functional.kl_estimate(rollout.old_logp, rollout.ref_logp, settings.kl_estimator) if in_reward else None
        token_rewards = gae.token_rewards(rewards, kl, mask, beta)
        advantages, returns = gae.gae(token_rewards, old_values, mask, self.hparams.gamma, self.hparams.lam)
        valid = self.loss_mask(rollout, torch.arange(len(rollout)))
        critic.record_critic(self.step_metrics, old_values, returns, advantages, valid)
        if kl is not None:
            self.step_metrics.update("kl_penalty", (beta * functional.masked_sum(kl, mask, dim=-1)).mean())
        if self.hparams.whiten_advantages:
            advantages = gae.whiten(advantages, valid, total=self.sum_over_ranks)
        rollout.derived.update(gae_advantages=advantages, returns=returns, old_values=old_values)
        return token_rewards.sum(-1)

    def advantages(self, rewards: Tensor, rollout: Rollout | None = None) -> Tensor:
        """``[P, G, T]``: the GAE advantages :meth:`shape_rewards` computed for ``rollout``."""
        if rollout is None or "gae_advantages" not in rollout.derived:
            raise RuntimeError("PPO.advantages needs the rollout's values: call shape_rewards(rewards, rollout) "
                               "first, then advantages(rewards, rollout).")  # fmt: skip
        return rollout.derived["gae_advantages"].view(*rewards.shape, -1)

    def after_policy_step(self, rollout: Rollout, rows: Tensor) -> None:
        """The critic's step on the policy step's minibatch."""
        self.critic_step(rollout, rows, self.optimizers()[1])
        self.lr_schedulers()[1].step()

    def critic_step(self, rollout: Rollout, rows: Tensor, optimizer) -> None:
        """One optimizer step of the critic on ``L_V`` over the minibatch ``rows``, in micro-batches."""
        optimizer.zero_grad(set_to_none=True)
        num_tokens = self.sum_over_ranks(self.loss_mask(rollout, rows).sum()) / self.num_processes  # as the policy's
        for micro_rows in self.micro_batches(rollout, rows):
            self.manual_backward(self.value_loss(rollout, micro_rows, num_tokens))
        critic.clip_and_step(self, optimizer, self.value_model, self.hparams.value_max_grad_norm)

    def value_loss(self, rollout: Rollout, rows: Tensor, num_tokens: Tensor) -> Tensor:
        """This micro-batch's share of the minibatch's ``L_V`` (divided by its token count ``num_tokens``)."""
        mask = self.loss_mask(rollout, rows)
        returns, old_values = (rollout.derived[name][rows.to(mask.device)] for name in ("returns", "old_values"))
        values = self.value_model(*rollout.model_inputs(rows))
        loss, clipped = gae.clipped_value_loss(values, old_values, returns, self.hparams.value_clip)
        tokens = mask.sum()
        self.step_metrics.update("value/loss", functional.masked_mean(loss.detach(), mask), tokens)
        self.step_metrics.update("value/clip_fraction", functional.masked_mean(clipped.float(), mask), tokens)
        return functional.token_mean(loss, mask, num_tokens=num_tokens)
