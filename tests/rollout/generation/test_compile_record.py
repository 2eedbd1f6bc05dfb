"""The record of compiled parts says warm only for the same software, device, model shape, options and
compile-cache folders, and only while those folders are there and not empty; ``auto`` weighs the static
engine's Triton kernels from it. No GPU here: the record is built from a shape written out by hand
(``CompiledShape.of`` reads the CUDA device), and the compiled code is stood for by a file in each cache."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.generation import EngineTarget, FitLength, RolloutSampler, resolve_engine
from grpo_lightning.rollout.generation.compile_record import CompiledShape, CompileRecord
from grpo_lightning.rollout.types import SamplingParams
from grpo_lightning.variants import GRPO

SMOLLM2 = CompiledShape("llama", 30, 576, 9, 3, 64, 49152, "torch.bfloat16", "NVIDIA H200 sm90")
KERNELS = {"fuse_projections": True, "decode_attention": "auto"}
ONE_MINUTE = FitLength(max_steps=None, max_time_s=60.0, max_new_tokens=16)


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Empty Inductor, Triton and project caches of this test's own."""
    folders = {name: tmp_path / name for name in ("inductor", "triton", "project")}
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folders["inductor"]))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["triton"]))
    monkeypatch.setenv("GRPO_LIGHTNING_CACHE", str(folders["project"]))
    return folders


def compiled_into(*folders):
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernel.cubin").write_bytes(b"compiled")


def test_a_part_is_warm_once_compiled_and_only_for_what_it_was_compiled_for(caches):
    record = CompileRecord.here(SMOLLM2)
    assert not record.is_warm("kernels", KERNELS)
    compiled_into(caches["triton"])
    record.mark("kernels", KERNELS)
    assert CompileRecord.here(SMOLLM2).is_warm("kernels", KERNELS)  # as the next process reads it
    assert not record.is_warm("kernels", {**KERNELS, "decode_attention": "sdpa"})
    assert not record.is_warm("decode", KERNELS)
    deeper = CompileRecord.here(dataclasses.replace(SMOLLM2, num_layers=32))
    assert not deeper.is_warm("kernels", KERNELS)
    other_card = CompileRecord.here(dataclasses.replace(SMOLLM2, device="NVIDIA H100 sm90"))
    assert not other_card.is_warm("kernels", KERNELS)


def test_a_new_compiler_version_reads_cold(caches):
    compiled_into(caches["triton"])
    CompileRecord.here(SMOLLM2).mark("kernels", KERNELS)
    for software in ({"torch": "9.9.9", "triton": "3.6.0"}, {"torch": "2.11.0", "triton": None}):
        assert not dataclasses.replace(CompileRecord.here(SMOLLM2), versions=software).is_warm("kernels", KERNELS)


def test_a_deleted_or_emptied_cache_folder_reads_cold(caches):
    compiled_into(caches["inductor"], caches["triton"])
    record = CompileRecord.here(SMOLLM2)
    record.mark("decode", {"max_new_tokens": 16})
    record.mark("kernels", KERNELS)
    assert record.is_warm("decode", {"max_new_tokens": 16}) and record.is_warm("kernels", KERNELS)
    shutil.rmtree(caches["inductor"])
    assert not record.is_warm("decode", {"max_new_tokens": 16}) and record.is_warm("kernels", KERNELS)
    (caches["triton"] / "kernel.cubin").unlink()  # emptied
    assert not record.is_warm("kernels", KERNELS)


def test_other_cache_folders_read_cold_and_an_empty_one_is_not_marked(caches, tmp_path, monkeypatch):
    compiled_into(caches["triton"])
    CompileRecord.here(SMOLLM2).mark("kernels", KERNELS)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "elsewhere"))
    compiled_into(tmp_path / "elsewhere")
    assert not CompileRecord.here(SMOLLM2).is_warm("kernels", KERNELS)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    CompileRecord.here(SMOLLM2).mark("kernels", KERNELS)  # nothing was compiled into it
    assert not CompileRecord.here(SMOLLM2).is_warm("kernels", KERNELS)


def test_an_unwritable_project_cache_records_nothing_and_raises_nothing(caches):
    compiled_into(caches["triton"])
    caches["project"].write_text("a file where the cache folder should be")
    CompileRecord.here(SMOLLM2).mark("kernels", KERNELS)
    assert not CompileRecord.here(SMOLLM2).is_warm("kernels", KERNELS)


