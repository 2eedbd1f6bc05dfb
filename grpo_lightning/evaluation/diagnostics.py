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
import statistics
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from grpo_lightning.evaluation.loggers import log_dir
from grpo_lightning.rewards.scoring import RewardFunctionError
from grpo_lightning.training.metrics import keep_as_logged
from grpo_lightning.training.settings import require

HEALTH_FILE = "health.json"


class HealthWarning(UserWarning):
    """A health check fired: the run may not be learning (:mod:`grpo_lightning.evaluation.diagnostics`)."""


class Check:
    """A named condition on the training steps. :meth:`holds` says what is wrong at one step, if
    anything; the check fires on each step where that has held ``patience`` steps in a row.

    ``fix`` names what to change; ``consequence`` why it matters. Both end the warning."""

    name = ""
    consequence = ""
    fix = ""
    at_validation = False  # checked at validations (their metrics), not after training steps
    #: Attributes that change as steps are seen: what a resumed fit restores.
    state_names = ("streak", "count", "first_step", "detail")

    def __init__(self, patience: int = 1) -> None:
        if patience < 1:
            raise ValueError(f"{self.name}: patience must be at least 1 step, got {patience}.")
        self.patience = patience
        self.streak = 0  # steps in a row the condition held
        self.count = 0  # steps the check fired
        self.first_step: int | None = None
        self.detail = ""  # the message of its first firing

    def holds(self, metrics: dict[str, float]) -> str | None:
        """What is wrong at this step, as a phrase, or None."""
        raise NotImplementedError

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        """Take one step's metrics; returns the message when the check fires for the first time."""
        problem = self.holds(metrics)
        self.streak = self.streak + 1 if problem else 0
        if self.streak < self.patience:
            return None
        self.count += 1
        if self.first_step is not None:
            return None
        in_a_row = f" for {self.patience} steps in a row" if self.patience > 1 else ""
        self.first_step = step
        self.detail = f"step {step}: {problem}{in_a_row}: {self.consequence}. Fix: {self.fix}."
        return self.detail

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.state_names}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.state_names:
            if name in state:
                setattr(self, name, state[name])


