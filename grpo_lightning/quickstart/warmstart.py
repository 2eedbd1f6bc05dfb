"""Supervised warm start of a tiny causal LM on the built-in arithmetic task.

The result is a partially trained model that already writes ``<answer>N</answer></s>``, after a
terse prompt (``37+45=``) or a question in words, but gets only some answers right, leaving
headroom for reinforcement learning: training stops once greedy accuracy on held-out training rows
reaches a target. Results are cached on disk under a hash of all settings.

The supervised pass runs on one CPU thread with deterministic algorithms, so the result does not
depend on the thread count; it is bitwise the same for a given torch build and CPU instruction set
(``torch.backends.cpu.get_cpu_capability()``), but machines whose CPUs take other vectorised kernel
paths (AVX2, AVX-512, Arm) round differently and, a few hundred steps later, stop at another point
with a different model. The marker file records what the result depends on (``environment``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

from grpo_lightning.data.arithmetic import TERSE_TEMPLATE, format_target, make_arithmetic_dataset
from grpo_lightning.quickstart.accuracy import generation_metrics
from grpo_lightning.quickstart.cached_build import (
    MARKER_FILE,
    build_once,
    default_cache_dir,
    environment,
    read_marker,
)
from grpo_lightning.quickstart.supervised import SupervisedSettings, padded_rows, train_steps
from grpo_lightning.quickstart.tiny import TEXT_ALPHABET, build_char_tokenizer, save_model_and_tokenizer

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 3  # 2: one thread, deterministic algorithms; 3: printable ASCII, prompts in words too
#: One training row in WORDED_EVERY is written in words, in one of WORDED_TEMPLATES in turn, so that
#: the model reads a question in words and answers it in its format: a task a user writes in words
#: starts from a model that answers. The dev rows (early stopping) and the validation split stay terse.
WORDED_EVERY = 4
WORDED_TEMPLATES = (
    "What is {a} plus {b}?",
    "Add together {a} and {b}.",
    "Compute {a} + {b}, please.",
    "Sum of {a} and {b}?",
)


@dataclass(frozen=True)
class WarmStartSettings(SupervisedSettings):
    """Everything that determines a warm-started model; its hash names the cache folder."""

    digits: int = 2
    operations: str = "+"
    num_train: int = 2000
    num_val: int = 200
    num_dev: int = 200
    data_seed: int = 0
    steps: int = 2000
    target_accuracy: float | None = 0.3
    eval_every: int = 5
    model_type: str = "qwen2"

    def cache_key(self) -> str:
        payload = json.dumps({"version": _FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def dataset(self, template: str = TERSE_TEMPLATE) -> DatasetDict:
        """The task splits, prompts written by ``template``; the warm start never sees ``validation``."""
        return make_arithmetic_dataset(
            num_train=self.num_train,
            num_val=self.num_val,
            digits=self.digits,
            operations=self.operations,
            seed=self.data_seed,
            template=template,
        )

    def train_and_dev(self) -> tuple[Dataset, Dataset]:
        """The rows trained on, and the last ``num_dev`` training rows held out for early stopping."""
        if not 0 <= self.num_dev < self.num_train:
            raise ValueError(f"num_dev must be in [0, num_train), got {self.num_dev}")
        train = self.dataset()["train"]
        cut = len(train) - self.num_dev
        return train.select(range(cut)), train.select(range(cut, len(train)))


def warm_start(
    output_dir: str | Path | None = None,
    *,
    digits: int = WarmStartSettings.digits,
    operations: str = WarmStartSettings.operations,
    num_train: int = WarmStartSettings.num_train,
    num_val: int = WarmStartSettings.num_val,
    num_dev: int = WarmStartSettings.num_dev,
    data_seed: int = WarmStartSettings.data_seed,
    steps: int = WarmStartSettings.steps,
    target_accuracy: float | None = WarmStartSettings.target_accuracy,
    eval_every: int = WarmStartSettings.eval_every,
    batch_size: int = WarmStartSettings.batch_size,
    learning_rate: float = WarmStartSettings.learning_rate,
    warmup_steps: int = WarmStartSettings.warmup_steps,
    weight_decay: float = WarmStartSettings.weight_decay,
    seed: int = WarmStartSettings.seed,
    model_type: str = WarmStartSettings.model_type,
    hidden_size: int = WarmStartSettings.hidden_size,
    num_layers: int = WarmStartSettings.num_layers,
    num_heads: int = WarmStartSettings.num_heads,
    num_kv_heads: int = WarmStartSettings.num_kv_heads,
    intermediate_size: int = WarmStartSettings.intermediate_size,
    max_position_embeddings: int = WarmStartSettings.max_position_embeddings,
    log_every: int = 50,
) -> Path:
    """Train (or reuse) a warm-started tiny model and return its ``save_pretrained`` directory.

    The model learns from the ``train`` split of ``make_arithmetic_dataset(num_train, num_val,
    digits, operations, data_seed)`` minus its last ``num_dev`` rows (``seed`` sets the
    initialisation and batch order); its ``validation`` split stays
    unseen. Training stops after ``steps`` steps, or as soon as greedy accuracy on the ``num_dev``
    held-out rows reaches ``target_accuracy`` (checked every ``eval_every`` steps; ``None`` turns
    this off), which keeps the model partially trained whatever the seed. With ``output_dir=None``
    the directory is ``default_cache_dir() / "warmstart-<hash of all settings>"``. A directory
    whose marker file records the same settings is returned without training again.
    """
    settings = WarmStartSettings(
        digits=digits,
        operations=operations,
        num_train=num_train,
        num_val=num_val,
        num_dev=num_dev,
        data_seed=data_seed,
        steps=steps,
        target_accuracy=target_accuracy,
        eval_every=eval_every,
        batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        weight_decay=weight_decay,
        seed=seed,
        model_type=model_type,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
    )
    return run_warm_start(settings, output_dir, log_every=log_every)


def run_warm_start(
    settings: WarmStartSettings, output_dir: str | Path | None = None, *, log_every: int = 50
) -> Path:
    """``warm_start`` for a ready-made ``WarmStartSettings``."""
    if output_dir is None:
        output_dir = default_cache_dir() / f"warmstart-{settings.cache_key()}"
    return build_once(
        Path(output_dir),
        lambda marker: _marker_matches(marker, settings),
        lambda out: _train(settings, out, log_every),
        what="the quickstart's tiny model",
        takes=f"at most {settings.steps} training steps on one CPU thread; "
        f"a few minutes for the default {WarmStartSettings.steps}",
    )


def _train(settings: WarmStartSettings, output_dir: Path, log_every: int) -> None:
    marker = output_dir / MARKER_FILE
    logger.info("Warm start -> %s with %s", output_dir, settings)
    started = time.perf_counter()
    model, tokenizer, training = train_supervised(settings, log_every=log_every)
    save_model_and_tokenizer(model, tokenizer, output_dir)
    record = {
        "settings": asdict(settings),
        **asdict(training),
        "seconds": time.perf_counter() - started,
        "environment": environment(),
    }
    marker.write_text(json.dumps(record, indent=2) + "\n")
    logger.info("Warm start done in %.1f s (%d steps)", record["seconds"], training.stopped_at)


def _marker_matches(marker: Path, settings: WarmStartSettings) -> bool:
    try:
        return read_marker(marker.parent)["settings"] == asdict(settings)
    except (OSError, ValueError, KeyError):
        return False


def supervised_batch_tensors(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], answers: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (``-100`` except on the completion)."""
    rows = []
    for prompt, answer in zip(prompts, answers, strict=True):
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        completion_ids = tokenizer.encode(format_target(answer), add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append((prompt_ids + completion_ids, [-100] * len(prompt_ids) + completion_ids))
    return padded_rows(rows, tokenizer.pad_token_id)


def training_prompts(settings: WarmStartSettings, count: int) -> list[str]:
    """The first ``count`` training problems: every :data:`WORDED_EVERY`-th row in words (one of
    :data:`WORDED_TEMPLATES` in turn), the others terse (``37+45=``)."""
    terse = settings.dataset()["train"]["prompt"]
    worded = [settings.dataset(template)["train"]["prompt"] for template in WORDED_TEMPLATES]
    return [
        worded[(row // WORDED_EVERY) % len(worded)][row] if row % WORDED_EVERY == WORDED_EVERY - 1 else terse[row]
        for row in range(count)
    ]


@torch.no_grad()
def teacher_forced_accuracy(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
) -> float:
    """Fraction of rows whose every completion token is the argmax, i.e. greedy decoding is exact."""
    was_training = model.training
    model.eval()
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    model.train(was_training)
    targets = labels[:, 1:]
    correct = (logits.argmax(dim=-1) == targets) | (targets == -100)
    return correct.all(dim=1).float().mean().item()


@dataclass
class TrainingRecord:
    """What a supervised pass logged: mean loss and dev accuracy by step, and where it stopped."""

    losses: list[tuple[int, float]]
    dev_accuracy: list[tuple[int, float]]
    stopped_at: int


def train_supervised(
    settings: WarmStartSettings, *, log_every: int = 50
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, TrainingRecord]:
    """Build the tiny model and fit it to the completions.

    Stops after ``settings.steps`` steps, or earlier once the greedy (teacher-forced exact match)
    accuracy on the held-out dev rows reaches ``settings.target_accuracy``.
    """
    tokenizer = build_char_tokenizer(TEXT_ALPHABET)  # reads any English prompt a user brings
    config = settings.model_config(tokenizer, model_type=settings.model_type)
    train, dev = settings.train_and_dev()
    prompts = training_prompts(settings, len(train))
    input_ids, attention_mask, labels = supervised_batch_tensors(tokenizer, prompts, train["answer"])
    dev_batch = supervised_batch_tensors(tokenizer, dev["prompt"], dev["answer"]) if len(dev) else None
    if input_ids.shape[1] > settings.max_position_embeddings:
        raise ValueError(
            f"examples are {input_ids.shape[1]} tokens long but max_position_embeddings="
            f"{settings.max_position_embeddings}"
        )

    def batch(generator: torch.Generator) -> dict[str, torch.Tensor]:
        rows = torch.randint(len(train), (settings.batch_size,), generator=generator)
        mask = attention_mask[rows]
        width = int(mask.sum(dim=1).max())
        return dict(input_ids=input_ids[rows, :width], attention_mask=mask[:, :width], labels=labels[rows, :width])

    record = TrainingRecord(losses=[], dev_accuracy=[], stopped_at=settings.steps)
    running, count = 0.0, 0

    def after_step(step: int, loss: float, model: torch.nn.Module) -> bool:
        nonlocal running, count
        running, count = running + loss, count + 1
        if step % log_every == 0 or step == settings.steps:
            record.losses.append((step, running / count))
            logger.info("step %d/%d  loss %.4f", step, settings.steps, running / count)
            running, count = 0.0, 0
        checking = dev_batch is not None and settings.target_accuracy is not None
        if checking and step % settings.eval_every == 0:
            accuracy = teacher_forced_accuracy(model, *dev_batch)
            record.dev_accuracy.append((step, accuracy))
            if accuracy >= settings.target_accuracy:
                if count:
                    record.losses.append((step, running / count))
                logger.info("step %d: dev greedy accuracy %.3f reached the target", step, accuracy)
                record.stopped_at = step
                return True
        return False

    model, stopped = train_steps(settings, config, settings.steps, batch, after_step)
    if not stopped and settings.target_accuracy is not None:
        logger.warning(
            "dev greedy accuracy target %s not reached in %d steps",
            settings.target_accuracy,
            settings.steps,
        )
    return model, tokenizer, record


def _parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, WarmStartSettings]:
    defaults = WarmStartSettings()
    parser = argparse.ArgumentParser(
        prog="python -m grpo_lightning.quickstart.warmstart",
        allow_abbrev=False,
        description="Warm-start a tiny causal LM on the arithmetic task and report validation accuracy.",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="default: a cache folder named by a settings hash"
    )
    for name, value in asdict(defaults).items():
        if name == "target_accuracy":
            continue
        flag = f"--{name.replace('_', '-')}"
        parser.add_argument(flag, type=type(value), default=value, help=f"default: {value}")
    parser.add_argument(
        "--target-accuracy",
        type=lambda text: None if text.lower() == "none" else float(text),
        default=defaults.target_accuracy,
        help="stop once dev greedy accuracy reaches this; 'none' trains for all --steps "
        f"(default: {defaults.target_accuracy})",
    )
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument(
        "--eval-samples", type=int, default=None, help="validation rows to evaluate (default: all)"
    )
    args = parser.parse_args(argv)
    settings = WarmStartSettings(**{name: getattr(args, name) for name in asdict(defaults)})
    return args, settings


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point: warm start, then print the path and validation accuracies."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args, settings = _parse_args(argv)
    started = time.perf_counter()
    model_dir = run_warm_start(settings, args.output_dir, log_every=args.log_every)
    seconds = time.perf_counter() - started
    validation = settings.dataset()["validation"]
    greedy = generation_metrics(model_dir, validation, num_samples=args.eval_samples)
    sampled = generation_metrics(model_dir, validation, temperature=1.0, num_samples=args.eval_samples)
    print(f"model: {model_dir}")
    marker = read_marker(model_dir)
    print(f"warm start: {seconds:.1f} s, {marker['stopped_at']} steps")
    built_with = marker.get("environment", {})
    print("built with: " + ", ".join(f"{key} {value}" for key, value in built_with.items()))
    print(f"greedy accuracy: {greedy['accuracy']:.3f} (format {greedy['format_rate']:.3f})")
    print(f"sampled accuracy (T=1): {sampled['accuracy']:.3f} (format {sampled['format_rate']:.3f})")


if __name__ == "__main__":
    main()
