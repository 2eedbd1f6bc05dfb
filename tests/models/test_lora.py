"""LoRA through PEFT: only the adapters train, the reference model is the base model with no
second copy, rollouts sample from the merged weights, checkpoints hold the adapters and resume
exactly, and the run exports as a merged model or as the adapter."""

from __future__ import annotations

import contextlib
import json

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.checkpoints.export import export_checkpoint, read_checkpoint
from grpo_lightning.models.lora import (
    adapter_settings,
    has_adapters,
    merged_model,
    merged_weights,
)
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO
from tests.helpers import CONFIGS, assert_same_steps, fit, logits, make_module, merged

peft = pytest.importorskip("peft")

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}


def lora_module(model_dir: str, **overrides):
    return make_module(
        model_dir, **merged({"kl": {"beta": 0.04}, "policy": {"dtype": "float32", "peft_config": LORA}}, overrides)
    )


def test_the_config_is_kept_as_plain_values_and_checked():
    settings = adapter_settings(peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_rslora=True))
    assert settings == {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
                        "use_rslora": True}  # fmt: skip
    assert adapter_settings(LORA) == {**LORA, "lora_dropout": 0.0} and adapter_settings(None) is None
    with pytest.raises(ConfigError, match=r"policy.peft_config: \['rank'\] are not fields of peft.LoraConfig"):
        GRPO(model="m", policy={"peft_config": {"rank": 4}})
    with pytest.raises(ConfigError, match="policy.peft_config: give a peft.LoraConfig"):
        GRPO(model="m", policy={"peft_config": 3})
    with pytest.raises(ConfigError, match="policy.peft_config: When `layers_pattern` is specified"):  # peft's own check
        GRPO(model="m", policy={"peft_config": {"r": 4, "layers_pattern": "layers"}})


@pytest.mark.parametrize(("fields", "refusal"), [
    ({"use_dora": True}, r"policy.peft_config.use_dora=True is not supported: DoRA's magnitude vectors are not merged"),
    ({"bias": "all"}, r"policy.peft_config.bias='all' is not supported: trained biases of the base stay on"),
    ({"bias": "lora_only"}, r"policy.peft_config.bias='lora_only' is not supported"),
])  # fmt: skip
def test_lora_options_the_rollout_copy_or_the_reference_would_not_reproduce_are_refused(fields, refusal):
    """The rollout copy merges each adapter's delta, and the reference is the base with the adapters
    off: DoRA (a rescaled weight) and trained base biases (on either way) would sample from, or compare
    with, another network than the one trained."""
    with pytest.raises(ConfigError, match=refusal):
        GRPO(model="m", policy={"peft_config": {**LORA, **fields}})


@pytest.mark.parametrize(("fields", "refusal"), [
    ({"target_modules": ["embed_tokens", "q_proj"]}, r"target_modules: 'model.embed_tokens' is an embedding"),
    ({"modules_to_save": ["lm_head"]}, r"modules_to_save=\['lm_head'\] is not supported on a model that ties"),
])  # fmt: skip
def test_adapters_the_merge_would_leave_out_or_corrupt_are_refused_when_the_model_loads(fields, refusal, tiny_model_dir):
    """An embedding's adapters are not merged into the rollout copy; a saved copy of a tied head would
    overwrite the input embedding there (the tiny model ties them). Refused before any step."""
    with pytest.raises(ConfigError, match=refusal):
        lora_module(tiny_model_dir, policy={"peft_config": {**LORA, **fields}}).configure_model()


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
    assert (
        cli.model.hparams.policy["peft_config"]["r"] == 16
        and cli.model.hparams.policy["peft_config"]["target_modules"] == "all-linear"
    )
    from grpo_lightning.models.policy import load_models
    from grpo_lightning.runtime.strategies import PolicyFSDPStrategy

    with pytest.raises(ConfigError, match="policy.peft_config: LoRA runs on one device or under DDP"):
        load_models(tiny_model_dir, cli.model.hparams.policy, True, PolicyFSDPStrategy(mixed_precision=None))


def test_the_fused_lm_head_path_gives_the_peft_models_log_probs(tiny_model_dir, tmp_path):
    from grpo_lightning.models.logprobs import completion_logprobs

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


def test_float32_adapters_on_a_bf16_model_multiply_in_bf16_and_keep_float32_gradients(tiny_model_dir):
    """``adapter_autocast``: the adapters' products in the base weights' bf16, the adapters and their
    gradients float32, the gradients those of the float32 products up to bf16 rounding; nothing
    changes for a float32 model or a model without adapters."""
    from grpo_lightning.models.logprobs import completion_logprobs
    from grpo_lightning.models.lora import adapter_autocast, add_adapters

    torch.manual_seed(0)
    policy = add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16), LORA)
    for name, parameter in policy.named_parameters():
        if ".lora_B." in name:  # B = 0 at the start would leave A without a gradient
            torch.nn.init.normal_(parameter, std=0.1)
    lora_a = next(m for n, m in policy.named_modules() if n.endswith("q_proj.lora_A.default"))
    outputs = []
    lora_a.register_forward_hook(lambda module, args, output: outputs.append(output.dtype))
    ids = torch.randint(3, policy.config.vocab_size, (2, 12))
    inputs = (ids[:, :6], torch.ones(2, 6, dtype=torch.long), ids[:, 6:], torch.ones(2, 6, dtype=torch.long))

    def adapter_grads(context) -> dict[str, torch.Tensor]:
        policy.zero_grad()
        with context:
            logp, _ = completion_logprobs(policy, *inputs, with_entropy=False)
        logp.float().sum().backward()
        return {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}

    plain = adapter_grads(contextlib.nullcontext())
    mixed = adapter_grads(adapter_autocast(policy))
    assert outputs == [torch.float32, torch.bfloat16]
    assert all(gradient.dtype == torch.float32 for gradient in mixed.values())
    for name in plain:
        scale = plain[name].abs().max()
        assert scale > 0 and (mixed[name] - plain[name]).abs().max() <= 0.05 * scale, name
    with policy.disable_adapter():  # the reference pass: the same autocast as the policy's
        assert isinstance(adapter_autocast(policy), torch.autocast)
    float32_policy = add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LORA)
    for model in (float32_policy, AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)):
        assert isinstance(adapter_autocast(model), contextlib.nullcontext)


def test_a_bf16_lora_update_runs_its_adapters_in_bf16(tiny_model_dir, tmp_path):
    module = lora_module(tiny_model_dir, policy={"dtype": "bfloat16"})
    seen = []

    class Hook(L.Callback):
        def on_train_start(self, trainer, pl_module):
            lora_a = next(m for n, m in pl_module.policy.named_modules() if n.endswith("q_proj.lora_A.default"))
            lora_a.register_forward_hook(lambda module, args, output: seen.append(output.dtype))

    fit(module, 1, tmp_path, callbacks=[Hook()])
    assert seen and set(seen) == {torch.bfloat16}
