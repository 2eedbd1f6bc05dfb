"""The choice of engine: the one place that checks and resolves the engine options.

:func:`check_engine_options` runs at construction (settings wrong whatever the device);
:func:`resolve_engine` once the device, model and strategy are known. ``"auto"`` and ``None`` become
concrete settings there; a fallback of an automatic setting is announced once with its reason, and an
explicit setting that cannot run raises :class:`~grpo_lightning.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from grpo_lightning.rollout.engine import DECODE_ATTENTION_KINDS
from grpo_lightning.rollout.engine.fused_decode import FUSED_MODEL_TYPES
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.generation.compile_payback import (
    FitLength,
    compile_cache_is_warm,
    compile_choices,
    triton_kernels_pay_back,
)
from grpo_lightning.rollout.generation.compile_record import CompileRecord, record_for
from grpo_lightning.errors import ConfigError, require
from grpo_lightning.models.logprobs import supports_packed_sequences

#: Attention implementations the static engine decodes with (``None`` is eager).
STATIC_ATTENTION = ("sdpa", "eager")

ROLLOUTS = ("auto", "static", "hf")


@dataclass(frozen=True)
class EngineTarget:
    """What the choice depends on: the device and the model that rollouts sample from."""

    device_type: str
    model_type: str | None = None
    attn_implementation: str | None = None
    full_attention: bool = True
    sharded: bool = False
    """The policy is sharded (FSDP)."""
    gathered: bool = False
    """Rollouts sample from the sharded policy itself (FSDP ``rollout_weights="gather"``)."""
    num_layers: int | None = None
    """The model's decoder layers (what compiling it costs and saves grows with)."""
    record: CompileRecord | None = None
    """What this machine has compiled for the model (on CUDA): whether each part's compile cache is warm."""

    @classmethod
    def of(cls, model: Any, device_type: str, sharded: bool = False, gathered: bool = False) -> EngineTarget:
        """The target of a Hugging Face model (unwrapped from FSDP) on a device of ``device_type``."""
        config = getattr(model, "module", model).config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        layer_types = getattr(config, "layer_types", None) or ()
        full = all(kind == "full_attention" for kind in layer_types) and not getattr(config, "use_sliding_window", False)
        return cls(
            device_type=device_type,
            model_type=getattr(config, "model_type", None),
            attn_implementation=getattr(config, "_attn_implementation", None),
            full_attention=full,
            sharded=sharded,
            gathered=gathered,
            num_layers=getattr(config, "num_hidden_layers", None),
            record=record_for(model) if device_type == "cuda" else None,
        )


@dataclass(frozen=True)
class EnginePlan:
    """The engine options resolved for one target: every field concrete."""

    device_type: str
    """The device the plan was made for."""
    rollout: Literal["static", "hf"]
    compile: bool
    decode_attention: str
    fuse_projections: bool
    logprob_compile: bool
    model_compile: bool
    fused_lm_head: bool
    padding_free: bool
    triton_kernels: bool = True
    """The static engine's Triton kernels where they run (``False``: their torch fallbacks)."""
    notes: tuple[str, ...] = ()
    """Automatic settings that fell back, each with its reason (announced as information)."""
    warnings: tuple[str, ...] = ()
    """Explicit settings that run otherwise than asked, and why (announced as warnings)."""
    record: CompileRecord | None = None
    """Where the plan's compiled parts are recorded once they have run (the target's record)."""
    compiled: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The parts this plan compiles (``compile_record.PARTS``), each with the options that change its code."""

    def mark_compiled(self, *parts: str) -> None:
        """Record that these of the plan's compiled parts have compiled and run (:meth:`CompileRecord.mark`)."""
        for part in parts:
            if self.record is not None and part in self.compiled:
                self.record.mark(part, self.compiled[part])

    def logprob_options(self) -> dict[str, bool]:
        """Keyword arguments of :func:`grpo_lightning.models.logprobs.completion_logprobs`."""
        return {
            "compiled": self.logprob_compile,
            "fused_head": self.fused_lm_head,
            "packed": self.padding_free,
            "compiled_model": self.model_compile,
        }

    def announce(self) -> None:
        for note in self.notes:
            rank_zero_info(note)
        for warning in self.warnings:
            rank_zero_warn(warning)


def static_only_settings(options: EngineOptions, rollout_seed: int | None) -> list[str]:
    """The explicit settings that only the static engine runs, by field name."""
    asked = {
        "sampling.seed": rollout_seed is not None,
        "engine.compile": bool(options.compile),
        "engine.decode_attention": options.decode_attention != "auto",
        "engine.fuse_projections": bool(options.fuse_projections),
    }
    return [name for name, given in asked.items() if given]


