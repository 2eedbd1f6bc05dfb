"""Plain helpers that tests of several folders share: toy rewards, constructor arguments, hand-made
rollouts, micro-batched gradients and small fits. Fixtures stay in the ``conftest.py`` files; no test
file imports another for what is here."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from lightning.pytorch.callbacks import ModelCheckpoint

from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.rollout.types import Rollout
from grpo_lightning.variants import GRPO

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

#: What a launcher (torchrun, Lightning's in-process strategies) sets in ``os.environ`` for a process group.
LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK")


def launcher_free_env() -> dict[str, str]:
    """This process's environment without the launcher's variables: a child started with it is one process
    of its own, and picks its own port if it starts a process group."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}


# ------------------------------------------------------------------ rewards and arguments


def length_parity_reward(prompts: list, completions: list[str], **columns) -> list[float]:
    """A deterministic toy reward, ``len(completion) % 3``: completions of one prompt differ in
    length, so most groups have reward variance and non-zero advantages (and in groups of 2 many
    are equal: DAPO then drops groups and refills)."""
    return [float(len(c) % 3) for c in completions]


def grouped(options: dict) -> dict:
    """Constructor arguments of dotted options: ``{"loss.delta": 2.0, "advantage": "gpg"}`` ->
    ``{"loss": {"delta": 2.0}, "advantage": "gpg"}``."""
    from grpo_lightning.training.options import GROUPS

    arguments: dict = {}
    for name, value in options.items():
        group, _, field = name.partition(".")
        if field and group in GROUPS:
            arguments.setdefault(group, {})[field] = value
        else:
            arguments[name] = value
    return arguments


def merged(settings: dict, overrides: dict) -> dict:
    """Constructor arguments: ``settings`` with ``overrides``, an option group given as a dict on
    both sides merged field by field (``sampling={"group_size": 2}`` keeps the other sampling settings)."""
    out = dict(settings)
    for name, value in overrides.items():
        both = isinstance(value, dict) and isinstance(out.get(name), dict)
        out[name] = {**out[name], **value} if both else value
    return out


# ------------------------------------------------------------------ chat tokenizers (tests/agents/, tests/quickstart/)

CHATML = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_WITHOUT_TOOLS = CHATML.split("{% endif %}", 1)[1]


def byte_tokenizer(template: str) -> transformers.PreTrainedTokenizerFast:
    """A byte-level tokenizer (one token per byte) with ChatML's special tokens and ``template``."""
    vocab = {symbol: index for index, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<unk>", additional_special_tokens=["<|im_start|>"]
    )
    tokenizer.chat_template = template
    return tokenizer


# ------------------------------------------------------------------ hand-made values


