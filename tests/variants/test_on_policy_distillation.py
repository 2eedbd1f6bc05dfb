"""OnPolicyDistillation: the per-token reverse KL to a frozen teacher as the advantage, by hand, on a
real rollout, in its configuration errors, and in a short fit that brings a tiny student closer to a
tiny teacher."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.testing import assert_close
from torch.distributed.fsdp import FullyShardedDataParallel
from transformers import AutoModelForCausalLM

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.advantages import distillation_advantages
from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.models.sources import load_tokenizer
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_model_and_tokenizer, save_tiny_model, tiny_config
from grpo_lightning.errors import ConfigError
from grpo_lightning.runtime.strategies import PolicyFSDPStrategy
from grpo_lightning.variants import OnPolicyDistillation

STUDENT = torch.tensor([[[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]]])  # [P=1, G=2, T=3]
TEACHER = torch.tensor([[[-0.5, -2.5, -0.5], [-1.2, -1.0, -4.0]]])
MASK = torch.tensor([[[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]])


def test_the_advantage_is_the_teacher_minus_the_student_log_prob_per_token_by_hand():
    # k = student - teacher = [[-0.5, 0.5, 0.0], [1.0, -2.0, (3.0 masked)]]; A = -k
    expected = torch.tensor([[[0.5, -0.5, 0.0], [-1.0, 2.0, 0.0]]])
    assert_close(distillation_advantages(STUDENT, TEACHER, MASK), expected)


def test_the_reward_advantage_is_added_at_every_token_with_its_weight_by_hand():
    # A = -2 k + 0.5 A_i: row 0 (A_i = 1): [1.0, -1.0, 0.0] + 0.5; row 1 (A_i = -1): [-2.0, 4.0, masked] - 0.5
    reward = torch.tensor([[1.0, -1.0]])
    expected = torch.tensor([[[1.5, -0.5, 0.5], [-2.5, 3.5, 0.0]]])
    advantages = distillation_advantages(STUDENT, TEACHER, MASK, reward, distill_weight=2.0, reward_weight=0.5)
    assert_close(advantages, expected)


@pytest.fixture(scope="module")
def teacher_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model trained a few steps to answer every prompt with sevens: a teacher whose
    distribution is far from the untrained student's."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = load_tokenizer(tiny_model_dir)
    texts = [f"{a}+{b}=" + "7" * 10 for a, b in ((12, 34), (5, 6), (77, 8), (40, 2), (9, 91), (3, 33))]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is the fastest on a busy machine
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(40):
            optimizer.zero_grad()
            model(**batch, labels=labels).loss.backward()
            optimizer.step()
    torch.set_num_threads(threads)
    path = tmp_path_factory.mktemp("teacher")
    save_model_and_tokenizer(model, tokenizer, path)
    return str(path)


def test_the_teacher_loads_frozen_and_scores_the_rollouts_tokens(make_module, make_rollout, teacher_dir):
    module = make_module(OnPolicyDistillation, teacher=teacher_dir)
    assert not module.teacher_model.training and not any(p.requires_grad for p in module.teacher_model.parameters())
    assert module.ref_model is None  # beta 0: no reference model
    rollout = make_rollout(module, ["12+34=", "5+6="])
    rewards = module.shape_rewards(rollout.rewards, rollout)
    advantages = module.advantages(rewards.view(-1, rollout.group_size), rollout)
    student = module.compute_logprobs(module.policy, rollout)
    teacher = module.compute_logprobs(module.teacher_model, rollout)
    expected = ((teacher - student) * rollout.completion_mask).view(2, module.settings.group_size, -1)
    assert_close(advantages, expected)
    assert advantages.abs().sum() > 0
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    assert not any(key.startswith("teacher_model.") for key in checkpoint["state_dict"])  # reloaded from teacher


def test_reward_weight_adds_grpos_group_advantage_at_every_token(make_module, make_rollout, teacher_dir):
    pure = make_module(OnPolicyDistillation, teacher=teacher_dir)
    mixed = make_module(OnPolicyDistillation, teacher=teacher_dir, distill_weight=2.0, reward_weight=0.5)
    rollout = make_rollout(mixed, ["12+34=", "5+6="])
    rewards = mixed.shape_rewards(rollout.rewards, rollout).view(-1, rollout.group_size)
    group = F.group_normalized_advantages(rewards, scale="group")  # GRPO's A_i [P, G]
    assert group.abs().sum() > 0
    mask = rollout.completion_mask.view(2, mixed.settings.group_size, -1)
    expected = 2.0 * pure.advantages(rewards, rollout) + 0.5 * group.unsqueeze(-1) * mask
    assert_close(mixed.advantages(rewards, rollout), expected)


def test_without_a_teacher_the_variant_is_a_config_error_naming_the_option(make_module):
    module = make_module(OnPolicyDistillation, configure=False, teacher=None)
    with pytest.raises(ConfigError, match=r"^teacher: .*--model.teacher MODEL"):
        module.configure_model()
    assert module.policy is None


def test_a_teacher_with_another_vocabulary_is_a_config_error_naming_the_option(make_module, tmp_path):
    tokenizer = build_char_tokenizer(alphabet="0123456789+=")
    config = tiny_config(tokenizer, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                         max_position_embeddings=64)  # fmt: skip
    other = str(save_tiny_model(tmp_path / "other", tokenizer, config))
    module = make_module(OnPolicyDistillation, configure=False, teacher=other)
    with pytest.raises(ConfigError, match=r"^teacher: .*tokenizer differs.*same vocabulary"):
        module.configure_model()
    assert module.teacher_model is None


def test_weights_out_of_range_and_a_per_sequence_surrogate_are_config_errors_naming_the_option():
    with pytest.raises(ConfigError, match=r"^distill_weight: must be a finite number >= 0"):
        OnPolicyDistillation("m", distill_weight=-1.0)
    with pytest.raises(ConfigError, match=r"^reward_weight: must be a finite number >= 0"):
        OnPolicyDistillation("m", reward_weight=-0.5)
    with pytest.raises(ConfigError, match=r"^loss.surrogate: gspo needs one advantage per completion"):
        OnPolicyDistillation("m", loss={"surrogate": "gspo"})


# Measured over seeds 0, 1, 2 (20 steps, learning rate 1e-2, 2 prompts x 4 completions a step): the
# held-out reverse KL per token went 3.053 -> 0.146, 3.057 -> 0.021, 2.967 -> 0.091, drops of 2.91,
# 3.04 and 2.88 (at 10 steps: 0.88, 1.12, 0.94). The margin is about half the smallest drop.
STEPS, MARGIN = 20, 1.5
HELD_OUT = ["3+4=", "50+25=", "8+80=", "61+7=", "2+22=", "44+4="]


def reverse_kl(module, teacher, seed: int) -> float:
    """The mean over the student's sampled tokens on held-out prompts of ``log pi_s - log pi_t``:
    the k1 estimate of ``KL(pi_student || pi_teacher)`` per token."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        rollout = module.generate({"prompt": HELD_OUT}, 8, module.sampling)
    kl = module.compute_logprobs(module.policy, rollout) - module.compute_logprobs(teacher, rollout)
    return float((kl * rollout.completion_mask).sum() / rollout.completion_mask.sum())


