"""Specification of PPO with a critic: the value model, micro-batch invariance of both losses, a fit
through the CLI with the shipped config (both optimizers step, ``global_step`` counts policy
updates), an exact resume, and the benchmark's ``--variant ppo``.

Its math (grpo_lightning/algorithms/gae.py) by hand is tests/algorithms/test_gae.py.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.testing import assert_close
from transformers import AutoModelForCausalLM

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.checkpoints.export import read_checkpoint
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.errors import ConfigError
from grpo_lightning.models.value import compute_values, load_value_model
from grpo_lightning.variants import PPO
from tests.helpers import micro_batched_gradient

CONFIGS = config_dir()
REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["12+34=", "5+6=", "77+8=", "9*9="]  # x group_size 4 = 16 rows


# ------------------------------------------------------------------ the value model


def test_the_value_model_loads_from_the_policy_checkpoint_and_gives_a_value_per_token(tiny_model_dir, make_module,
                                                                                       make_rollout):  # fmt: skip
    model = load_value_model(tiny_model_dir, "float32", None)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for name, parameter in policy.base_model.named_parameters():
        assert torch.equal(model.backbone.get_parameter(name), parameter), name
    rollout = make_rollout(make_module(PPO, kl={"beta": 0.0}), PROMPTS)
    values = compute_values(model, rollout, torch.arange(len(rollout)).split(5))
    assert values.shape == rollout.completion_mask.shape and not values.any()  # the head starts at zero
    torch.nn.init.normal_(model.head.weight)
    values = compute_values(model, rollout, torch.arange(len(rollout)).split(5))
    assert values.dtype == torch.float32 and (values[rollout.completion_mask == 0] == 0).all()
    shuffled = torch.randperm(len(rollout), generator=torch.Generator().manual_seed(0)).split(4)  # a token budget's
    assert_close(compute_values(model, rollout, shuffled), values, rtol=1e-5, atol=1e-6)
    assert (values[rollout.completion_mask == 1] != 0).all()
    # V_t is the value of the state before token t: changing token 2 moves V_3.., not V_0..V_2.
    changed = rollout.completion_ids.clone()
    changed[:, 2] = (changed[:, 2] + 1) % 20 + 3
    inputs = (rollout.prompt_ids, rollout.prompt_mask, changed, torch.ones_like(rollout.completion_mask))
    full = (*inputs[:2], rollout.completion_ids, inputs[3])
    with torch.no_grad():
        before, after = model(*full), model(*inputs)
    assert_close(after[:, :3], before[:, :3])
    assert not torch.allclose(after[:, 3:], before[:, 3:])


def test_the_values_are_those_of_the_left_padded_batch_and_no_position_attends_to_nothing(tiny_model_dir):
    """The backbone gets each row's left padding at its end (a position attending to no key made
    cuDNN's attention give NaN gradients on an H200); the values are the left-padded batch's."""
    model = load_value_model(tiny_model_dir, "float32", None)
    torch.nn.init.normal_(model.head.weight)
    masks = []
    model.backbone.register_forward_pre_hook(lambda module, args, kwargs: masks.append(kwargs["attention_mask"]), with_kwargs=True)
    torch.manual_seed(0)
    prompt_ids, completion_ids = torch.randint(3, 20, (3, 6)), torch.randint(3, 20, (3, 5))
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1]])
    completion_mask = torch.tensor([[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]])
    with torch.no_grad():
        values = model(prompt_ids, prompt_mask, completion_ids, completion_mask)
        mask = torch.cat([prompt_mask, completion_mask], 1)
        hidden = model.backbone(input_ids=torch.cat([prompt_ids, completion_ids], 1), attention_mask=mask,
                                position_ids=mask.cumsum(-1).sub(1).clamp(min=0)).last_hidden_state  # fmt: skip
        expected = model.head(hidden[:, -6:-1]).squeeze(-1) * completion_mask
    assert masks[0][:, 0].all() and not masks[1][:, 0].all()
    assert_close(values, expected)


# ------------------------------------------------------------------ options


def test_options_out_of_range_name_the_field():
    for field, value in [("gamma", 1.5), ("lam", -0.1), ("value_clip", 0.0), ("value_learning_rate", 0.0),
                         ("value_max_grad_norm", -1.0)]:
        with pytest.raises(ConfigError, match=f"^{field}: must be"):
            PPO("x", **{field: value})
    with pytest.raises(ConfigError, match="^rewards.scale: does not apply to PPO"):
        PPO("x", rewards={"scale": "batch"})
    with pytest.raises(ConfigError, match="^kl.unbiased: does not apply to PPO"):
        PPO("x", kl={"unbiased": True})


def test_the_chosen_kl_estimator_is_the_penalty_in_the_token_rewards(make_module, make_rollout):
    module = make_module(PPO, kl={"estimator": "k3"})
    assert PPO("x").settings.kl_estimator == "k1"  # the paper's, by default
    rollout = make_rollout(module, PROMPTS)
    rollout.old_logp = module.compute_logprobs(module.policy, rollout)
    rollout.ref_logp = rollout.old_logp - 0.05 * torch.arange(rollout.old_logp.size(1))
    d = rollout.ref_logp - rollout.old_logp
    k3 = (torch.exp(d) - d - 1) * rollout.completion_mask  # not k1's d: the estimator chosen
    shaped = module.shape_rewards(rollout.rewards, rollout)
    assert_close(shaped, rollout.rewards - module.coefficients.beta * k3.sum(-1))


def test_with_the_kl_in_the_loss_the_token_rewards_carry_no_penalty(make_module, make_rollout):
    module = make_module(PPO, kl={"placement": "loss"})
    assert module.settings.kl_estimator == "k3"  # in the loss, DeepSeekMath's
    rollout = make_rollout(module, PROMPTS)
    rollout.old_logp = module.compute_logprobs(module.policy, rollout)
    rollout.ref_logp = rollout.old_logp - 0.05 * torch.arange(rollout.old_logp.size(1))
    assert_close(module.shape_rewards(rollout.rewards, rollout), rollout.rewards)  # the score alone, at the last token
    assert "kl_penalty" not in module.step_metrics.compute_and_reset()


# ------------------------------------------------------------------ micro-batch invariance


def prepared(make_module, make_rollout, **kwargs):
    """A PPO module and a rollout with old and reference log-probs, shaped: GAE done."""
    module = make_module(PPO, **kwargs)
    rollout = make_rollout(module, PROMPTS)
    torch.nn.init.normal_(module.value_model.head.weight, std=0.5)  # values that are not all 0
    rollout.old_logp = module.compute_logprobs(module.policy, rollout)
    rollout.ref_logp = module.compute_logprobs(module.ref_model, rollout) - 0.05
    rewards = module.shape_rewards(rollout.rewards, rollout)
    advantages = module.advantages(rewards.view(-1, rollout.group_size), rollout).flatten(0, 1)
    return module, rollout, advantages


def test_the_policy_gradient_without_whitening_and_truncated_completions_does_not_depend_on_micro_batching(
    make_module, make_rollout
):
    """With its defaults, PPO's is the conformance suite's (tests/conformance/)."""
    kwargs = {"loss": {"mask_truncated_completions": True}, "whiten_advantages": False}
    module, rollout, advantages = prepared(make_module, make_rollout, **kwargs)
    assert advantages.shape == rollout.completion_ids.shape and advantages.abs().sum() > 0
    n = len(rollout)
    tokens = module.loss_mask(rollout, torch.arange(n)).sum()

    whole = micro_batched_gradient(module, rollout, advantages, [n], tokens)
    split = micro_batched_gradient(module, rollout, advantages, [3, 5, n - 8], tokens)
    assert sum(g.abs().sum() for g in whole.values()) > 0
    for name in whole:
        assert_close(split[name], whole[name], rtol=1e-5, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")


def test_the_value_gradient_does_not_depend_on_micro_batching(make_module, make_rollout):
    module, rollout, _ = prepared(make_module, make_rollout, value_clip=0.01)
    with torch.no_grad():  # the critic has moved since V_old: some tokens' clip binds
        module.value_model.head.bias.add_(0.05)
    n = len(rollout)
    tokens = module.loss_mask(rollout, torch.arange(n)).sum()

    def gradient(sizes):
        module.value_model.zero_grad(set_to_none=True)
        for rows in torch.arange(n).split(sizes):
            module.value_loss(rollout, rows, tokens).backward()
        return {name: p.grad.clone() for name, p in module.value_model.named_parameters()}

    whole, split = gradient([n]), gradient([7, n - 7])
    assert whole["head.weight"].abs().sum() > 0 and whole["backbone.norm.weight"].abs().sum() > 0
    for name in whole:  # float32 sums in another order: to 1e-5 of each gradient's largest entry
        atol = 1e-5 * float(whole[name].abs().max())
        assert_close(split[name], whole[name], rtol=1e-5, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


# ------------------------------------------------------------------ real fits


def test_a_fit_through_the_cli_steps_both_optimizers(tiny_model_dir, tmp_path, one_torch_thread):
    args = [
        "--config",
        str(CONFIGS / "trainer/cpu.yaml"),
        "--config",
        str(CONFIGS / "data/arithmetic.yaml"),
        "--config",
        str(CONFIGS / "variant/ppo.yaml"),
        "--config",
        str(CONFIGS / "model/tiny.yaml"),
        "--model.model",
        tiny_model_dir,
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
        "--trainer.max_steps",
        "6",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.callbacks",
        "[]",
        "--data.batch_size",
        "2",
        "--model.sampling.group_size",
        "3",
        "--model.sampling.max_new_tokens",
        "8",
        "--model.optim.minibatch_size",
        "3",
        "--model.optim.micro_batch_size",
        "3",
        "--model.value_learning_rate",
        "1e-3",
        "--trainer.limit_val_batches",
        "0",
        "--model.rewards.funcs",
        json.dumps([f"{__name__}.digit_reward"]),  # the tiny model never answers right
    ]
    cli = GRPOLightningCLI(args=args, run=False)
    module = cli.model
    assert type(module) is PPO
    cli.trainer.fit(module, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 3 * 2  # policy steps: 2 minibatches of 3 per rollout; the critic's are not counted
    metrics = module.last_step_metrics
    for name in ("value/loss", "value/clip_fraction", "value/explained_variance", "value/mean", "returns/mean",
                 "advantages/mean_abs", "value/grad_norm", "loss"):  # fmt: skip
        assert math.isfinite(metrics[name]), name
    assert 0 <= metrics["value/clip_fraction"] <= 1
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)

    def moved(now, before):
        return any(not torch.equal(a, b) for a, b in zip(now.parameters(), before.parameters()))

    assert moved(module.policy, start)
    assert moved(module.value_model.backbone, start.base_model) and module.value_model.head.weight.abs().sum() > 0
    _, critic_opt = cli.trainer.optimizers
    assert critic_opt.param_groups[0]["lr"] == 1e-3
    assert all(critic_opt.state[p]["step"] == 6 for p in module.value_model.parameters())


def resumable_fit(model_dir: str, max_steps: int, root: Path, callbacks=(), ckpt_path=None) -> tuple[dict, PPO]:
    """A fit of PPO with the steps' logged metrics by global step."""
    steps: dict[int, dict] = {}

    class Recorder(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            steps[trainer.global_step] = {k: v.clone() for k, v in trainer.callback_metrics.items()
                                          if not k.startswith("perf/")}  # fmt: skip

    L.seed_everything(0)
    module = PPO(
        model=model_dir,
        value_learning_rate=1e-3,
        rewards={"funcs": [f"{__name__}.length_reward"]},
        sampling={"group_size": 2, "max_new_tokens": 6},
        optim={"micro_batch_size": 2, "learning_rate": 1e-3, "ppo_epochs": 2},
    )
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, log_every_n_steps=1,
                        enable_checkpointing=bool(callbacks), enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Recorder(), *callbacks],
                        default_root_dir=root)  # fmt: skip
    data = ArithmeticDataModule(num_train=8, num_val=4, batch_size=2, val_batch_size=4)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return steps, module