def t(values, dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def hand_rollout(lengths: list[int], width: int, group_size: int) -> Rollout:
    """A rollout with no real tokens: only the completion lengths (the mask) are meaningful."""
    n = len(lengths)
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    return Rollout(
        group_size=group_size,
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.zeros(n, width, dtype=torch.long),
        completion_mask=mask,
        truncated=torch.tensor([length >= width for length in lengths]),
        prompts=["p"] * n,
        completions=[""] * n,
    )


def token_grad(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``d sum(loss) / d logp``: every entry of ``loss`` depends on ``logp`` only through its row."""
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return grad


def perturb(model: torch.nn.Module, scale: float = 0.05) -> None:
    """Add seeded noise to every weight: a policy (or reference) that moved since the rollout."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def assert_constructs_without_loading(cls, monkeypatch) -> None:
    """The constructor loads no model or tokenizer and returns within a second."""

    def refuse(*args, **kwargs):
        raise AssertionError("the constructor must not load a model or tokenizer")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    start = time.perf_counter()
    module = cls(model="no-such/model", sampling={"group_size": 4, "max_new_tokens": 16})
    assert time.perf_counter() - start < 1.0
    assert module.policy is None and module.ref_model is None and module.tokenizer is None


# ------------------------------------------------------------------ the presets' shared cases (tests/variants/)

# Group 0 has spread, group 1 is all equal (no signal: advantages exactly 0 in every variant).
REWARDS = [[3.0, 1.0, 2.0, 2.0], [0.5, 0.5, 0.5, 0.5]]
# GRPO's advantages of group 0: mean 2, deviations [1, -1, 0, 0], unbiased var (1 + 1) / 3 = 2/3,
# std 0.816496580927726; 1 / (0.816496580927726 + 1e-4) = 1.2245948897605123.
Z = 1.2245948897605123
# Ragged mask: row 0 has 3 tokens (sum 1+2+3 = 6), row 1 has 1 token (5); max_new_tokens 4.
LOSS = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]

# Clip-Cov and KL-Cov (variants/covariance.py): two rows, 3 and 2 valid tokens (N = 5); advantages
# +1 (row 0) and -1 (row 1).
COV_LOGP = [[-1.0, -2.0, -3.0, -9.0], [-0.5, -3.5, -9.0, -9.0]]
COV_MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
COV_ADV = [1.0, -1.0]
# mean A = (3 - 2) / 5 = 0.2: centred A is 0.8 on row 0, -1.2 on row 1.
# mean logp = (-1 - 2 - 3 - 0.5 - 3.5) / 5 = -2: centred logp [1, 0, -1 | 1.5, -1.5].
# Cov = [0.8, 0, -0.8 | -1.8, 1.8]; padding 0.
COV = [[0.8, 0.0, -0.8, 0.0], [-1.8, 1.8, 0.0, 0.0]]
# old_logp = logp - 0.1 everywhere: rho = exp(0.1) on every token, inside [0.8, 1.2].
RHO = math.exp(0.1)  # 1.1051709180756477


def assert_clip_higher_boundary(module, high_loss: float, high_grad: float, high_clipped: float) -> None:
    """``module.token_loss`` at the clip's two sides.

    Row 0: ratio 1.25 with advantage +1; row 1: ratio 0.75 with advantage -1.
      eps_high 0.2:  -min(1.25 * 1, 1.2 * 1) = -1.2, clipped: no gradient.
      eps_high 0.28: 1.25 < 1.28, -1.25, d/dlogp = -ratio * A = -1.25.
      low side (eps_low 0.2 everywhere): -min(0.75 * -1, 0.8 * -1) = 0.8, clipped: no gradient.
    """
    logp = t([[math.log(1.25)], [math.log(0.75)]]).requires_grad_()
    mask = t([[1.0], [1.0]])
    loss = module.token_loss(logp, torch.zeros_like(logp), t([1.0, -1.0]), mask)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    torch.testing.assert_close(loss.detach(), t([[high_loss], [0.8]]))
    torch.testing.assert_close(grad, t([[high_grad], [0.0]]))
    metrics = module.step_metrics.compute_and_reset()
    assert metrics["clip_ratio/high"] == pytest.approx(high_clipped)  # share of the 2 tokens
    assert metrics["clip_ratio/low"] == pytest.approx(0.5)


def assert_aggregate_adds_up_over_halves(module) -> None:
    """Whole-minibatch counts passed in: the aggregates of ``LOSS``'s two rows add up to the whole's."""
    whole = module.aggregate(t(LOSS), t(MASK), num_sequences=2, num_tokens=t(4.0))
    halves = sum(module.aggregate(t([row]), t([m]), num_sequences=2, num_tokens=t(4.0)) for row, m in zip(LOSS, MASK))
    torch.testing.assert_close(halves, whole)


def cpu_trainer(max_steps: int, callbacks=()) -> L.Trainer:
    """A bare CPU trainer: no logger, checkpoints, validation or progress bar."""
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=max_steps,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=list(callbacks),
    )


def arithmetic(batch_size: int) -> ArithmeticDataModule:
    return ArithmeticDataModule(num_train=64, num_val=0, val_split=None, batch_size=batch_size)


# ------------------------------------------------------------------ gradients


