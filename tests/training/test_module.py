"""The shared module: a real Trainer fit, what it logs and writes, and the checks before any work."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.evaluation.diagnostics import HealthChecks
from grpo_lightning.models.logprobs import completion_logprobs
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.training.module import EVERY_STEP_METRICS
from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards import RewardFunctionError
from grpo_lightning.rollout.types import SamplingParams
from grpo_lightning.variants import DAPO, GRPO
from tests.helpers import make_trainer, module, small_data

REQUIRED_METRICS = {
    "reward",
    "reward_std",
    "rewards/accuracy_reward/mean",
    "frac_reward_zero_std",
    "kl",
    "clip_ratio/low",
    "clip_ratio/high",
    "entropy",
    "completions/mean_length",
    "completions/clipped_ratio",
    "perf/rollout_s",
    "perf/update_s",
    "perf/tokens_per_s",
    "grad_norm",
    "val/accuracy",
}


def count_ones_reward(prompts, completions, **columns):
    """A toy reward: the share of characters that are '1'."""
    return [c.count("1") / max(len(c), 1) for c in completions]


def failing_reward(prompts, completions, **columns):
    raise ZeroDivisionError("boom")


def test_fit_writes_tensorboard_events_with_every_metric(tiny_model_dir, tmp_path):
    trainer = make_trainer(tmp_path, callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
    trainer.fit(module(tiny_model_dir), small_data())

    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    logged = set(events.Tags()["scalars"])
    assert REQUIRED_METRICS <= logged, REQUIRED_METRICS - logged
    assert [e.step for e in events.Scalars("reward")] == [1, 2]  # optimizer steps taken


def test_every_metric_reaches_the_loggers_on_their_steps(tiny_model_dir, tmp_path):
    """With ``log_every_n_steps=2`` the loggers get every metric of steps 2 and 4 (their values in
    ``last_step_metrics``); ``callback_metrics`` holds the loss, reward and KL of every step."""
    seen = {}

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            values = dict(pl_module.last_step_metrics)
            seen[trainer.global_step] = values
            for name in EVERY_STEP_METRICS:
                assert float(trainer.callback_metrics[name]) == pytest.approx(values[name]), name

    trainer = make_trainer(tmp_path, max_steps=4, log_every_n_steps=2, limit_val_batches=0, callbacks=[Record()])
    trainer.fit(module(tiny_model_dir, kl={"beta": 0.04}), small_data())
    assert sorted(seen) == [1, 2, 3, 4]

    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    training_metrics = {name for name in REQUIRED_METRICS if not name.startswith("val/")}
    assert training_metrics <= set(events.Tags()["scalars"])
    for name in ("entropy", "grad_norm", "reward", "completions/mean_length"):
        scalars = events.Scalars(name)
        # A step's metrics are written under the optimizer steps taken, its own included.
        assert [e.step for e in scalars] == [2, 4], name
        assert [e.value for e in scalars] == pytest.approx([seen[2][name], seen[4][name]]), name


def test_a_csv_logger_gets_one_row_per_step_and_the_trainer_keeps_what_was_logged(tiny_model_dir, tmp_path):
    """Every metric of a step reaches a CSV logger in one row, under the optimizer steps taken; the
    trainer's ``logged_metrics`` and ``callback_metrics`` hold them as ``self.log`` would leave them."""
    seen = {}

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen[trainer.global_step] = ({k: float(v) for k, v in trainer.logged_metrics.items()},
                                         {k: float(v) for k, v in trainer.callback_metrics.items()})  # fmt: skip

    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="csv")
    trainer = make_trainer(tmp_path, max_steps=2, logger=logger, limit_val_batches=0, callbacks=[Record(), HealthChecks()])
    trainer.fit(module(tiny_model_dir), small_data())
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    assert [int(row["step"]) for row in rows] == [1, 2]  # the health counts of a step join its row
    assert all(row["reward"] and row["entropy"] and row["perf/step_s"] and row["health/equal_rewards"] for row in rows)
    last = trainer.lightning_module.last_step_metrics
    logged, callback = seen[2]
    for name in ("reward", "entropy", "grad_norm", "step"):
        assert logged[name] == pytest.approx(last[name]) and callback[name] == pytest.approx(last[name]), name
    assert "health/equal_rewards" in trainer.logged_metrics and "health/equal_rewards" in trainer.callback_metrics


