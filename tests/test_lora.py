"""LoRA through PEFT: only the adapters train, the reference model is the base model with no
second copy, rollouts sample from the merged weights, checkpoints hold the adapters and resume
exactly, and the run exports as a merged model or as the adapter."""

from __future__ import annotations

import json

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_checkpoint import CONFIGS, assert_same_steps, fit, logits, make_module
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.cli import GRPOLightningCLI
from grpo_lightning.export import export_checkpoint, read_checkpoint
from grpo_lightning.lora import (
    adapter_settings,
    has_adapters,
    merged_model,
    merged_weights,
)
from grpo_lightning.settings import ConfigError
from variants import GRPO

peft = pytest.importorskip("peft")

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}


def lora_module(model_dir: str, **overrides):
    return make_module(model_dir, beta=0.04, dtype="float32", peft_config=LORA, **overrides)


def test_the_config_is_kept_as_plain_values_and_checked():
    settings = adapter_settings(peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_rslora=True))
    assert settings == {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
                        "use_rslora": True}  # fmt: skip
    assert adapter_settings(LORA) == {**LORA, "lora_dropout": 0.0} and adapter_settings(None) is None
    with pytest.raises(ConfigError, match=r"peft_config: \['rank'\] are not fields of peft.LoraConfig"):
        GRPO(model="m", peft_config={"rank": 4})
    with pytest.raises(ConfigError, match="peft_config: give a peft.LoraConfig"):
        GRPO(model="m", peft_config=3)
    with pytest.raises(ConfigError, match="peft_config: When `layers_pattern` is specified"):  # peft's own check
        GRPO(model="m", peft_config={"r": 4, "layers_pattern": "layers"})


def test_only_the_adapters_train_and_the_reference_is_the_base_model(tiny_model_dir, tmp_path):
    module = lora_module(tiny_model_dir)
    fit(module, 2, tmp_path)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert has_adapters(module.policy) and module.ref_model is None  # no second copy of the weights
    trained = {n for n, p in module.policy.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    start = dict(base.named_parameters())
    for name, parameter in module.policy.named_parameters():
        if name in trained:
            continue
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(parameter, start[plain]), f"{name} changed"
    assert any(module.policy.get_parameter(n).abs().sum() > 0 for n in trained if ".lora_B." in n)  # B moved off 0

    # pi_ref: the policy with its adapters off gives the base model's log-probs
    rollout = module.last_rollout
    ref = module.compute_logprobs(base.eval(), rollout)
    assert torch.equal(rollout.ref_logp, ref)
    assert not torch.allclose(module.compute_logprobs(module.policy, rollout), ref)  # the adapters act


def test_rollouts_sample_from_the_merged_weights(tiny_model_dir, tmp_path):
    module = lora_module(tiny_model_dir)
    fit(module, 2, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    merged = merged_model(module.policy)
    assert not has_adapters(merged)
    module.policy.eval()
    torch.testing.assert_close(logits(merged, tokenizer), logits(module.policy, tokenizer), rtol=1e-5, atol=1e-5)
    with module.rollout_model() as model:
        assert not has_adapters(model)
        assert module.rollout_weights.replica.version == module.policy_version == 2
        for name, tensor in merged_weights(module.policy):
            assert torch.equal(model.get_parameter(name), tensor), name


def test_a_resumed_lora_fit_logs_what_an_uninterrupted_fit_logs(tiny_model_dir, tmp_path):
    full, _ = fit(lora_module(tiny_model_dir), 4, tmp_path / "full")
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2)
    fit(lora_module(tiny_model_dir), 2, tmp_path / "first", callbacks=[every])
    path = tmp_path / "ckpt" / "step=2.ckpt"
    state = read_checkpoint(path)["state_dict"]
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)  # the adapters only
    resumed, _ = fit(lora_module(tiny_model_dir), 4, tmp_path / "resumed", ckpt_path=path)
    assert_same_steps(resumed, full, 3, 4)


def test_the_run_exports_as_a_merged_model_or_as_the_adapter(tiny_model_dir, tmp_path):
    module = lora_module(tiny_model_dir)
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2)
    fit(module, 2, tmp_path, callbacks=[every])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    module.policy.eval()
    expected = logits(merged_model(module.policy), tokenizer)

    module.save_pretrained(tmp_path / "saved")  # a plain Hugging Face model
    export_checkpoint(tmp_path / "ckpt" / "step=2.ckpt", tmp_path / "merged")
    for directory in ("saved", "merged"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / directory)
        assert not any("lora" in n for n, _ in model.named_parameters())
        torch.testing.assert_close(logits(model, tokenizer), expected, rtol=1e-5, atol=1e-5)

    export_checkpoint(tmp_path / "ckpt" / "step=2.ckpt", tmp_path / "adapter", adapter=True)
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 4
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "adapter")
    torch.testing.assert_close(logits(loaded.eval(), tokenizer), expected, rtol=1e-5, atol=1e-5)


def test_lora_is_one_option_of_the_cli_and_refused_under_fsdp(tiny_model_dir, tmp_path):
    args = [
        "--config", str(CONFIGS / "variant/grpo.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
        "--config", str(CONFIGS / "lora/lora.yaml"),
        "--model.model", tiny_model_dir, "--trainer.default_root_dir", str(tmp_path),
    ]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    assert cli.model.hparams.peft_config["r"] == 16 and cli.model.hparams.peft_config["target_modules"] == "all-linear"
    from grpo_lightning.models import load_models
    from grpo_lightning.strategies import PolicyFSDPStrategy

    with pytest.raises(ConfigError, match="peft_config: LoRA runs on one device or under DDP"):
        load_models(tiny_model_dir, cli.model.hparams, True, PolicyFSDPStrategy(mixed_precision=None))


def test_the_fused_lm_head_path_gives_the_peft_models_log_probs(tiny_model_dir, tmp_path):
    from grpo_lightning.logprobs import completion_logprobs

    module = lora_module(tiny_model_dir)
    fit(module, 2, tmp_path)
    inputs = module.last_rollout.model_inputs(torch.arange(len(module.last_rollout)))
    module.policy.eval()
    plain, _ = completion_logprobs(module.policy, *inputs, with_entropy=False)
    fused, _ = completion_logprobs(module.policy, *inputs, with_entropy=False, fused_head=True)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    with module.policy.disable_adapter():
        base, _ = completion_logprobs(module.policy, *inputs, with_entropy=False, fused_head=True)
    torch.testing.assert_close(base, module.last_rollout.ref_logp, rtol=1e-5, atol=1e-5)
    assert (base - plain).abs().max() > 1e-4  # the adapters act