def length_reward(prompts, completions, **columns):
    return [float(len(c) % 3) for c in completions]


def digit_reward(prompts, completions, **columns):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def test_a_resumed_fit_logs_what_an_uninterrupted_fit_logs(tiny_model_dir, tmp_path, one_torch_thread):
    full, _ = resumable_fit(tiny_model_dir, 6, tmp_path / "full")  # 3 rollouts x 2 epochs
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=4)
    resumable_fit(tiny_model_dir, 4, tmp_path / "first", callbacks=[every])
    path = tmp_path / "ckpt" / "step=4.ckpt"
    checkpoint = read_checkpoint(path)
    assert any(k.startswith("value_model.") for k in checkpoint["state_dict"])
    assert not any(k.startswith("ref_model.") for k in checkpoint["state_dict"])
    assert len(checkpoint["optimizer_states"]) == len(checkpoint["lr_schedulers"]) == 2
    resumed, _ = resumable_fit(tiny_model_dir, 6, tmp_path / "resumed", ckpt_path=path)
    assert sorted(resumed) == [6] and resumed[6]["value/loss"] > 0 and resumed[6]["grad_norm"] > 0
    assert_close(resumed[6], full[6], rtol=0, atol=0)


# ------------------------------------------------------------------ the benchmark


def test_the_benchmark_runs_ppo_on_the_same_workload(tmp_path):
    command = [sys.executable, "benchmarks/run.py", "--workload", "W0", "--steps", "2", "--variant", "ppo",
               "--prompts", "2", "--group-size", "2", "--prompt-tokens", "4", "--max-new-tokens", "4", "--threads", "1",
               "--first-step", "none", "--workdir", str(tmp_path / "work")]  # fmt: skip
    completed = subprocess.run(command, check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["variant"] == "ppo" and len(result["step_s"]) == 2
    assert "values_s" in result["phases"]