def test_checkpoint_holds_the_policy_but_not_the_reference_model(tiny_model_dir, tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1, callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
    trainer.fit(module(tiny_model_dir, kl={"beta": 0.04}), small_data())

    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["state_dict"]
    assert any(k.startswith("policy.") for k in state)
    assert not any(k.startswith("ref_model.") for k in state)


def test_no_reference_model_is_loaded_when_beta_is_zero(tiny_model_dir):
    grpo = module(tiny_model_dir, kl={"beta": 0.0})
    grpo.configure_model()
    assert grpo.ref_model is None
    with_kl = module(tiny_model_dir, kl={"beta": 0.04})
    with_kl.configure_model()
    assert not any(p.requires_grad for p in with_kl.ref_model.parameters())


@pytest.mark.parametrize(("ppo_epochs", "minibatch_size", "old_logprob_passes"), [(1, None, 0), (2, None, 1), (1, 2, 1)])
def test_old_logprobs_cost_a_forward_pass_only_when_the_policy_moves_within_a_rollout(
    tiny_model_dir, tmp_path, ppo_epochs, minibatch_size, old_logprob_passes
):
    grpo = module(
        tiny_model_dir,
        kl={"beta": 0.0},
        optim={"ppo_epochs": ppo_epochs, "minibatch_size": minibatch_size, "micro_batch_size": 2},
    )
    passes = []
    original = grpo.compute_logprobs
    grpo.compute_logprobs = lambda model, rollout: passes.append(model) or original(model, rollout)
    make_trainer(tmp_path, max_steps=1 * ppo_epochs * (4 // (minibatch_size or 4)), limit_val_batches=0).fit(grpo, small_data())
    assert len(passes) == old_logprob_passes


def test_teacher_forced_logprobs_match_the_sampling_distribution(tiny_model_dir):
    grpo = module(tiny_model_dir, sampling={"max_new_tokens": 5})
    grpo.configure_model()
    prompts = ["1+2=", "10+20=", "7+55="]  # different lengths: left padding must not shift positions
    encoded = grpo.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    out = grpo.policy.generate(
        **encoded, max_new_tokens=5, do_sample=False, output_scores=True, return_dict_in_generate=True,
        pad_token_id=grpo.tokenizer.pad_token_id, eos_token_id=None,
    )
    completion = out.sequences[:, encoded["input_ids"].size(1) :]
    expected = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
    expected = expected.gather(-1, completion.unsqueeze(-1)).squeeze(-1)

    logp, entropy = completion_logprobs(
        grpo.policy, encoded["input_ids"], encoded["attention_mask"], completion, torch.ones_like(completion)
    )
    torch.testing.assert_close(logp, expected, rtol=1e-4, atol=1e-4)
    assert (entropy > 0).all()


def test_reward_rises_on_a_toy_task(tiny_model_dir, tmp_path):
    """GRPO on 'emit the character 1': the mean reward of the last steps beats the first by 0.2."""
    L.seed_everything(0)
    grpo = module(
        tiny_model_dir,
        rewards={"funcs": [count_ones_reward]},
        sampling={"group_size": 8, "max_new_tokens": 8},
        optim={"micro_batch_size": 32, "learning_rate": 5e-3},
        kl={"beta": 0.0},
    )
    rewards = []

    class RecordReward(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            rewards.append(trainer.logged_metrics["reward"].item())

    make_trainer(tmp_path, max_steps=30, limit_val_batches=0, callbacks=[RecordReward()]).fit(grpo, small_data(batch_size=4))
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, (first, last)


# ---------------------------------------------------------------- bad input, before any work


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"sampling": {"group_size": 1}}, "sampling.group_size"),
        ({"kl": {"beta": -0.1}}, "kl.beta"),
        ({"kl": {"estimator": "k4"}}, "kl.estimator"),
        ({"sampling": {"temperature": 0.0}}, "sampling.temperature"),
        ({"loss": {"clip_eps_low": 1.5}}, "loss.clip_eps_low"),
        ({"optim": {"ppo_epochs": 0}}, "optim.ppo_epochs"),
        ({"optim": {"minibatch_size": 6, "micro_batch_size": 4}}, "optim.micro_batch_size"),
        ({"rewards": {"weights": [1.0, 2.0]}}, "rewards.weights"),
        ({"policy": {"dtype": "float8"}}, "policy.dtype"),
        ({"engine": EngineOptions(decode_attention="cudnn")}, "engine.decode_attention"),
        ({"engine": EngineOptions(rollout="hf", fuse_projections=True)}, "engine.fuse_projections"),
        ({"engine": EngineOptions(rollout="hf"), "sampling": {"seed": 3}}, "sampling.seed"),
    ],
)
def test_invalid_settings_are_rejected_at_construction_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        module("unused/model", **overrides)