def micro_batched_gradient(module, rollout: Rollout, advantages: torch.Tensor, sizes: Sequence[int],
                           num_tokens: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
    """The policy's gradient of the rollout's loss taken in micro-batches of ``sizes`` rows
    (``micro_batch_loss`` with the whole rollout's sequence and token counts), by parameter name."""
    module.policy.zero_grad(set_to_none=True)
    n = len(rollout)
    for rows in torch.arange(n).split(list(sizes)):
        module.micro_batch_loss(rollout, advantages, rows, num_sequences=n, num_tokens=num_tokens).backward()
    return {name: p.grad.clone() for name, p in module.policy.named_parameters()}


class GradientCapture(L.Callback):
    """Copies the policy's gradients right before each optimizer step."""

    def __init__(self) -> None:
        self.gradients: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.gradients.append({n: p.grad.detach().clone() for n, p in pl_module.policy.named_parameters()})


# ------------------------------------------------------------------ small fits (checkpoints, resumes)


def make_module(model_dir: str, cls=GRPO, **overrides):
    """A module on ``model_dir``, groups of 2, 6 new tokens. Its reward is an import path, as configs
    give it: resuming loads checkpoints with ``weights_only=True``."""
    settings = dict(
        model=model_dir,
        rewards={"funcs": [f"{__name__}.length_parity_reward"]},
        sampling={"group_size": 2, "max_new_tokens": 6},
        optim={"micro_batch_size": 2, "learning_rate": 1e-3},
    )
    return cls(**merged(settings, overrides))


def make_data() -> ArithmeticDataModule:
    return ArithmeticDataModule(num_train=8, num_val=4, batch_size=2, val_batch_size=4)  # 4 batches an epoch


def compared(name: str) -> bool:
    return not name.startswith("perf/") or name == "perf/generated_tokens"  # timings differ run to run


class StepRecorder(L.Callback):
    """The logged metrics of every optimizer step this fit makes, by global step."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, torch.Tensor]] = {}
        self.last = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.last = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step > self.last:  # DAPO batches that only sample make no step
            self.last = trainer.global_step
            metrics = trainer.callback_metrics
            self.steps[self.last] = {k: v.detach().clone() for k, v in metrics.items() if compared(k)}


def fit(
    module, max_steps: int, root: Path, callbacks=(), ckpt_path=None, strategy="auto", **trainer_settings
) -> tuple[dict, L.Trainer]:
    """A seeded CPU fit of ``make_data()``, without validation unless ``trainer_settings`` (the
    Trainer's) say: the steps' logged metrics (``StepRecorder``) and the trainer."""
    L.seed_everything(0)
    recorder = StepRecorder()
    settings = {"num_sanity_val_steps": 0, "limit_val_batches": 0, **trainer_settings}
    trainer = L.Trainer(
        strategy=strategy,
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        callbacks=[recorder, *callbacks],
        default_root_dir=root,
        **settings,
    )
    trainer.fit(module, datamodule=make_data(), ckpt_path=ckpt_path)
    return recorder.steps, trainer


def fit_stopped_and_resumed(
    make, total: int, stop: int, root: Path, callbacks=lambda: [], **trainer_settings
) -> tuple[dict, Path, dict, L.Trainer]:
    """Three seeded fits of modules from ``make()`` (each with fresh ``callbacks()``): ``total`` steps
    uninterrupted, ``stop`` steps saving a checkpoint at ``stop``, and ``total`` steps resumed from it.
    Returns the uninterrupted fit's steps, the checkpoint's path, the resumed fit's steps and its trainer.
    ``trainer_settings``: for the three Trainers (:func:`fit`)."""
    full, _ = fit(make(), total, root / "full", callbacks=callbacks(), **trainer_settings)
    every = ModelCheckpoint(dirpath=root / "ckpt", filename="{step}", every_n_train_steps=stop)
    fit(make(), stop, root / "first", callbacks=[every, *callbacks()], **trainer_settings)
    path = root / "ckpt" / f"step={stop}.ckpt"
    resumed, trainer = fit(make(), total, root / "resumed", callbacks=callbacks(), ckpt_path=path, **trainer_settings)
    return full, path, resumed, trainer


def assert_same_steps(resumed: dict, full: dict, first: int, last: int) -> None:
    assert sorted(resumed) == list(range(first, last + 1))
    for step in resumed:
        assert "reward" in resumed[step] and "loss" in resumed[step]
        torch.testing.assert_close(resumed[step], full[step], rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")


def logits(model, tokenizer) -> torch.Tensor:
    encoded = tokenizer(["12+34=", "7+8="], return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    with torch.no_grad():
        return model(**encoded).logits


# ------------------------------------------------------------------ a logged fit (tests/training/)


def small_data(**overrides) -> ArithmeticDataModule:
    settings = dict(num_train=32, num_val=8, batch_size=2, val_batch_size=8)
    settings.update(overrides)
    return ArithmeticDataModule(**settings)


def make_trainer(tmp_path: Path, max_steps: int = 2, **overrides) -> L.Trainer:
    settings = dict(
        max_steps=max_steps,
        accelerator="cpu",
        logger=L.pytorch.loggers.TensorBoardLogger(tmp_path, name="run"),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=max_steps,
        check_val_every_n_epoch=None,
        log_every_n_steps=1,
        default_root_dir=tmp_path,
    )
    settings.update(overrides)
    return L.Trainer(**settings)


def module(model_dir: str, cls=GRPO, **overrides):
    """A module for ``make_trainer`` fits: groups of 2, 6 new tokens."""
    settings = dict(model=model_dir, sampling={"group_size": 2, "max_new_tokens": 6},
                    optim={"micro_batch_size": 4, "learning_rate": 1e-3})  # fmt: skip
    return cls(**merged(settings, overrides))
