"""Deprecated: cells validate before training through ``grpo-lightning fit`` itself
(``--validate_before_fit``); this alias of :class:`grpo_lightning.training.callbacks.ValidateBeforeTraining`
goes in the next release."""

from grpo_lightning.training.callbacks import ValidateBeforeTraining

__all__ = ["ValidateBeforeTraining"]
