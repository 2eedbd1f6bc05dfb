"""What a rollout adds to a step's metrics (:class:`~grpo_lightning.runtime.metrics.StepMetrics`):
completion lengths, multi-turn episodes and rewards, under the names users know from TRL."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpo_lightning.algorithms import functional
from grpo_lightning.rollout.types import Rollout
from grpo_lightning.runtime.metrics import StepMetrics


def record_rollout(metrics: StepMetrics, rollout: Rollout) -> None:
    """Completion lengths and the share of completions cut at ``max_new_tokens``."""
    lengths = rollout.lengths.float()
    metrics.update("completions/mean_length", lengths.mean())
    metrics.update("completions/min_length", lengths.min(), reduce="min")
    metrics.update("completions/max_length", lengths.max(), reduce="max")
    metrics.update("completions/clipped_ratio", rollout.truncated.float().mean())
    if rollout.environment_mask is not None:
        record_episodes(metrics, rollout)


def record_episodes(metrics: StepMetrics, rollout: Rollout) -> None:
    """Per multi-turn episode (:mod:`grpo_lightning.agents`): turns, tool calls, failed calls by kind,
    the environment's reward, tokens by source (model, environment), the share truncated and the share
    ended by an exception of the environment."""
    from grpo_lightning.agents.tools import TOOL_ERROR_KINDS

    columns = rollout.columns
    metrics.update("agent/turns", sum(columns["turns"]) / len(rollout))
    metrics.update("agent/tool_calls", sum(columns["tool_calls"]) / len(rollout))
    for kind in TOOL_ERROR_KINDS:
        metrics.update(f"agent/tool_errors/{kind}", sum(e.get(kind, 0) for e in columns["tool_errors"]) / len(rollout))
    metrics.update("agent/environment_reward", sum(columns["environment_reward"]) / len(rollout))
    metrics.update("agent/model_tokens", rollout.completion_mask.sum() / len(rollout))
    metrics.update("agent/environment_tokens", rollout.environment_mask.sum() / len(rollout))
    metrics.update("agent/truncated", rollout.truncated.float().mean())
    metrics.update("agent/environment_errors", sum(e is not None for e in columns["environment_error"]) / len(rollout))


def record_rewards(metrics: StepMetrics, rollout: Rollout, names: Sequence[str]) -> None:
    """The weighted reward's mean and within-group spread, and each reward function's mean (``names``)."""
    grouped = rollout.rewards.view(-1, rollout.group_size)
    metrics.update("reward", grouped.mean())
    metrics.update("reward_std", grouped.std(dim=1).mean() if rollout.group_size > 1 else 0.0)
    metrics.update("frac_reward_zero_std", (~functional.informative_groups(grouped)).float().mean())
    for name, column in zip(names, rollout.reward_per_function.unbind(1)):
        metrics.update(f"rewards/{name}/mean", torch.nanmean(column))
