"""Rollouts made under ``torch.inference_mode`` and outside it, with one engine and one replica.

Lightning runs ``trainer.validate`` under inference mode and training without it. A tensor made
under inference mode cannot be updated in place outside it, so the engine's persistent state (cache,
step buffers, graphs) and a rollout replica's weights must not be made under inference mode, whichever
call comes first.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_lightning.rollout.engine import StaticCacheGenerator
from grpo_lightning.quickstart.tiny import build_char_tokenizer
from grpo_lightning.rollout.types import SamplingParams
from grpo_lightning.runtime.strategies import RolloutReplica

PROMPTS = ["1+2=", "37+45=", "(1)", "9"]
GREEDY = SamplingParams(8, temperature=0.0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def encode(tokenizer, prompts, device="cpu"):
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return encoded["input_ids"].to(device), encoded["attention_mask"].to(device)


def load(path: str, device: str = "cpu") -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").to(device)


def rollout(generator, tokenizer, mode, device="cpu") -> torch.Tensor:
    with mode():
        ids, mask = encode(tokenizer, PROMPTS, device)
        return generator.generate(ids, mask, GREEDY, tokenizer.eos_token_id, tokenizer.pad_token_id)


MODES = {"inference": torch.inference_mode, "no_grad": torch.no_grad}


@pytest.mark.parametrize("fused", [False, True], ids=["model_forward", "fused"])
@pytest.mark.parametrize("first,then", [("inference", "no_grad"), ("no_grad", "inference")])
def test_one_generator_serves_inference_mode_and_no_grad_rollouts(tiny_model_dir, tokenizer, first, then, fused):
    generator = StaticCacheGenerator(load(tiny_model_dir), len(PROMPTS), 32, fuse_projections=fused)
    reference = rollout(generator, tokenizer, MODES[first])
    assert torch.equal(rollout(generator, tokenizer, MODES[then]), reference)
    assert torch.equal(rollout(generator, tokenizer, MODES[first]), reference)


def test_a_replica_made_under_inference_mode_refreshes_and_rolls_out_outside_it(tiny_model_dir, tokenizer):
    policy = load(tiny_model_dir)
    with torch.inference_mode():
        replica = RolloutReplica(policy, torch.bfloat16)
        replica.refresh(policy)
    assert not any(p.is_inference() for p in replica.model.parameters())
    generator = StaticCacheGenerator(replica.model, len(PROMPTS), 32)
    rollout(generator, tokenizer, torch.inference_mode)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.mul_(0.5)
        replica.refresh(policy)
    assert torch.equal(replica.model.lm_head.weight, policy.lm_head.weight.to(torch.bfloat16))
    rollout(generator, tokenizer, torch.no_grad)


class ReplicaRollouts(L.LightningModule):
    """What a GRPO module does with fp32 weights and bf16 rollouts on the static engine: sample from
    a bf16 replica refreshed after each optimizer step, in validation and in training."""

    def __init__(self, path: str, tokenizer, device: str = "cpu", **engine) -> None:
        super().__init__()
        self.policy = load(path, device)
        self.tokenizer = tokenizer
        self.engine_settings = engine
        self.replica: RolloutReplica | None = None
        self.engine: StaticCacheGenerator | None = None
        self.version = 0

    def rollout(self) -> torch.Tensor:
        if self.replica is None:
            self.replica = RolloutReplica(self.policy, torch.bfloat16)
            self.engine = StaticCacheGenerator(self.replica.model, len(PROMPTS), 32, **self.engine_settings)
        if self.replica.version != self.version:
            self.replica.refresh(self.policy)
            self.replica.version = self.version
        ids, mask = encode(self.tokenizer, PROMPTS, self.policy.device)
        return self.engine.generate(ids, mask, GREEDY, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)

    def validation_step(self, batch, batch_idx):
        self.rollout()

    def training_step(self, batch, batch_idx):
        completions = self.rollout()
        ids, _ = encode(self.tokenizer, PROMPTS, self.policy.device)
        return self.policy(input_ids=torch.cat([ids, completions], dim=1)).logits.float().mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.version += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=1e-3)


def validate_then_fit(module: L.LightningModule, accelerator: str, tmp_path) -> None:
    loader = torch.utils.data.DataLoader(range(2), batch_size=1)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=1,
        val_check_interval=1,
        default_root_dir=tmp_path,
    )
    trainer.validate(module, loader, verbose=False)  # under inference mode
    trainer.fit(module, loader, loader)  # training outside it, validation under no_grad


def test_validate_then_fit_with_a_bf16_replica_on_the_static_engine(tiny_model_dir, tokenizer, tmp_path):
    module = ReplicaRollouts(tiny_model_dir, tokenizer)
    validate_then_fit(module, "cpu", tmp_path)
    assert module.version == 2 and module.replica.version == 2  # refreshed for the last validation


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fused", [False, True], ids=["model_forward", "fused"])
def test_validate_then_fit_with_a_bf16_replica_on_the_compiled_cuda_engine(tiny_model_dir, tokenizer, tmp_path, fused):
    module = ReplicaRollouts(tiny_model_dir, tokenizer, "cuda", compile=True, fuse_projections=fused)
    validate_then_fit(module, "gpu", tmp_path)
    assert module.version == 2 and module.engine._graphs  # rollouts replayed captured graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("first,then", [("inference", "no_grad"), ("no_grad", "inference")])
def test_one_compiled_cuda_generator_serves_both_modes(tiny_model_dir, tokenizer, first, then):
    model = load(tiny_model_dir, "cuda").to(torch.bfloat16)
    generator = StaticCacheGenerator(model, len(PROMPTS), 32, compile=True, fuse_projections=True)
    reference = rollout(generator, tokenizer, MODES[first], "cuda")
    assert torch.equal(rollout(generator, tokenizer, MODES[then], "cuda"), reference)
    assert generator._graphs  # replayed captured graphs
