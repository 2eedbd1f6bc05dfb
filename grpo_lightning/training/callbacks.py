"""Callbacks every ``grpo-lightning fit`` has: a progress bar counted in optimizer steps, validation
before the first step and a summary of the fit when it ends."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from grpo_lightning.runtime.checkpoint_io import checkpoint_step
from grpo_lightning.evaluation.loggers import log_dir
from grpo_lightning.runtime.time_budget import TimeBudget

#: Train metrics of the summary, from ``module.last_step_metrics``.
SUMMARY_TRAIN_METRICS = ("reward", "kl", "loss")
#: Validation metrics of the summary, from ``trainer.callback_metrics``.
SUMMARY_VAL_METRICS = ("val/accuracy", "val/reward")


class StepProgressBar(TQDMProgressBar):
    """A TQDM bar of optimizer steps out of ``max_steps`` (not batches of an epoch), showing the
    progress-bar metrics (reward, KL, val accuracy) without Lightning's ``v_num``."""

    def get_metrics(self, trainer, pl_module) -> dict[str, int | str | float | dict[str, float]]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    @staticmethod
    def _total_steps(trainer) -> int | None:
        return trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None

    def on_train_start(self, trainer, *_: Any) -> None:
        # A resumed fit starts mid-epoch, where Lightning calls no on_train_epoch_start: the bar
        # counts steps (out of max_steps) from the start, validation before the first step included.
        super().on_train_start(trainer)
        self._show_steps(trainer)

    def on_train_epoch_start(self, trainer, *_: Any) -> None:
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self._show_steps(trainer)

    def _show_steps(self, trainer) -> None:
        bar = self.train_progress_bar
        bar.reset(total=self._total_steps(trainer))
        bar.initial = bar.n = trainer.global_step  # the rate counts this run's steps only
        bar.set_description("Step")
        bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable:
            return
        steps = trainer.global_step
        total = bar.total if bar.total is not None else math.inf
        if steps % self.refresh_rate == 0 or steps >= total:
            bar.n = steps
            bar.set_postfix(self.get_metrics(trainer, pl_module))
            bar.refresh()


class ValidateBeforeTraining(Callback):
    """Run the validation loop once before the first training step, so ``val/*`` has a value for
    the start model (logged at step 0). Skipped when resuming (``global_step > 0``), when there is
    no validation data, and when another callback of this name (the ablation's) does it already."""

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step > 0 or trainer.limit_val_batches == 0:
            return
        datamodule = trainer.datamodule
        if datamodule is not None and getattr(datamodule, "val_dataset", True) is None:
            return  # a data module without a validation split
        others = [c for c in trainer.callbacks if c is not self and type(c).__name__ == type(self).__name__]
        if others:
            return
        loop = trainer.fit_loop.epoch_loop.val_loop
        trainer.validating = True
        try:
            loop.run()
        finally:
            trainer.training = True


class FitSummary(Callback):
    """Print, on rank 0, a short block when a fit ends (a stop by SIGTERM or SIGINT included):
    optimizer steps / ``max_steps``, wall time, the last train metrics, the last validation's metrics
    with the optimizer step it ran at (after a stop, an earlier one than the checkpoint's), the log
    directory, the saved ``config.yaml`` and the last checkpoint with the optimizer step it holds.
    The text is kept in ``self.text``."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.text = ""
        self.validated_at: int | None = None  # the optimizer step of this fit's last validation

    def on_fit_start(self, trainer, pl_module) -> None:
        self.started = time.monotonic()
        self.validated_at = None

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:  # the sanity check's metrics are not kept
            self.validated_at = trainer.global_step

    def on_fit_end(self, trainer, pl_module) -> None:
        self.text = fit_summary(trainer, pl_module, time.monotonic() - self.started, validated_at=self.validated_at)
        _print(self.text)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):  # after FinalCheckpoint wrote the checkpoint
            code = exception.code if isinstance(exception.code, int) else 128 + 15
            name = "SIGINT" if code == 128 + 2 else "SIGTERM"
            self.text = fit_summary(trainer, pl_module, time.monotonic() - self.started, stopped_by=name,
                                    validated_at=self.validated_at)  # fmt: skip
            _print(self.text)


@rank_zero_only
def _print(text: str) -> None:
    print(text, flush=True)


def _format(value: Any) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{value:.4g}"


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def last_checkpoint(trainer) -> str | None:
    """The newest checkpoint a ModelCheckpoint of ``trainer`` saved (``last.ckpt`` first)."""
    paths = []
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            paths += [callback.last_model_path, callback.best_model_path]
    paths = [p for p in paths if p and Path(p).exists()]
    return max(paths, key=lambda p: (Path(p).stat().st_mtime, Path(p).name == "last.ckpt")) if paths else None


def fit_summary(
    trainer, pl_module, seconds: float, stopped_by: str | None = None, validated_at: int | None = None
) -> str:
    """The text of :class:`FitSummary`; ``stopped_by``: the signal that stopped the fit; ``validated_at``:
    the optimizer step the validation metrics (``trainer.callback_metrics``) are of."""
    max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
    steps = f"{trainer.global_step}" + (f" / {max_steps}" if max_steps else "")
    ended = f"stopped by {stopped_by}" if stopped_by else "finished"
    lines = [f"fit {ended}: {steps} optimizer steps in {_duration(seconds)}"]
    train = getattr(pl_module, "last_step_metrics", {}) or {}
    shown = [f"{name} {_format(train[name])}" for name in SUMMARY_TRAIN_METRICS if name in train]
    if shown:
        lines.append("  last step:   " + ", ".join(shown))
    metrics = trainer.callback_metrics
    shown = [f"{name} {_format(metrics[name])}" for name in SUMMARY_VAL_METRICS if name in metrics]
    if shown:
        label = "validation:" if validated_at is None else f"validation (step {validated_at}):"
        lines.append(f"  {label:<12} " + ", ".join(shown))
    directory = log_dir(trainer) if trainer.loggers else None  # no broadcast: also on one rank's exception
    if directory:
        lines.append(f"  logs:        {directory}")
        config = Path(directory) / "config.yaml"
        if config.exists():
            lines.append(f"  config:      {config}")
    checkpoint = last_checkpoint(trainer)
    if checkpoint:
        step = checkpoint_step(checkpoint) if trainer.is_global_zero else None
        lines.append(f"  checkpoint:  {checkpoint}" + (f" (optimizer step {step})" if step is not None else ""))
    budgets = [c for c in trainer.callbacks if isinstance(c, TimeBudget)]
    if budgets:
        lines.append(f"  time:        {budgets[0].summary()}")
    return "\n".join(lines)