def _finite(metrics: dict[str, float], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if value is not None and math.isfinite(value) else None


class EqualRewards(Check):
    """Most groups have no reward spread: ``frac_reward_zero_std > max_fraction``, ``patience`` steps.

    A group whose completions all score the same has zero advantages. A few such groups are normal
    (prompts too easy or too hard for the model); past 90% (the default) fewer than one group in ten
    carries any signal, so loss and gradient are near zero. Five steps in a row (the default) so that
    one unlucky batch of prompts does not fire it."""

    name = "equal_rewards"
    consequence = "their advantages are zero, so the loss and gradient are near zero"
    fix = ("the task may be too hard for the start model: warm-start it on the task (a short supervised pass), use "
           "easier prompts, give partial credit in the rewards, or raise sampling.group_size or sampling.temperature")

    def __init__(self, max_fraction: float = 0.9, patience: int = 5) -> None:
        super().__init__(patience)
        self.max_fraction = max_fraction

    def holds(self, metrics: dict[str, float]) -> str | None:
        fraction = _finite(metrics, "frac_reward_zero_std")
        if fraction is not None and fraction > self.max_fraction:
            return f"{fraction:.0%} of the groups had equal rewards (over {self.max_fraction:.0%})"
        return None


class Truncated(Check):
    """Most completions hit ``max_new_tokens`` without EOS: ``completions/clipped_ratio > max_fraction``.

    A cut completion is scored on an unfinished answer and never shows the model how to end one.
    Past half of them (the default) the length limit, not the task, decides most rewards. Five
    steps in a row (the default): a model often rambles for its first few steps."""

    name = "truncated"
    consequence = "cut completions are scored unfinished and teach no ending"
    fix = "raise sampling.max_new_tokens, set loss.mask_truncated_completions, or add a length penalty (DAPO's overlong shaping)"

    def __init__(self, max_fraction: float = 0.5, patience: int = 5) -> None:
        super().__init__(patience)
        self.max_fraction = max_fraction

    def holds(self, metrics: dict[str, float]) -> str | None:
        fraction = _finite(metrics, "completions/clipped_ratio")
        if fraction is not None and fraction > self.max_fraction:
            return f"{fraction:.0%} of the completions hit max_new_tokens without EOS (over {self.max_fraction:.0%})"
        return None


class EntropyCollapse(Check):
    """The policy stopped exploring: ``entropy < max(fraction * first entropy, floor)``.

    At a tenth (the default) of the entropy of the first step, sampling gives nearly the same
    completion every time; groups then score alike and learning stalls. The floor, 0.01 nats per
    token by default, is where the top token holds about 99.9% of the probability, whatever the
    start; it catches a model that was near-deterministic from the first step."""

    name = "entropy_collapse"
    consequence = "sampling repeats itself, so groups score alike and exploration has stopped"
    fix = ("lower optim.learning_rate, add an entropy bonus (--model.loss.entropy_coef 0.001, or steer it to a target with "
           "grpo_lightning.algorithms.entropy.AdaptiveEntropy), raise loss.clip_eps_high (DAPO), or use variants.ClipCov "
           "or variants.KLCov")
    state_names = (*Check.state_names, "first")

    def __init__(self, fraction: float = 0.1, floor: float = 0.01, patience: int = 5) -> None:
        super().__init__(patience)
        self.fraction, self.floor = fraction, floor
        self.first: float | None = None

    def holds(self, metrics: dict[str, float]) -> str | None:
        entropy = _finite(metrics, "entropy")
        if entropy is None:
            return None
        if self.first is None:
            self.first = entropy
        bound = max(self.fraction * self.first, self.floor)
        if entropy < bound:
            return f"entropy {entropy:.3g} fell below {bound:.3g} (first step: {self.first:.3g})"
        return None


class Explosion(Check):
    """A metric non-finite (at once), or above ``max_value`` or ``spike_factor`` times its median
    of the last ``window`` steps for ``patience`` steps in a row.

    Healthy runs drift these metrics by a few times over tens of steps; ten times (the default) the
    median of the last 20 steps is a jump. The median, unlike the mean, is not pulled up by an
    earlier spike; it is compared only once half the window is seen, so the first steps (KL starts
    at 0) do not fire. One step far out is often one odd batch that the next steps do not repeat;
    three in a row (the default) is a run that has left its course."""

    key = ""
    consequence = "the updates left the region the clipping and the KL penalty are meant to keep them in"
    fix = "lower optim.learning_rate, set or lower optim.max_grad_norm, or raise kl.beta"
    state_names = (*Check.state_names, "history")

    def __init__(self, max_value: float = math.inf, spike_factor: float = 10.0, window: int = 20, patience: int = 3):
        super().__init__(patience)
        self.max_value, self.spike_factor, self.window = max_value, spike_factor, window
        self.history: list[float] = []

    def observe(self, step: int, metrics: dict[str, float]) -> str | None:
        if self.key in metrics and not math.isfinite(metrics[self.key]):
            self.streak = self.patience - 1  # NaN or inf needs no second step to be a problem
        return super().observe(step, metrics)

    def holds(self, metrics: dict[str, float]) -> str | None:
        if self.key not in metrics:
            return None
        value = float(metrics[self.key])
        if not math.isfinite(value):
            return f"{self.key} is {value}"
        median = statistics.median(self.history) if len(self.history) >= max(self.window // 2, 1) else 0.0
        self.history = [*self.history, value][-self.window :]
        if value > self.max_value:
            return f"{self.key} {value:.3g} is over {self.max_value:.3g}"
        if median > 0 and value > self.spike_factor * median:
            return f"{self.key} {value:.3g} is over {self.spike_factor:g} times its recent median {median:.3g}"
        return None


class KLExplosion(Explosion):
    """The KL to the reference (``kl``, when ``beta > 0``) non-finite, over ``max_value`` or spiking.

    The default bound, 1 nat per token, is where policy and reference log-probs differ by about one
    per token on average: far past what a KL penalty is meant to allow."""

    name = "kl_explosion"
    key = "kl"

    def __init__(self, max_value: float = 1.0, spike_factor: float = 10.0, window: int = 20, patience: int = 3):
        super().__init__(max_value, spike_factor, window, patience)


class GradNormExplosion(Explosion):
    """The gradient norm before clipping (``grad_norm``) non-finite or spiking (no absolute bound:
    its scale depends on the model)."""

    name = "grad_norm_explosion"
    key = "grad_norm"


class RewardNaN(Check):
    """A reward function returned NaN (``rewards/<fn>/nan_count > 0``; any, at once).

    NaN is a failure of the function (:mod:`grpo_lightning.rewards.sandbox.execution`): it stops the fit
    under ``rewards.execution.on_error=raise``; under ``zero`` or ``skip_group`` the sample scores 0
    or its group is left out, and this check says that a bug (a division by zero, a failed parse)
    is behind it. The module's scorer counts them (training rollouts only)."""

    name = "reward_nan"
    consequence = "each NaN is scored 0 or its group left out, as rewards.execution.on_error says"
    fix = "return a number for every completion (None only where the function does not apply)"

    def holds(self, metrics: dict[str, float]) -> str | None:
        counts = {key.split("/")[1]: int(v) for key, v in metrics.items() if key.endswith("/nan_count") and v > 0}
        if counts:
            return "; ".join(f"reward function {name!r} returned NaN for {n} completions" for name, n in counts.items())
        return None


class ValAccuracyFlat(Check):
    """``val/accuracy`` has not moved: its range is under ``epsilon`` after ``min_validations``
    validations (the one before training is the baseline, not counted). Checked at validations.

    Accuracy is a share of the validation prompts, so one answer changing moves it by 1/N: the
    default 1e-4 is below that for any set under 10,000 prompts, and a range under it means no
    answer changed over three validations (the default) of training."""

    name = "val_accuracy_flat"
    at_validation = True
    consequence = "the updates do not change the model's answers"
    fix = "raise optim.learning_rate, see equal_rewards, and check that rewards.funcs and evaluation.accuracy_func agree"
    state_names = (*Check.state_names, "accuracies")

    def __init__(self, min_validations: int = 3, epsilon: float = 1e-4) -> None:
        super().__init__(patience=1)
        self.min_validations, self.epsilon = min_validations, epsilon
        self.accuracies: list[tuple[int, float]] = []  # (training steps done, accuracy)

    def holds(self, metrics: dict[str, float]) -> str | None:
        accuracy = _finite(metrics, "val/accuracy")
        if accuracy is None:
            return None
        self.accuracies = [*self.accuracies, (int(metrics.get("step", 0)), accuracy)]
        values = [value for _, value in self.accuracies]
        during = sum(1 for step, _ in self.accuracies if step > 0)
        if during >= self.min_validations and max(values) - min(values) < self.epsilon:
            return f"val/accuracy stayed at {values[-1]:.4g} over {len(values)} validations"
        return None


class AnswerCollapse(Check):
    """One answer dominates a validation: ``val/top_answer_share`` (the most common answer's share of
    the completions) over ``max_share`` and at least twice ``val/reference_top_answer_share`` (the most
    common reference's share of them). Checked at validations.

    At least ``top - reference_top`` of the completions give the dominant answer where it is wrong, so
    twice the reference's share means most of them are wrong: a model that solves prompts gives the
    references' spread (all right: the reference's share), however skewed the task. Over half (the
    default), the answer is the model's, not the prompts'; references mostly one value never fire."""

    name = "answer_collapse"
    at_validation = True
    consequence = "the policy gives one answer whatever the prompt, so its reward comes from guessing"
    fix = ("check the rewards for a constant answer they pay, read the completions (--completions.jsonl true), lower "
           "optim.learning_rate, or raise kl.beta")

    def __init__(self, max_share: float = 0.5) -> None:
        super().__init__(patience=1)
        self.max_share = max_share

    def holds(self, metrics: dict[str, float]) -> str | None:
        top, reference = _finite(metrics, "val/top_answer_share"), _finite(metrics, "val/reference_top_answer_share")
        if top is not None and reference is not None and top > self.max_share and top >= 2 * reference:
            return f"one answer is {top:.0%} of the validation completions (the most common reference: {reference:.0%})"
        return None


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
        patience: steps in a row that ``equal_rewards``, ``truncated`` and ``entropy_collapse`` need.
        equal_rewards_fraction: share of groups with zero reward spread over which ``equal_rewards`` holds.
        truncated_fraction: share of completions cut at ``max_new_tokens`` over which ``truncated`` holds.
        entropy_fraction, entropy_floor: ``entropy_collapse`` below this share of the first step's
            entropy, or below this many nats per token.
        max_kl: ``kl_explosion`` above this KL per token.
        spike_factor, spike_window, spike_patience: ``kl_explosion`` and ``grad_norm_explosion``
            above this many times their median of this many last steps, this many steps in a row.
        val_min_validations, val_epsilon: ``val_accuracy_flat`` after this many validations (the one
            before training not counted) whose accuracies span less than this.
        max_answer_share: ``answer_collapse`` when one answer is over this share of a validation's
            completions (and twice the most common reference answer's).
    """

    def __init__(
        self,
        enabled: bool = True,
        patience: int = 5,
        equal_rewards_fraction: float = 0.9,
        truncated_fraction: float = 0.5,
        entropy_fraction: float = 0.1,
        entropy_floor: float = 0.01,
        max_kl: float = 1.0,
        spike_factor: float = 10.0,
        spike_window: int = 20,
        spike_patience: int = 3,
        val_min_validations: int = 3,
        val_epsilon: float = 1e-4,
        max_answer_share: float = 0.5,
    ) -> None:
        counts = {"patience": patience, "spike_window": spike_window, "spike_patience": spike_patience,
                  "val_min_validations": val_min_validations}  # fmt: skip
        for name, value in counts.items():
            require(value >= 1, f"health.{name} must be at least 1, got {value}.")
        self.enabled, self.patience = enabled, patience
        self.equal_rewards_fraction, self.truncated_fraction = equal_rewards_fraction, truncated_fraction
        self.entropy_fraction, self.entropy_floor, self.max_kl = entropy_fraction, entropy_floor, max_kl
        self.spike_factor, self.spike_window, self.spike_patience = spike_factor, spike_window, spike_patience
        self.val_min_validations, self.val_epsilon = val_min_validations, val_epsilon
        self.max_answer_share = max_answer_share
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
