"""Which engine samples the rollouts, from which weights: the HF path, the static engine, the
choice between them (the one place engine options are checked and resolved), and the rollout weights."""

from grpo_lightning.rollout.generation.choice import (
    EnginePlan,
    EngineTarget,
    check_engine_options,
    resolve_engine,
    static_engine_blocker,
)
from grpo_lightning.rollout.generation.compile_payback import FitLength
from grpo_lightning.rollout.generation.hf import generate_group
from grpo_lightning.rollout.generation.sampler import RolloutSampler, announce_prompt_format, build_rollout, format_prompt
from grpo_lightning.rollout.generation.sampler import announce_rollout_mode
from grpo_lightning.rollout.generation.sampler import prompt_format_note, sampling_keys
from grpo_lightning.rollout.generation.weights import RolloutWeights, samples_from_shards
from grpo_lightning.rollout.generation.weights import save_policy

__all__ = [
    "EnginePlan",
    "EngineTarget",
    "FitLength",
    "RolloutSampler",
    "RolloutWeights",
    "announce_prompt_format",
    "announce_rollout_mode",
    "build_rollout",
    "check_engine_options",
    "format_prompt",
    "generate_group",
    "prompt_format_note",
    "resolve_engine",
    "samples_from_shards",
    "sampling_keys",
    "save_policy",
    "static_engine_blocker",
]
