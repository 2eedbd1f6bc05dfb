"""Reward functions ``(prompts, completions, **columns) -> list[float | None]`` (and ``group_index``
for those that take it), how they are scored, and what a failing one does."""

from grpo_lightning.rewards.accuracy import accuracy_reward, answers_match, extract_answer
from grpo_lightning.rewards.code_execution import CodeExecutionReward, code_execution_reward
from grpo_lightning.rewards.consistency import majority_answer, majority_vote_reward, vote
from grpo_lightning.rewards.sandbox.execution import (
    RewardExecution,
    RewardFunctionWarning,
    RewardScorer,
    RewardScores,
    score_completions,
)
from grpo_lightning.rewards.format import r1_format_reward, reasoning_length_reward
from grpo_lightning.rewards.process import ProcessRewardModel, answer_prefix_steps
from grpo_lightning.rewards.reasoning_gym import reasoning_gym_correct, reasoning_gym_reward
from grpo_lightning.rewards.reward_model import RewardModel
from grpo_lightning.rewards.scoring import (
    RewardFunctionError,
    accepts_group_index,
    group_indices,
    resolve_reward_function,
    weighted_reward,
)

__all__ = [
    "CodeExecutionReward",
    "ProcessRewardModel",
    "RewardExecution",
    "RewardFunctionError",
    "RewardFunctionWarning",
    "RewardModel",
    "RewardScorer",
    "RewardScores",
    "accepts_group_index",
    "accuracy_reward",
    "answer_prefix_steps",
    "answers_match",
    "code_execution_reward",
    "extract_answer",
    "group_indices",
    "majority_answer",
    "majority_vote_reward",
    "r1_format_reward",
    "reasoning_gym_correct",
    "reasoning_gym_reward",
    "reasoning_length_reward",
    "resolve_reward_function",
    "score_completions",
    "vote",
    "weighted_reward",
]
