"""The speed options of rollouts and log-prob passes, as one group (``--model.engine.*``).

They change how fast a step runs, not what it computes (up to floating-point rounding). ``None``
and ``"auto"`` are chosen for the device, the model and the strategy by
:func:`grpo_lightning.rollout.generation.resolve_engine`, the one place that checks and resolves them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from grpo_lightning.runtime.argument_types import check_argument_types
from grpo_lightning.errors import ConfigError


@dataclass(frozen=True)
class EngineOptions:
    """How rollouts are sampled and log-prob passes are run; ``None``/``"auto"``: chosen for the device."""

    rollout: Literal["auto", "static", "hf"] = "auto"
    """``"static"``: sample on a preallocated static KV cache with, on CUDA, a decode step captured
    in a CUDA graph (:mod:`grpo_lightning.rollout.engine`; ``sdpa``/``eager`` attention, full-attention
    models). ``"hf"``: ``model.generate``. ``"auto"``: static on CUDA where the model supports it,
    or where a setting needs it (``sampling.seed``, ``compile``, ``decode_attention``,
    ``fuse_projections``); HF elsewhere, with the reason announced once."""

    compile: bool | None = None
    """Compile the static engine's decode step with ``torch.compile`` (on CUDA before capturing it
    in the CUDA graph); the first rollout compiles. ``None``: on CUDA."""

    decode_attention: str = "auto"
    """How the static engine's decode step computes attention
    (:data:`grpo_lightning.rollout.engine.DECODE_ATTENTION_KINDS`): ``"auto"`` (``"triton"`` on CUDA when
    Triton is installed, ``"math"`` on a CPU, else ``"sdpa"``), ``"sdpa"``, ``"efficient"``,
    ``"math"`` (matrix products around an fp32 softmax) or ``"triton"`` (one Triton kernel)."""

    fuse_projections: bool | None = None
    """With the static engine, decode with each layer's q/k/v and gate/up products as one matrix
    product each (model types of :data:`grpo_lightning.rollout.engine.fused_decode.FUSED_MODEL_TYPES`); the
    parameters become views of one buffer per layer, no copy. ``None``: on CUDA for those types."""

    logprob_compile: bool | None = None
    """Fuse the fp32 log-softmax arithmetic of the log-prob passes (reference, old policy, update)
    with ``torch.compile``. ``None``: on CUDA."""

    model_compile: bool | None = None
    """Run the model's forward and backward pass of the log-prob passes through ``torch.compile``
    (the first passes compile; new lengths recompile once, then run with dynamic shapes). Sharded
    (FSDP) models run eagerly. ``None``: on CUDA for unsharded models."""

    fused_lm_head: bool | None = None
    """Run the LM head chunk by chunk inside the fp32 log-softmax
    (:func:`grpo_lightning.models.logprobs.linear_token_logprobs`), so a micro-batch's logits and their
    gradient never exist whole; models whose logits are not exactly ``lm_head(hidden)`` take the
    unfused path. ``None``: on CUDA (on a CPU the recomputed head costs time)."""

    padding_free: bool = False
    """Run each micro-batch of the log-prob passes as one packed sequence without padding. Pays off
    with attention that keeps packed rows apart itself (``flash_attention_2``, ``flex_attention``);
    under ``sdpa``/``eager`` a dense mask does, which usually costs more than the padding saves."""

    @classmethod
    def of(cls, value: EngineOptions | dict[str, Any]) -> EngineOptions:
        """``value`` itself, or built from a dict of its fields (the CLI's, a checkpoint's
        hyperparameters); an unknown field or a value of the wrong type is a :class:`ConfigError`."""
        if isinstance(value, dict):
            unknown = sorted(set(value) - {field.name for field in fields(cls)})
            if unknown:
                names = ", ".join(field.name for field in fields(cls))
                raise ConfigError(f"engine: no option {unknown[0]!r}; give one of {names}.")
            value = cls(**value)
        if not isinstance(value, cls):
            raise ConfigError(f"engine: give EngineOptions or a dict of its fields, got {value!r}.")
        check_argument_types(cls, asdict(value), field="engine.", cli="--model.engine.")
        return value
