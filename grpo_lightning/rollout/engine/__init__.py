"""The fast rollout engine: static KV cache, compiled decode step in a CUDA graph, Triton kernels."""

from grpo_lightning.rollout.engine.attention import DECODE_ATTENTION_KINDS
from grpo_lightning.rollout.engine.cache import new_static_cache, slot_limits
from grpo_lightning.rollout.engine.generator import StaticCacheGenerator
from grpo_lightning.rollout.engine.group import fast_generate_group
from grpo_lightning.rollout.engine.sampling import (
    cumulative_count_sample,
    exponential_race_sample,
    inverse_cdf_sample,
    keyed_uniforms,
    sample_tokens,
)

__all__ = [
    "DECODE_ATTENTION_KINDS",
    "StaticCacheGenerator",
    "cumulative_count_sample",
    "exponential_race_sample",
    "fast_generate_group",
    "inverse_cdf_sample",
    "keyed_uniforms",
    "new_static_cache",
    "sample_tokens",
    "slot_limits",
]
