"""Environments written for other libraries, run as this one's multi-turn environments: TRL's
``environment_factory`` contract (:mod:`grpo_lightning.agents.adapters.trl`)."""
