"""Why isn't it learning: named health checks on every training step, and a summary of them.

:class:`HealthChecks`, a callback of every ``grpo-lightning fit``, gives each training step's
metrics (``module.last_step_metrics``) to its checks. A check that fires warns once
(:class:`HealthWarning`, rank 0) and counts the steps it holds as ``health/<check>``, logged with
the step's metrics. When the fit ends, or stops on an error, it prints one line per check and
writes them to ``<log_dir>/health.json``: a list of ``{"check", "ok", "steps", "first_step",
"detail"}``. ``first_step`` (and each message's step) is the optimizer step at which the check
first fired: the x-axis of the logged metrics. ``steps`` counts the training steps it fired on, one
per logged update (an update of several optimizer steps, ``ppo_epochs`` or minibatches, is one).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from grpo_lightning.evaluation.health_checks import (
    AnswerCollapse,
    Check,
    CorrectionMasking,
    EntropyCollapse,
    EqualRewards,
    GradNormExplosion,
    HealthWarning,
    KLExplosion,
    RewardNaN,
    ShrinkingAnswers,
    Truncated,
    ValAccuracyFlat,
)
from grpo_lightning.evaluation.loggers import log_dir
from grpo_lightning.rewards.scoring import RewardFunctionError
from grpo_lightning.runtime.metrics import keep_as_logged
from grpo_lightning.errors import require

HEALTH_FILE = "health.json"


def _nan_counts(pl_module) -> dict[str, int]:
    """NaN scores each reward function has returned so far (:class:`grpo_lightning.rewards.RewardScorer`)."""
    scorer = getattr(pl_module, "reward_scorer", None)
    return dict(getattr(scorer, "nan_counts", {}))


class HealthChecks(Callback):
    """Run the health checks after every training step and validation; summarise them when the fit
    ends (see the module's docstring). Each threshold's reason is in its check's docstring; a check
    is off at a threshold it cannot pass (a fraction of 1, ``max_kl`` inf).

    Args:
        enabled: false turns every check, the summary and ``health.json`` off.
        patience: steps in a row that ``equal_rewards``, ``truncated``, ``entropy_collapse``,
            ``shrinking_answers`` and ``correction_masking`` need.
        equal_rewards_fraction: share of groups with zero reward spread over which ``equal_rewards`` holds.
        truncated_fraction: share of completions cut at ``max_new_tokens`` over which ``truncated`` holds.
        entropy_fraction, entropy_floor: ``entropy_collapse`` below this share of the first step's
            entropy, or below this many nats per token.
        shrinking_fraction: ``shrinking_answers`` below this share of the first step's mean
            completion length (with a completion of one token).
        max_kl: ``kl_explosion`` above this KL per token.
        spike_factor, spike_window, spike_patience: ``kl_explosion`` and ``grad_norm_explosion``
            above this many times their median of this many last steps, this many steps in a row.
        val_min_validations, val_epsilon: ``val_accuracy_flat`` after this many validations (the one
            before training not counted) whose accuracies span less than this.
        max_answer_share: ``answer_collapse`` when one answer is over this share of a validation's
            completions (and twice the most common reference answer's).
        masked_fraction: ``correction_masking`` when ``sampling.correction`` masks over this share of
            the loss tokens, ``patience`` steps in a row.
    """

    def __init__(
        self,
        enabled: bool = True,
        patience: int = 5,
        equal_rewards_fraction: float = 0.9,
        truncated_fraction: float = 0.5,
        entropy_fraction: float = 0.1,
        entropy_floor: float = 0.01,
        shrinking_fraction: float = 0.5,
        max_kl: float = 1.0,
        spike_factor: float = 10.0,
        spike_window: int = 20,
        spike_patience: int = 3,
        val_min_validations: int = 3,
        val_epsilon: float = 1e-4,
        max_answer_share: float = 0.5,
        masked_fraction: float = 0.5,
    ) -> None:
        counts = {"patience": patience, "spike_window": spike_window, "spike_patience": spike_patience,
                  "val_min_validations": val_min_validations}  # fmt: skip
        for name, value in counts.items():
            require(value >= 1, f"health.{name} must be at least 1, got {value}.")
        self.enabled, self.patience = enabled, patience
        self.equal_rewards_fraction, self.truncated_fraction = equal_rewards_fraction, truncated_fraction
        self.entropy_fraction, self.entropy_floor, self.max_kl = entropy_fraction, entropy_floor, max_kl
        self.shrinking_fraction = shrinking_fraction
        self.spike_factor, self.spike_window, self.spike_patience = spike_factor, spike_window, spike_patience
        self.val_min_validations, self.val_epsilon = val_min_validations, val_epsilon
        self.max_answer_share, self.masked_fraction = max_answer_share, masked_fraction
        self.checks = self.build_checks()
        self.rows: list[dict[str, Any]] = []
        self.text = ""
        self._steps_seen = 0
        self._nan_seen: dict[str, int] = {}  # the module's NaN counts at the last step
        self._fit_ended = False

    def build_checks(self) -> list[Check]:
        """Fresh checks with this callback's thresholds: the training checks, then those of validations."""
        return [
            EqualRewards(self.equal_rewards_fraction, self.patience),
            Truncated(self.truncated_fraction, self.patience),
            EntropyCollapse(self.entropy_fraction, self.entropy_floor, self.patience),
            KLExplosion(self.max_kl, self.spike_factor, self.spike_window, self.spike_patience),
            GradNormExplosion(math.inf, self.spike_factor, self.spike_window, self.spike_patience),
            RewardNaN(),
            ShrinkingAnswers(self.shrinking_fraction, patience=self.patience),
            CorrectionMasking(self.masked_fraction, self.patience),
            ValAccuracyFlat(self.val_min_validations, self.val_epsilon),
            AnswerCollapse(self.max_answer_share),
        ]

    # ---------------------------------------------------------------- the fit's hooks

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == TrainerFn.FITTING:
            self.checks, self.rows, self.text, self._steps_seen = self.build_checks(), [], "", 0
            self._nan_seen = dict(_nan_counts(pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        steps = getattr(pl_module, "logged_steps", None)
        if not self.enabled or steps is None or steps == self._steps_seen:
            return  # no training step ended with this batch (DAPO filling its batch)
        self._steps_seen = steps
        metrics = dict(getattr(pl_module, "last_step_metrics", {}) or {})
        metrics.update(
            {f"rewards/{name}/nan_count": n for name, n in self._reduced_nan_counts(trainer, pl_module).items()}
        )
        for check in (c for c in self.checks if not c.at_validation):  # at the update's logged optimizer step
            self._warn(trainer, check, check.observe(trainer.global_step, metrics))
        counts = {f"health/{c.name}": float(c.count) for c in self.checks}
        row = getattr(pl_module, "logger_row", None)  # a step the loggers get: the counts join its row
        keep_as_logged(trainer, counts, loggers_write=row is not None)
        if row is not None:
            row.update(counts)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self.enabled or trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        step = trainer.global_step
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if key.startswith("val/")}
        for check in (c for c in self.checks if c.at_validation):
            self._warn(trainer, check, check.observe(step, {**metrics, "step": step}))

    def on_fit_end(self, trainer, pl_module) -> None:
        self._fit_ended = self.enabled  # summarised in teardown: after every on_fit_end (FitSummary's text)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """A fit stopped by a reward function's error, or interrupted after some steps: summarised
        too. An error before the first step (a configuration error) has no health to report."""
        steps = getattr(pl_module, "logged_steps", trainer.global_step)
        reportable = steps > 0 or isinstance(exception, RewardFunctionError)
        if self.enabled and trainer.state.fn == TrainerFn.FITTING and reportable:
            self.finish(trainer, exception, trainer.global_step + 1)  # the optimizer step that did not happen

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == TrainerFn.FITTING and self._fit_ended:
            self._fit_ended = False
            self.finish(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {check.name: check.state_dict() for check in self.checks}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for check in self.checks:
            check.load_state_dict(state_dict.get(check.name, {}))

    # ---------------------------------------------------------------- helpers

    def _reduced_nan_counts(self, trainer, pl_module) -> dict[str, int]:
        """NaN scores since the last step (the module's scorer counts them), summed over processes
        (each scores its own completions)."""
        names = [name for name, _ in getattr(pl_module, "reward_functions", [])]
        totals, seen = _nan_counts(pl_module), self._nan_seen
        counts = torch.tensor([totals.get(name, 0) - seen.get(name, 0) for name in names], dtype=torch.float64)
        self._nan_seen = dict(totals)
        if trainer.world_size > 1:
            counts = trainer.strategy.reduce(counts.to(trainer.strategy.root_device), reduce_op="sum").cpu()
        return dict(zip(names, (int(n) for n in counts.tolist())))

    @staticmethod
    def _warn(trainer, check: Check, message: str | None) -> None:
        if message and trainer.is_global_zero:
            warnings.warn(f"health check {check.name}: {message}", HealthWarning, stacklevel=2)

    def finish(self, trainer, exception: BaseException | None = None, step: int | None = None) -> None:
        """Rank 0: print the summary and write ``health.json`` (also when the fit stops on an error)."""
        self.rows = health_rows(self.checks)
        if isinstance(exception, RewardFunctionError):
            self.rows.append({"check": "reward_function_error", "ok": False, "steps": 1, "first_step": step,
                              "detail": f"the fit stopped: {exception}"})  # fmt: skip
        if not trainer.is_global_zero:
            return
        directory = log_dir(trainer)  # not trainer.log_dir: a broadcast that rank 0 alone would wait in
        path = Path(directory) / HEALTH_FILE if directory else None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.rows, indent=2) + "\n", encoding="utf-8")
        self.text = health_summary(self.rows, path)
        print(self.text, flush=True)


def health_rows(checks: Sequence[Check]) -> list[dict[str, Any]]:
    """The ``health.json`` rows: ``{"check", "ok", "steps", "first_step", "detail"}`` per check."""
    return [
        {"check": c.name, "ok": c.count == 0, "steps": c.count, "first_step": c.first_step, "detail": c.detail}
        for c in checks
    ]


def health_summary(rows: Sequence[dict[str, Any]], path: Path | None = None) -> str:
    """One line per check: ``ok`` or ``WARN`` with the steps it fired, the first one and its fix."""
    width = max(len(row["check"]) for row in rows)
    lines = ["health checks" + (f" ({path}):" if path else ":")]
    for row in rows:
        line = f"  {'ok' if row['ok'] else 'WARN':<4}  {row['check']:<{width}}"
        if not row["ok"]:
            detail = row["detail"].partition("Fix: ")[2].rstrip(".") or row["detail"]
            steps = f"{row['steps']} step" + ("s" if row["steps"] != 1 else "")
            line += f"  {steps} from step {row['first_step']}: {detail}"
        lines.append(line.rstrip())
    return "\n".join(lines)