def check_engine_options(options: EngineOptions, rollout_seed: int | None = None, beam_search: bool = False) -> None:
    """Raise :class:`ConfigError` for settings that are wrong on any device (``beam_search``: the
    module's ``sampling.mode`` is ``"beam_search"``, which only the HF path runs)."""
    require(options.rollout in ROLLOUTS, f"engine.rollout: {options.rollout!r} is not one of {', '.join(map(repr, ROLLOUTS))}.")
    if beam_search:
        static = ["engine.rollout"] if options.rollout == "static" else []
        for name in static + static_only_settings(options, rollout_seed):
            raise ConfigError(
                f"{name}: a setting of the static engine, which samples and does no beam search, and sampling.mode is "
                f"'beam_search' (the HF generate path); leave {name} unset (engine.rollout 'auto' or 'hf'), "
                "or set sampling.mode to 'sample'."
            )
    require(
        options.decode_attention in DECODE_ATTENTION_KINDS,
        f"engine.decode_attention: {options.decode_attention!r} is not one of {', '.join(map(repr, DECODE_ATTENTION_KINDS))}.",
    )
    if options.rollout == "hf":
        for name in static_only_settings(options, rollout_seed):
            raise ConfigError(
                f"{name}: it is a setting of the static engine, and engine.rollout is 'hf'; set engine.rollout to "
                f"'static' or 'auto', or leave {name} unset."
            )
    require(
        not options.padding_free or supports_packed_sequences(),
        "engine.padding_free: this transformers release does not detect packed sequences from their position ids; "
        "upgrade transformers or set engine.padding_free to false.",
    )


def static_engine_blocker(target: EngineTarget) -> str | None:
    """Why the static engine cannot sample from the target's model, or ``None`` when it can."""
    attention = target.attn_implementation or "eager"
    if target.gathered:
        return "FSDP's rollout_weights='gather' samples from sharded weights and the static engine needs whole ones"
    if attention not in STATIC_ATTENTION:
        return f"the model's attn_implementation {attention!r} is not one the static engine runs ({', '.join(STATIC_ATTENTION)})"
    if not target.full_attention:
        return "the model has sliding-window layers and the static engine runs full attention only"
    return None