def test_zero_learning_rate_is_rejected_with_the_value_and_the_fix():
    with pytest.raises(ConfigError, match=r"optim.learning_rate: must be > 0 \(got 0.0\); give e.g. --model.optim.learning_rate 1e-6"):
        module("unused/model", optim={"learning_rate": 0.0})


def test_negative_learning_rate_is_rejected_with_the_value_and_the_fix():
    with pytest.raises(ConfigError, match=r"optim.learning_rate: must be > 0 \(got -0.001\); give e.g."):
        module("unused/model", optim={"learning_rate": -1e-3})


def test_negative_weight_decay_is_rejected_with_the_value_and_the_fix():
    with pytest.raises(ConfigError, match=r"optim.weight_decay: must be >= 0 \(got -0.1\); give 0 for none"):
        module("unused/model", optim={"weight_decay": -0.1})


def test_negative_warmup_steps_is_rejected_with_the_value_and_the_fix():
    with pytest.raises(ConfigError, match=r"optim.warmup_steps: must be >= 0 \(got -5\); give 0 for no warm-up"):
        module("unused/model", optim={"warmup_steps": -5})


@pytest.mark.parametrize("norm", [0.0, -1.0])
def test_max_grad_norm_not_positive_is_rejected_with_the_value_and_the_fix(norm):
    with pytest.raises(ConfigError, match=rf"optim.max_grad_norm: must be > 0 or null \(got {norm}\); .*or null to turn clipping off"):
        module("unused/model", optim={"max_grad_norm": norm})