def distilled(student_dir: str, teacher_dir: str, seed: int, steps: int) -> tuple[float, float]:
    """The held-out reverse KL before and after ``steps`` optimizer steps of distillation."""
    L.seed_everything(seed)
    module = OnPolicyDistillation(model=student_dir, teacher=teacher_dir, sampling={"group_size": 4, "max_new_tokens": 8},
                                  optim={"micro_batch_size": 8, "learning_rate": 1e-2})  # fmt: skip
    module.configure_model()
    before = reverse_kl(module, module.teacher_model, seed=100 + seed)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, callbacks=[])  # fmt: skip
    trainer.fit(module, datamodule=ArithmeticDataModule(num_train=64, num_val=4, batch_size=2, val_batch_size=4, task_seed=seed))
    module.to("cpu")
    return before, reverse_kl(module, module.teacher_model, seed=100 + seed)


def test_distillation_brings_the_student_closer_to_the_teacher_on_held_out_prompts(tiny_model_dir, teacher_dir,
                                                                                    one_torch_thread):  # fmt: skip
    before, after = distilled(tiny_model_dir, teacher_dir, seed=0, steps=STEPS)
    print(f"held-out reverse KL per token: {before:.3f} -> {after:.3f}")
    assert before - after >= MARGIN, (before, after)


def fsdp_fit(student_dir: str, teacher_dir: str, strategy: PolicyFSDPStrategy) -> tuple[OnPolicyDistillation, L.Trainer]:
    """One optimizer step under FSDP in one process (gloo): every FSDP hook runs, nothing is split."""
    L.seed_everything(0)
    module = OnPolicyDistillation(model=student_dir, teacher=teacher_dir, policy={"dtype": "float32"},
                                  sampling={"group_size": 2, "max_new_tokens": 6}, optim={"micro_batch_size": 2})  # fmt: skip
    trainer = L.Trainer(strategy=strategy, max_steps=1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    trainer.fit(module, datamodule=ArithmeticDataModule(num_train=8, num_val=4, batch_size=2, val_batch_size=4))
    return module, trainer


def test_under_fsdp_the_teacher_is_sharded_like_the_reference_and_stays_out_of_the_optimizer(
    tiny_model_dir, teacher_dir, tmp_path, one_torch_thread
):
    module, trainer = fsdp_fit(tiny_model_dir, teacher_dir, PolicyFSDPStrategy(mixed_precision=None))
    assert isinstance(module.teacher_model, FullyShardedDataParallel)
    assert sum(isinstance(m, FullyShardedDataParallel) for m in module.teacher_model.modules()) == 3  # root + 2 layers
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in module.teacher_model.parameters()}
    assert trainer.global_step == 1 and module.last_step_metrics["distill/reverse_kl"] > 0


def test_under_fsdp_an_unsharded_teacher_computes_in_the_strategys_dtype(tiny_model_dir, teacher_dir, tmp_path,
                                                                         one_torch_thread):  # fmt: skip
    strategy = PolicyFSDPStrategy(mixed_precision="bf16", reference_weights="unsharded")
    module, _ = fsdp_fit(tiny_model_dir, teacher_dir, strategy)
    assert not any(isinstance(m, FullyShardedDataParallel) for m in module.teacher_model.modules())
    assert {p.dtype for p in module.teacher_model.parameters()} == {torch.bfloat16}
