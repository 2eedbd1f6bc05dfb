"""GRPO with process supervision: Shao et al. 2024, "DeepSeekMath", section 4.1.3.

A step reward function scores each reasoning step ``j`` of completion ``i``; with ``R`` every step
reward of the group's completions, normalised as ``r~ = (r - mean(R)) / std(R)``, the advantage of
token ``t`` is the sum of the normalised rewards of the steps that end at or after it::

    A_it = sum_{index(j) >= t} r~_i,j

and the objective is GRPO's (eq. 3) with these per-token advantages. The outcome reward functions
(``reward_funcs``) are still scored and logged (``reward``), and give ``val/accuracy``; only the
step rewards shape the advantages.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from grpo_lightning.rewards.process_supervision import step_advantages, step_rewards, token_char_ends
from grpo_lightning.rewards import resolve_reward_function
from grpo_lightning.rewards.scoring import TrainerState
from grpo_lightning.rollout.types import Rollout
from grpo_lightning.errors import require
from grpo_lightning.variants.grpo import GRPO


class ProcessGRPO(GRPO):
    """GRPO + PRM: per-token advantages from step rewards normalised over the group.

    Args:
        step_reward_func: the step reward function (import path or callable; see
            :mod:`grpo_lightning.rewards.process_supervision` for what it returns), e.g.
            ``grpo_lightning.rewards.answer_prefix_steps`` (rule-based, the built-in task) or a
            :class:`~grpo_lightning.rewards.ProcessRewardModel`.
        step_delimiter: what ends a step when the function returns one score per step (a blank line).
    """

    inapplicable_options = {
        "rewards.scale": "its advantages are normalised over the group's steps",
        "rewards.aggregation": "its advantages come from the step rewards",
        "advantage": "its advantages are per token, from the step rewards",
        "environment": "its steps are split from one completion's text, which has no environment replies",
    }
    token_advantages = True  # a per-sequence surrogate cannot take them
    refused_kl_placements = {"reward": "its advantages come from the step rewards, which the completion's reward "
                             "does not enter"}  # fmt: skip

    def __init__(
        self,
        model: str,
        *,
        step_reward_func: str | Callable = "grpo_lightning.rewards.answer_prefix_steps",
        step_delimiter: str = "\n\n",
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        require(step_delimiter != "", "step_delimiter: give a non-empty string, e.g. '\\n\\n' (a blank line).")
        self.step_reward_function = resolve_reward_function(step_reward_func, field="step_reward_func")

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """Score the steps (the rollout is at hand here); their per-token advantages go in ``rollout.derived``."""
        name, function = self.step_reward_function
        char_ends = token_char_ends(self.tokenizer, rollout.completion_ids, rollout.lengths)
        pairs = step_rewards(function, name, rollout.prompts, rollout.completions, rollout.columns, char_ends,
                             self.hparams.step_delimiter, rollout.model_token_ids(), TrainerState.of(self._trainer))  # fmt: skip
        width = rollout.completion_ids.size(1)
        advantages = step_advantages(pairs, rollout.group_size, rollout.lengths, width).to(rewards.device)
        rollout.derived["step_advantages"] = advantages
        steps = [score for steps in pairs for _, score in steps]
        self.step_metrics.update("process/steps_per_completion", len(steps) / max(len(pairs), 1))
        self.step_metrics.update("process/step_reward_mean", sum(steps) / max(len(steps), 1))
        return rewards

    def advantages(self, rewards: Tensor, rollout: Rollout | None = None) -> Tensor:
        """``[P, G, T]``: the step advantages :meth:`shape_rewards` put in ``rollout.derived``, per token."""
        if rollout is None or "step_advantages" not in rollout.derived:
            raise RuntimeError("ProcessGRPO.advantages needs the rollout's step rewards: call "
                               "shape_rewards(rewards, rollout) first, then advantages(rewards, rollout).")  # fmt: skip
        return rollout.derived["step_advantages"].view(*rewards.shape, -1)
