"""Online DPO + GRPO: the GRPO loss plus a DPO term on each group's best and worst completion.

DPO: Rafailov et al. 2023, "Direct Preference Optimization", eq. 7, on preference pairs drawn
online from the policy's own samples as in Guo et al. 2024, "Direct Language Model Alignment from
Online AI Feedback" (here the reward functions judge, not an LLM annotator)::

    L = L_GRPO + dpo_weight * 1/K sum_k -log sigmoid(dpo_beta * ((log pi(y_w) - log pi_ref(y_w))
                                                                - (log pi(y_l) - log pi_ref(y_l))))

``log pi(y)`` is a completion's sequence log-prob, the sum of its token log-probs (the update's,
at the sampling temperature), under the policy and under the frozen reference model, which is
loaded even with ``beta = 0``. Each group with differing rewards gives one pair ``(y_w, y_l)``: its
best and its worst completion by the weighted reward; a tie goes to the first completion of the
group holding that reward; a group of equal rewards gives none (:func:`grpo_lightning.algorithms.dpo.best_worst_pairs`).
``K`` counts the pairs. The pair term uses whole completions (``mask_truncated_completions`` and
``top_entropy_quantile`` act on the GRPO loss only).

How it fits the update: the pair loss is not a sum over rows, so the two completions of a pair go
through the same forward pass, in extra micro-batches of whole pairs (``micro_batch_size // 2``
pairs each, at least one). Each pair's loss is divided by the number of pairs of its minibatch, as
GRPO's aggregation divides by the minibatch's counts: the gradient is the same for any
``micro_batch_size``, and with one minibatch (the default) the loss is exactly ``L`` above.
With several minibatches, a pair belongs to the minibatch that holds its winner, and its loser
row is added to that minibatch's pair passes (it may also carry GRPO loss in another minibatch);
each optimizer step then takes GRPO's minibatch loss plus ``dpo_weight`` times the mean over the
minibatch's pairs, and a minibatch without pairs takes none. The pair passes run before GRPO's
micro-batches, so that GRPO's last backward pass is the one that averages gradients over devices;
every device runs as many pair passes (a device short of pairs runs one with weight 0), and the
count that divides is the minibatch's pairs summed over devices over their number, as DDP averages
the gradients.

Logged: ``dpo/loss`` (mean over pairs, before ``dpo_weight``), ``dpo/pairs`` (pairs per rollout),
``dpo/reward_margin`` (mean ``margin``) and ``dpo/accuracy`` (share of pairs with ``margin > 0``);
``loss`` stays the GRPO part.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from grpo_lightning.algorithms import dpo
from grpo_lightning.algorithms import functional
from grpo_lightning.rollout.types import Rollout
from grpo_lightning.errors import require
from grpo_lightning.variants.grpo import GRPO


def pair_roles(winners: Tensor, losers: Tensor, size: int) -> Tensor:
    """The pairs as a row per completion, ``[N]``: 1 on a pair's winner, -1 on its loser, else 0."""
    roles = torch.zeros(size, dtype=torch.long, device=winners.device)
    roles[winners], roles[losers] = 1, -1
    return roles


def pairs_of_roles(roles: Tensor) -> tuple[Tensor, Tensor]:
    """``(winners, losers)`` in group order: a group holds one pair at most, so the k-th of each pair up."""
    return (roles == 1).nonzero().flatten(), (roles == -1).nonzero().flatten()


