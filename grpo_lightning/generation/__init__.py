"""Which engine samples the rollouts: the HF path, the static engine, and the choice between them."""

from grpo_lightning.generation.choice import (
    EnginePlan,
    EngineTarget,
    check_engine_options,
    resolve_engine,
    static_engine_blocker,
)
from grpo_lightning.generation.hf import generate_group
from grpo_lightning.generation.sampler import RolloutSampler, build_rollout, format_prompt, sampling_keys

__all__ = [
    "EnginePlan",
    "EngineTarget",
    "RolloutSampler",
    "build_rollout",
    "check_engine_options",
    "format_prompt",
    "generate_group",
    "resolve_engine",
    "sampling_keys",
    "static_engine_blocker",
]