@pytest.mark.parametrize("path", ["/no/such/model", "./no_such_model", "../no_such_model", "~/no_such_model", "runs/x/model"])
def test_a_local_model_path_that_does_not_exist_is_rejected_before_any_load(path, monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a missing local path must not reach from_pretrained (nor the hub)")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    with pytest.raises(ConfigError) as error:
        module(path)
    message = str(error.value)
    assert message.startswith(f"model: no such directory {path!r}")
    assert "give a local model directory, a .gguf file or a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'" in message


def test_a_local_tokenizer_path_that_does_not_exist_is_rejected(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"policy.tokenizer: no such directory '\./no_tokenizer'.*hub id like 'Qwen/Qwen2.5-0.5B-Instruct'"):
        module(tiny_model_dir, policy={"tokenizer": "./no_tokenizer"})


def test_hub_ids_and_existing_directories_pass_the_path_check(tiny_model_dir):
    assert module("Qwen/Qwen2.5-0.5B-Instruct").model_name == "Qwen/Qwen2.5-0.5B-Instruct"
    assert module("gpt2").model_name == "gpt2"
    assert module(tiny_model_dir, policy={"tokenizer": tiny_model_dir}).tokenizer_name == tiny_model_dir


def test_decode_options_reach_the_static_engine_and_keep_greedy_rollouts(make_module):
    """The module's ``engine.decode_attention`` and ``engine.fuse_projections`` are the engine's; the ``math`` kind
    and the fused projections (with ``triton``, computed as ``math`` on a CPU) decode the same greedy
    completions as PyTorch's SDPA through the model's own forward pass."""
    batch = {"prompt": ["1+2=", "30+4="]}
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    completions = {}
    for kind, fused in (("sdpa", False), ("math", False), ("triton", True)):
        engine = EngineOptions(rollout="static", decode_attention=kind, fuse_projections=fused)
        grpo = make_module(GRPO, engine=engine, policy={"dtype": "float32"})
        completions[kind] = grpo.generate(batch, 2, greedy).completion_ids
        assert grpo.sampler.engine.decode_attention == kind and grpo.sampler.engine.fuse_projections == fused
        assert (grpo.sampler.engine._decoder is not None) == fused
    torch.testing.assert_close(completions["math"], completions["sdpa"], rtol=0, atol=0)
    torch.testing.assert_close(completions["triton"], completions["sdpa"], rtol=0, atol=0)


def test_padding_free_needs_a_transformers_that_detects_packed_sequences(monkeypatch):
    import grpo_lightning.rollout.generation.choice as choice

    monkeypatch.setattr(choice, "supports_packed_sequences", lambda: False)
    with pytest.raises(ConfigError, match="engine.padding_free"):
        module("unused/model", engine=EngineOptions(padding_free=True))


def test_padding_free_under_sdpa_warns_that_a_dense_mask_keeps_the_rows_apart(make_module):
    grpo = make_module(GRPO, engine=EngineOptions(padding_free=True))
    with pytest.warns(UserWarning, match="padding_free with attn_implementation 'sdpa'"):
        assert grpo.engine_plan.padding_free


def test_unknown_reward_function_path_names_the_field_and_an_example():
    with pytest.raises(ValueError, match=r"rewards.funcs\[1\].*no_such_module") as error:
        module("unused/model", rewards={"funcs": ["grpo_lightning.rewards.accuracy_reward", "no_such_module.reward"]})
    assert "grpo_lightning.rewards.accuracy_reward" in str(error.value)


def test_rollout_size_not_divisible_by_minibatch_fails_before_training(tiny_model_dir, tmp_path):
    trainer = make_trainer(tmp_path)
    with pytest.raises(ConfigError, match="minibatch_size"):
        trainer.fit(
            module(tiny_model_dir, optim={"minibatch_size": 3, "micro_batch_size": 1}), small_data(batch_size=2)
        )
    assert trainer.global_step == 0


def test_prompt_longer_than_the_context_fails_before_training(tiny_model_dir, tmp_path):
    trainer = make_trainer(tmp_path)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        trainer.fit(module(tiny_model_dir, sampling={"max_new_tokens": 62}), small_data())
    assert trainer.global_step == 0


def test_a_reward_function_that_raises_is_named_with_the_sample(tiny_model_dir, tmp_path):
    with pytest.raises(RewardFunctionError, match=r"failing_reward.*sample 0"):
        make_trainer(tmp_path).fit(module(tiny_model_dir, rewards={"funcs": [failing_reward]}), small_data())


def test_dapo_partial_batches_still_train(tiny_model_dir, tmp_path):
    """A random model rarely solves arithmetic: dynamic sampling then trains on what it found."""
    dapo = module(tiny_model_dir, cls=DAPO, max_gen_batches=2, rewards={"funcs": [count_ones_reward]})
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(dapo, small_data())
    assert trainer.global_step == 1


# ---------------------------------------------------------------- how prompts reach the model

WRAPPED = (
    "prompts: plain text is wrapped in the tokenizer's chat template (policy.use_chat_template: true); "
    "set --model.policy.use_chat_template false to send prompts as they are"
)


@pytest.fixture
def templated_tokenizer_dir(tiny_model_dir, tmp_path) -> str:
    """The tiny model's tokenizer with a chat template (one that leaves the text as it is)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    tokenizer.save_pretrained(tmp_path / "templated")
    return str(tmp_path / "templated")


@pytest.mark.parametrize(
    ("templated", "use_chat_template", "expected"),
    [
        (True, True, WRAPPED),
        (True, False, "prompts: plain text is sent as it is (policy.use_chat_template: false); set --model.policy.use_chat_template "
         "true to wrap it in the tokenizer's chat template"),
        (False, True, "prompts: plain text is sent as it is (the tokenizer has no chat template); "
         "chat-message prompts need a tokenizer with one"),
    ],
)
def test_the_prompt_format_is_said_once_per_fit(
    templated, use_chat_template, expected, tiny_model_dir, templated_tokenizer_dir, tmp_path, caplog
):
    tokenizer = templated_tokenizer_dir if templated else None
    grpo = module(tiny_model_dir, policy={"tokenizer": tokenizer, "use_chat_template": use_chat_template})
    with caplog.at_level(logging.INFO):
        make_trainer(tmp_path, max_steps=2, limit_val_batches=0).fit(grpo, small_data())
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prompts:")]
    assert said == [expected]


def test_validate_fit_validate_on_one_trainer(tiny_model_dir, tmp_path):
    """The quickstart's sequence: accuracy before, training, accuracy after, on one Trainer."""
    grpo, data = module(tiny_model_dir), small_data()
    trainer = make_trainer(tmp_path, max_steps=1)
    before = trainer.validate(grpo, datamodule=data, verbose=False)[0]
    trainer.fit(grpo, datamodule=data)
    after = trainer.validate(grpo, datamodule=data, verbose=False)[0]
    assert 0.0 <= before["val/accuracy"] <= 1.0 and 0.0 <= after["val/accuracy"] <= 1.0
