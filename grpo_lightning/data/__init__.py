"""Prompt datasets and Lightning data modules."""

from grpo_lightning.data.arithmetic import format_target, make_arithmetic_dataset
from grpo_lightning.data.datamodule import ArithmeticDataModule, PromptDataModule

__all__ = ["ArithmeticDataModule", "PromptDataModule", "format_target", "make_arithmetic_dataset"]
