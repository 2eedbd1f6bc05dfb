"""The choice of engine: ``auto`` and ``None`` resolved for the device, the model and the strategy,
fallbacks announced once with their reason, explicit settings that cannot run refused by name."""

from __future__ import annotations

import logging

import pytest

from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.generation import EngineTarget, resolve_engine
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO

CUDA_QWEN2 = EngineTarget(device_type="cuda", model_type="qwen2", attn_implementation="sdpa")
CPU_QWEN2 = EngineTarget(device_type="cpu", model_type="qwen2", attn_implementation="sdpa")


def test_auto_on_cuda_takes_every_fast_path_for_a_supported_model():
    plan = resolve_engine(EngineOptions(), CUDA_QWEN2)
    assert (plan.rollout, plan.compile, plan.fuse_projections) == ("static", True, True)
    assert plan.logprob_compile and plan.model_compile and plan.fused_lm_head
    assert plan.decode_attention == "auto"  # the engine's own choice per device: Triton on CUDA
    assert plan.notes == () and plan.warnings == ()


def test_auto_on_a_cpu_is_the_hf_path_without_compilation_and_says_why():
    plan = resolve_engine(EngineOptions(), CPU_QWEN2)
    assert (plan.rollout, plan.compile, plan.fuse_projections) == ("hf", False, False)
    assert not (plan.logprob_compile or plan.model_compile or plan.fused_lm_head or plan.padding_free)
    assert plan.notes == ("engine.rollout auto: using the HF generate path because the model is on the CPU, not on CUDA.",)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        (EngineTarget("cuda", "qwen2", "flash_attention_2"), "attn_implementation 'flash_attention_2'"),
        (EngineTarget("cuda", "gemma2", "sdpa", full_attention=False), "sliding-window layers"),
        (EngineTarget("cuda", "qwen2", "sdpa", sharded=True, gathered=True), "rollout_weights='gather'"),
    ],
    ids=["flash-attention", "sliding-window", "fsdp-gather"],
)
def test_auto_on_cuda_falls_back_to_hf_where_the_static_engine_cannot_run(target, reason):
    plan = resolve_engine(EngineOptions(), target)
    assert plan.rollout == "hf" and not plan.compile and not plan.fuse_projections
    assert len(plan.notes) == 1 and plan.notes[0].startswith("engine.rollout auto: using the HF generate path because")
    assert reason in plan.notes[0]
    assert plan.logprob_compile and plan.fused_lm_head  # the log-prob passes stay fast


def test_auto_fuses_projections_only_for_the_model_types_that_have_a_fused_decoder():
    plan = resolve_engine(EngineOptions(), EngineTarget("cuda", "gpt_neox", "sdpa"))
    assert plan.rollout == "static" and plan.compile and not plan.fuse_projections
    assert plan.notes and "engine.fuse_projections auto: off" in plan.notes[0] and "'gpt_neox'" in plan.notes[0]


def test_sharded_models_compute_their_log_probs_eagerly():
    target = EngineTarget("cuda", "qwen2", "sdpa", sharded=True)  # FSDP, rollouts from a replica
    assert resolve_engine(EngineOptions(), target).rollout == "static"
    assert not resolve_engine(EngineOptions(), target).model_compile
    plan = resolve_engine(EngineOptions(model_compile=True), target)
    assert not plan.model_compile and "sharded" in plan.warnings[0]


def test_explicit_settings_win_over_the_device_default():
    options = EngineOptions(rollout="static", compile=False, fuse_projections=False, logprob_compile=False, fused_lm_head=False)
    plan = resolve_engine(options, CUDA_QWEN2)
    assert plan.rollout == "static" and not (plan.compile or plan.fuse_projections or plan.logprob_compile or plan.fused_lm_head)
    assert resolve_engine(EngineOptions(rollout="hf"), CUDA_QWEN2).rollout == "hf"


@pytest.mark.parametrize(
    ("options", "seed"),
    [(EngineOptions(decode_attention="math"), None), (EngineOptions(fuse_projections=True), None), (EngineOptions(), 7)],
    ids=["decode_attention", "fuse_projections", "sampling.seed"],
)
def test_a_static_engine_setting_makes_auto_take_the_static_engine_on_a_cpu(options, seed):
    plan = resolve_engine(options, CPU_QWEN2, rollout_seed=seed)
    assert plan.rollout == "static" and not plan.compile and plan.notes == ()


@pytest.mark.parametrize(
    ("options", "seed", "field"),
    [
        (EngineOptions(rollout="static"), None, "engine.rollout"),
        (EngineOptions(fuse_projections=True), None, "engine.fuse_projections"),
        (EngineOptions(), 7, "sampling.seed"),
    ],
)
def test_explicit_settings_that_cannot_run_are_refused_naming_the_field(options, seed, field):
    target = EngineTarget("cuda", "qwen2", "flash_attention_2")
    with pytest.raises(ConfigError, match=rf"^{field}: needs the static engine.*'flash_attention_2'.*engine.rollout to 'hf'"):
        resolve_engine(options, target, rollout_seed=seed)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (EngineOptions(rollout="vllm"), "engine.rollout"),
        (EngineOptions(decode_attention="cudnn"), "engine.decode_attention"),
        (EngineOptions(rollout="hf", compile=True), "engine.compile"),
        (EngineOptions(rollout="hf", decode_attention="triton"), "engine.decode_attention"),
    ],
)
def test_settings_wrong_on_any_device_are_refused_before_the_device_is_known(options, field):
    with pytest.raises(ConfigError, match=rf"^{field}"):
        resolve_engine(options, CUDA_QWEN2)


def test_target_reads_the_model_config(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager")
    target = EngineTarget.of(model, "cpu")
    assert (target.model_type, target.attn_implementation, target.full_attention) == ("qwen2", "eager", True)


def test_the_module_resolves_once_and_announces_the_fallback_once(make_module, caplog):
    grpo = make_module(GRPO)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            grpo.generate({"prompt": ["1+2="]}, 2, grpo.sampling)
    announced = [r.getMessage() for r in caplog.records if "engine.rollout auto" in r.getMessage()]
    assert announced == ["engine.rollout auto: using the HF generate path because the model is on the CPU, not on CUDA."]
    assert grpo.engine_plan.rollout == "hf" and grpo.sampler.engine is None


def test_the_module_passes_a_cuda_plan_to_the_static_engine(make_module, monkeypatch):
    """The decision on a CUDA device, made here on a CPU: the module asks for the plan of its target;
    the plan it gets is the one it samples and computes log-probs with."""
    import grpo_lightning.rollout.generation.sampler as sampler_file

    asked = []

    def cuda_plan(options, target, rollout_seed=None, beam_search=False, fit=None):
        asked.append(target)
        plan = resolve_engine(options, EngineTarget("cuda", target.model_type, target.attn_implementation))
        return resolve_engine(EngineOptions(rollout=plan.rollout, fuse_projections=plan.fuse_projections), target)

    monkeypatch.setattr(sampler_file, "resolve_engine", cuda_plan)
    grpo = make_module(GRPO, policy={"dtype": "float32"})
    grpo.generate({"prompt": ["1+2="]}, 2, grpo.sampling)
    assert asked[0].device_type == "cpu" and asked[0].model_type == "qwen2"
    assert grpo.engine_plan.rollout == "static" and grpo.sampler.engine is not None
    assert grpo.sampler.engine.fuse_projections
