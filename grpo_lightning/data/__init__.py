"""Prompt datasets and Lightning data modules."""

from grpo_lightning.data.arithmetic import format_target, make_arithmetic_dataset
from grpo_lightning.data.curriculum import DifficultyCurriculum
from grpo_lightning.data.datamodule import ArithmeticDataModule, PromptDataModule
from grpo_lightning.data.reasoning_gym import ReasoningGymDataModule, make_reasoning_gym_dataset

__all__ = [
    "ArithmeticDataModule",
    "DifficultyCurriculum",
    "PromptDataModule",
    "ReasoningGymDataModule",
    "format_target",
    "make_arithmetic_dataset",
    "make_reasoning_gym_dataset",
]