def test_the_shape_is_read_from_the_model_and_its_card(make_module, monkeypatch):
    import torch

    # No CUDA device here: its name and capability stand in for the card's.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    grpo = make_module(GRPO, policy={"dtype": "float32"})
    config = grpo.policy.config
    shape = CompiledShape.of(grpo.policy)
    assert shape == CompiledShape(
        "qwen2", config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
        config.num_key_value_heads, config.hidden_size // config.num_attention_heads, config.vocab_size,
        "torch.float32", "NVIDIA H200 sm90",
    )  # fmt: skip
    assert EngineTarget.of(grpo.policy, "cuda").record.shape == shape
    assert EngineTarget.of(grpo.policy, "cpu").record is None


def smollm2_target(record=None):
    return EngineTarget("cuda", "llama", "sdpa", num_layers=30, record=record or CompileRecord.here(SMOLLM2))


def test_a_minute_on_a_cold_triton_cache_decodes_with_the_torch_fallbacks_and_says_why(caches):
    # 200 eager steps of 0.30 s in a minute: the kernels save (1e-5 x 30 + 8.4e-5) x 16 x 200 = 1.2 s for 25 s cold.
    plan = resolve_engine(EngineOptions(), smollm2_target(), fit=ONE_MINUTE)
    assert plan.rollout == "static" and not plan.triton_kernels and plan.decode_attention == "sdpa"
    assert "Triton kernels off, their torch fallbacks instead (cold cache: saves ~1 s, costs ~25 s)" in plan.notes[-1]
    assert "kernels" not in plan.compiled  # nothing to record as compiled


def test_a_warm_triton_cache_keeps_the_kernels_and_says_so(caches):
    compiled_into(caches["triton"])
    CompileRecord.here(SMOLLM2).mark("kernels", KERNELS)
    plan = resolve_engine(EngineOptions(), smollm2_target(), fit=ONE_MINUTE)
    assert plan.triton_kernels and plan.decode_attention == "auto"
    assert "Triton kernels on (warm cache: saves ~1 s, costs ~0 s)" in plan.notes[-1]


def test_explicit_attention_settings_are_kept_whatever_the_cache(caches):
    plan = resolve_engine(EngineOptions(decode_attention="triton"), smollm2_target(), fit=ONE_MINUTE)
    assert plan.decode_attention == "triton" and not plan.triton_kernels  # q/k/v and sampling: fallbacks
    long_fit = FitLength(max_steps=None, max_time_s=None, max_new_tokens=16)
    plan = resolve_engine(EngineOptions(decode_attention="sdpa"), smollm2_target(), fit=long_fit)
    assert plan.decode_attention == "sdpa" and plan.triton_kernels


def test_what_a_run_marks_is_what_the_next_run_finds_warm(caches):
    compiled_into(caches["inductor"], caches["triton"])
    long_fit = FitLength(max_steps=10_000, max_time_s=None, max_new_tokens=16)  # kernels: 61 s saved for 25 s
    first = resolve_engine(EngineOptions(), smollm2_target(), fit=long_fit)
    assert set(first.compiled) == {"decode", "logprobs", "kernels"} and "warm" not in first.notes[-1]
    first.mark_compiled("decode", "logprobs", "kernels")
    second = resolve_engine(EngineOptions(), smollm2_target(), fit=long_fit)
    assert "compiled on a warm cache" in second.notes[-1] and "Triton kernels on (warm cache" in second.notes[-1]
    # A short run keeps its Triton kernels now, and weighs its graphs at the warm cost.
    short = resolve_engine(EngineOptions(), smollm2_target(), fit=ONE_MINUTE)
    assert short.triton_kernels and "log-prob passes on (compiled on a warm cache" in short.notes[-1]


def test_the_sampler_builds_the_engine_on_the_fallbacks_the_plan_chose_and_marks_once(make_module):
    grpo = make_module(GRPO, engine=EngineOptions(rollout="static"), policy={"dtype": "float32"})
    plan = resolve_engine(grpo.engine_options, EngineTarget.of(grpo.policy, "cpu"))
    marked = []
    plan = dataclasses.replace(plan, triton_kernels=False, compiled={"decode": {"max_new_tokens": 2}})
    object.__setattr__(plan, "mark_compiled", lambda *parts: marked.append(parts))  # stands for the CUDA record
    sampler = RolloutSampler(plan)
    validation = SamplingParams(max_new_tokens=3, temperature=0.0)  # another cache length: not the fit's decode step
    sampler.sample(grpo.policy, grpo.tokenizer, ["1+2="], 2, validation)
    assert sampler.engine.qkv_kernel is False and sampler.engine.sampling_kernel is False
    for _ in range(2):
        sampler.sample(grpo.policy, grpo.tokenizer, ["1+2="], 2, SamplingParams(max_new_tokens=2, temperature=0.0))
    assert marked == [("kernels",), ("decode",), ()]
