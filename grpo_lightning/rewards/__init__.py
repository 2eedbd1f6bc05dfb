"""Reward functions ``(prompts, completions, **columns) -> list[float | None]`` and how they are scored."""

from grpo_lightning.rewards.accuracy import accuracy_reward, answers_match, extract_answer
from grpo_lightning.rewards.format import r1_format_reward
from grpo_lightning.rewards.process import ProcessRewardModel, answer_prefix_steps
from grpo_lightning.rewards.reward_model import RewardModel
from grpo_lightning.rewards.scoring import (
    RewardFunctionError,
    resolve_reward_function,
    score_completions,
    weighted_reward,
)

__all__ = [
    "ProcessRewardModel",
    "RewardFunctionError",
    "RewardModel",
    "accuracy_reward",
    "answer_prefix_steps",
    "answers_match",
    "extract_answer",
    "r1_format_reward",
    "resolve_reward_function",
    "score_completions",
    "weighted_reward",
]
