"""A checkpoint meets only the base it was trained from: the fingerprint of the base's weights goes
into every checkpoint, and a resume or an export whose ``model`` now holds other weights (a hub
model's new revision, a folder rebuilt) is refused. A LoRA run is the case where it matters most:
its export merges the adapters into the base it loads."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoModelForCausalLM

from grpo_lightning.checkpoints.export import export_checkpoint
from grpo_lightning.cli.generate import generate_completions
from grpo_lightning.errors import ConfigError
from grpo_lightning.models.fingerprint import CHECKPOINT_KEY, weights_fingerprint
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config
from grpo_lightning.runtime.checkpoint_io import load_checkpoint_file
from tests.helpers import fit, make_module

peft = pytest.importorskip("peft")


def tiny_base(path, seed: int):
    tokenizer = build_char_tokenizer()
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         max_position_embeddings=64)  # fmt: skip
    return save_tiny_model(path, tokenizer, config, seed=seed)


def test_the_fingerprint_is_of_the_weights_in_any_dtype(tmp_path):
    base = tiny_base(tmp_path / "a", seed=0)
    fp32 = weights_fingerprint(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32))
    assert fp32 == weights_fingerprint(AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16))
    assert fp32 != weights_fingerprint(AutoModelForCausalLM.from_pretrained(tiny_base(tmp_path / "b", seed=1)))
    config = AutoModelForCausalLM.from_pretrained(base).config
    with torch.device("meta"):
        unloaded = AutoModelForCausalLM.from_config(config)
    assert weights_fingerprint(unloaded) is None  # not checked, rather than a false refusal


def test_a_lora_checkpoint_is_refused_with_another_base_at_its_path(tmp_path, one_torch_thread):
    base = tiny_base(tmp_path / "base", seed=0)
    lora = {"policy": {"dtype": "float32", "peft_config": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}}}
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=1)
    fit(make_module(str(base), **lora), 1, tmp_path / "run", callbacks=[every])
    checkpoint = tmp_path / "ckpt" / "step=1.ckpt"
    assert load_checkpoint_file(checkpoint)[CHECKPOINT_KEY] == weights_fingerprint(AutoModelForCausalLM.from_pretrained(base))
    export_checkpoint(checkpoint, tmp_path / "exported")  # the same base: exported
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1+2="}\n')
    assert generate_completions(make_module(str(base), **lora), str(prompts), str(tmp_path / "out.jsonl"), str(checkpoint)) == 1

    tiny_base(base, seed=1)  # the folder rebuilt: other weights at the same path
    with pytest.raises(ConfigError, match="now holds other weights than the run was trained from.*Pass --model"):
        export_checkpoint(checkpoint, tmp_path / "exported-again")
    with pytest.raises(ConfigError, match="--ckpt_path: the base model .* now holds other weights"):
        fit(make_module(str(base), **lora), 2, tmp_path / "resumed", ckpt_path=checkpoint)
    # generate merged the adapters into whatever the path held
    with pytest.raises(ConfigError, match="now holds other weights than the run was trained from"):
        generate_completions(make_module(str(base), **lora), str(prompts), str(tmp_path / "out2.jsonl"), str(checkpoint))
    other_adapters = make_module(str(base), policy={"dtype": "float32", "peft_config": {"r": 8, "lora_alpha": 8,
                                                                                       "target_modules": "all-linear"}})  # fmt: skip
    tiny_base(base, seed=0)  # the base back; adapters of another rank do not fit it
    with pytest.raises(ConfigError, match="does not hold this policy's trained weights"):
        generate_completions(other_adapters, str(prompts), str(tmp_path / "out3.jsonl"), str(checkpoint))