def resolve_engine(
    options: EngineOptions,
    target: EngineTarget,
    rollout_seed: int | None = None,
    beam_search: bool = False,
    fit: FitLength | None = None,
) -> EnginePlan:
    """The options made concrete for ``target``; ``fit``: how long the run is, where known.

    * ``rollout "auto"``: the static engine on CUDA where it can run, or where an explicit setting
      needs it (:func:`static_only_settings`); the HF path otherwise (a CPU, an unsupported model,
      ``beam_search``: the module's ``sampling.mode`` is ``"beam_search"``).
    * ``compile``: on with the static engine on CUDA. ``fuse_projections``: the same, for the model
      types of ``FUSED_MODEL_TYPES``. ``decode_attention "auto"`` is the engine's own choice per device.
    * ``logprob_compile``, ``fused_lm_head``: on CUDA. ``model_compile``: on CUDA for unsharded models.
    * With ``fit`` given, the three compilation options left automatic (``compile``,
      ``model_compile``, ``logprob_compile``) are on only where compiling is estimated to pay back
      within the run (:func:`~grpo_lightning.rollout.generation.compile_payback.compile_choices`), cold or warm
      as this machine's record of compiled parts says (``target.record``); so are the static engine's
      Triton kernels (q/k/v, sampling, and decode attention where ``decode_attention`` is ``"auto"``),
      which otherwise run their torch fallbacks. The choice and its reason are announced in one line.
    """
    check_engine_options(options, rollout_seed, beam_search)
    cuda = target.device_type == "cuda"
    blocker = "sampling.mode is 'beam_search', and the static engine only samples" if beam_search else None
    blocker = blocker or static_engine_blocker(target)
    needs_static = static_only_settings(options, rollout_seed)
    notes: list[str] = []
    warnings: list[str] = []
    rollout = options.rollout
    if blocker is not None and (rollout == "static" or needs_static):
        name = "engine.rollout" if rollout == "static" else needs_static[0]
        raise ConfigError(
            f"{name}: needs the static engine, which cannot run here: {blocker}. Set engine.rollout to 'hf' "
            "and leave the static engine's settings unset, or change the model or strategy."
        )
    if rollout == "auto":
        rollout = "static" if blocker is None and (cuda or needs_static) else "hf"
        if rollout == "hf":
            reason = blocker or f"the model is on the {target.device_type.upper()}, not on CUDA"
            notes.append(f"engine.rollout auto: using the HF generate path because {reason}.")
    static = rollout == "static"
    fuse = options.fuse_projections
    if fuse is None:
        fuse = static and cuda and target.model_type in FUSED_MODEL_TYPES
        if static and cuda and not fuse:
            notes.append(
                f"engine.fuse_projections auto: off because the model type {target.model_type!r} is not one of "
                f"{', '.join(FUSED_MODEL_TYPES)}."
            )
    compile_decode, compile_logprob, kernels = static and cuda, cuda, True
    automatic = [options.compile is None and static, options.model_compile is None, options.logprob_compile is None]
    parts = part_options(options, target, fuse, fit)
    if fit is not None and cuda and target.num_layers and (static or any(automatic)):
        is_warm = functools.partial(compile_cache_is_warm, target.record)
        warm = set(fit.warm) | ({"kernels"} if is_warm("kernels", parts["kernels"]) else set())
        kernels = not static or triton_kernels_pay_back(replace(fit, warm=frozenset(warm)), target.num_layers)
        parts["decode"]["triton_kernels"] = kernels
        warm |= {part for part in ("decode", "logprobs") if is_warm(part, parts[part])}
        weighed = (static and options.compile is None, static, any(automatic[1:]))
        explicit = {"decode": static and options.compile, "logprobs": options.model_compile or options.logprob_compile}
        already = frozenset(part for part, on in explicit.items() if on)
        choice = compile_choices(replace(fit, warm=frozenset(warm)), target.num_layers, *weighed, already=already)
        compile_decode, compile_logprob = choice.compile, choice.logprob_passes
        notes.append(f"engine compilation auto: {choice.reason}.")
    model_compile = options.model_compile
    if model_compile is None:
        model_compile = compile_logprob and not target.sharded
    elif model_compile and target.sharded:
        warnings.append("engine.model_compile: the policy is sharded (FSDP), so its log-prob passes run eagerly.")
        model_compile = False
    if options.padding_free and (target.attn_implementation or "eager") in ("sdpa", "eager"):
        warnings.append(
            f"engine.padding_free with attn_implementation {target.attn_implementation or 'eager'!r}: packed rows "
            "are kept apart by a dense mask over the whole packed sequence, which usually costs more than the "
            "padding it saves; use flash_attention_2 or flex_attention (on a GPU)."
        )
    plan = EnginePlan(
        device_type=target.device_type,
        rollout=rollout,
        compile=compile_decode if options.compile is None else options.compile,
        decode_attention="sdpa" if not kernels and options.decode_attention == "auto" else options.decode_attention,
        fuse_projections=fuse,
        logprob_compile=compile_logprob if options.logprob_compile is None else options.logprob_compile,
        model_compile=model_compile,
        fused_lm_head=cuda if options.fused_lm_head is None else options.fused_lm_head,
        padding_free=options.padding_free,
        triton_kernels=kernels,
        notes=tuple(notes),
        warnings=tuple(warnings),
        record=target.record,
    )
    on = {"decode": static and plan.compile, "kernels": static and kernels,
          "logprobs": plan.model_compile or plan.logprob_compile}  # fmt: skip
    parts["logprobs"].update(model_compile=plan.model_compile, logprob_compile=plan.logprob_compile)
    return replace(plan, compiled={part: parts[part] for part, compiled in on.items() if compiled and cuda})


def part_options(options: EngineOptions, target: EngineTarget, fuse: bool, fit: FitLength | None) -> dict[str, dict]:
    """For each compiled part, the settings that change its code (what its record is named by):
    ``"decode"``'s ``triton_kernels`` is added once the kernels are chosen."""
    model_compile = options.model_compile is not False and not target.sharded
    return {
        "kernels": {"fuse_projections": fuse, "decode_attention": options.decode_attention},
        "decode": {"fuse_projections": fuse, "decode_attention": options.decode_attention, "triton_kernels": True,
                   "max_new_tokens": fit.max_new_tokens if fit is not None else None},  # fmt: skip
        "logprobs": {
            "model_compile": model_compile,
            "logprob_compile": True if options.logprob_compile is None else options.logprob_compile,
            "fused_lm_head": True if options.fused_lm_head is None else options.fused_lm_head,
            "padding_free": options.padding_free,
        },
    }