class OnlineDPOGRPO(GRPO):
    """GRPO plus DPO on each group's best and worst completion, in the same update.

    Args:
        dpo_weight: weight of the DPO term; 0 leaves plain GRPO (the reference model still loads).
        dpo_beta: DPO's ``beta``, the strength of the implicit KL to the reference in eq. 7
            (Guo et al. use 0.1). Independent of ``beta``, the coefficient of GRPO's KL term.
    """

    inapplicable_options = {"optim.micro_batch_tokens": "its pair passes take micro_batch_size // 2 pairs each"}

    def __init__(self, model: str, *, dpo_weight: float = 1.0, dpo_beta: float = 0.1, **kwargs) -> None:
        super().__init__(model, **kwargs)
        require(
            isinstance(dpo_weight, (int, float)) and math.isfinite(dpo_weight) and dpo_weight >= 0,
            f"dpo_weight: must be a finite number >= 0 (0 turns the DPO term off), got {dpo_weight!r}.",
        )
        require(
            isinstance(dpo_beta, (int, float)) and math.isfinite(dpo_beta) and dpo_beta > 0,
            f"dpo_beta: must be a finite number > 0 (DPO's beta, e.g. 0.1), got {dpo_beta!r}.",
        )
        self.dpo_weight = float(dpo_weight)
        self.dpo_beta = float(dpo_beta)

    def needs_reference_model(self) -> bool:
        """Always: the DPO term compares the policy with the reference, whatever ``beta``."""
        return True

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """GRPO's rewards; the step's pairs, from the rewards ``[P, G]``, go in ``rollout.derived``."""
        winners, losers = dpo.best_worst_pairs(rollout.rewards.view(-1, rollout.group_size))
        rollout.derived["dpo_pair"] = pair_roles(winners, losers, len(rollout))
        self.step_metrics.update("dpo/pairs", len(winners))
        return super().shape_rewards(rewards, rollout)

    def extra_losses(self, rollout: Rollout, advantages: Tensor, rows: Tensor) -> Iterator[tuple[Tensor, dict]]:
        """The minibatch's pair passes: the pairs whose winner is in ``rows``."""
        if self.dpo_weight > 0:
            pairs = pairs_of_roles(rollout.derived["dpo_pair"])
            yield from self.pair_passes(rollout, *dpo.pairs_led_by(rows, *pairs), padding=rows[:1])

    def pair_passes(
        self, rollout: Rollout, winners: Tensor, losers: Tensor, padding: Tensor
    ) -> Iterator[tuple[Tensor, dict]]:
        """``(loss, metrics)`` of each pass, whole pairs per pass; their losses add up to
        ``dpo_weight / num_pairs * sum_k loss_k``."""
        size = max(1, self.settings.micro_batch_size // 2)
        parts = list(zip(winners.split(size), losers.split(size))) if len(winners) else []  # split([]): one empty part
        num_pairs, passes = torch.tensor(float(len(winners)), device=self.device), len(parts)
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1:  # DDP averages gradients over devices: normalise by the mean count per device
            num_pairs = self.trainer.strategy.reduce(num_pairs, reduce_op="sum") / world
            passes = -self.min_over_ranks(-passes)  # the most passes of any device: the same collectives
        for index in range(passes):
            real = index < len(parts)
            winner, loser = parts[index] if real else (padding, padding)
            loss, margin = self.pair_losses(rollout, winner, loser)
            metrics = {"dpo/loss": (loss.detach().mean(), len(winner)),
                       "dpo/reward_margin": (margin.detach().mean(), len(winner)),
                       "dpo/accuracy": ((margin > 0).float().mean(), len(winner))}  # fmt: skip
            yield loss.sum() * (self.dpo_weight / num_pairs if real else 0.0), metrics if real else {}

    def pair_losses(self, rollout: Rollout, winners: Tensor, losers: Tensor) -> tuple[Tensor, Tensor]:
        """DPO loss and margin ``[k]`` of the pairs: both completions of each in one forward pass."""
        rows = torch.cat([winners, losers]).to(rollout.device)
        logp, _ = self._forward(self.policy, rollout, rows, with_entropy=False)
        mask = rollout.completion_mask[rows]
        policy = functional.masked_sum(logp, mask, dim=-1)
        device = rollout.ref_logp.device
        ref = functional.masked_sum(rollout.ref_logp[rows.to(device)], mask.to(device), dim=-1)
        k = len(winners)
        return dpo.dpo_pair_loss(policy[:k], ref[:k].to(policy), policy[k:], ref[k:].to(policy), self.dpo_beta)
