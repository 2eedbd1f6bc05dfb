"""The named health checks of a fit (:class:`grpo_lightning.evaluation.diagnostics.HealthChecks` runs them).

Each check reads a training step's (or a validation's) metrics and says whether it holds; the
reason for each default threshold is in its docstring, its consequence and fix in its attributes.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


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


class ShareOver(Check):
    """A logged share (``metric``) over ``max_fraction``; subclasses name the metric and say what the
    share is (``what``, after the percentage)."""

    metric = ""
    what = ""

    def __init__(self, max_fraction: float, patience: int = 5) -> None:
        super().__init__(patience)
        self.max_fraction = max_fraction

    def holds(self, metrics: dict[str, float]) -> str | None:
        fraction = _finite(metrics, self.metric)
        if fraction is not None and fraction > self.max_fraction:
            return f"{self.what.format(share=f'{fraction:.0%}')} (over {self.max_fraction:.0%})"
        return None


class EqualRewards(ShareOver):
    """Most groups have no reward spread: ``frac_reward_zero_std > max_fraction``, ``patience`` steps.

    A group whose completions all score the same has zero advantages. A few such groups are normal
    (prompts too easy or too hard for the model); past 90% (the default) fewer than one group in ten
    carries any signal, so loss and gradient are near zero. Five steps in a row (the default) so that
    one unlucky batch of prompts does not fire it."""

    name = "equal_rewards"
    consequence = "their advantages are zero, so the loss and gradient are near zero"
    fix = ("if the mean reward is at its best, the model solves these prompts: give harder ones, skip solved ones "
           "(--trainer.callbacks+=grpo_lightning.data.DifficultyCurriculum), or stop; if at its worst, the task "
           "is too hard for the start model: warm-start it on the task (a short supervised pass), use easier prompts, "
           "give partial credit in the rewards, or raise sampling.group_size or sampling.temperature")
    metric, what = "frac_reward_zero_std", "{share} of the groups had equal rewards"

    def __init__(self, max_fraction: float = 0.9, patience: int = 5) -> None:
        super().__init__(max_fraction, patience)

    def holds(self, metrics: dict[str, float]) -> str | None:
        """The share, and the step's mean reward: groups all right and groups all wrong call for opposite fixes."""
        problem, reward = super().holds(metrics), _finite(metrics, "reward")
        return f"{problem}, mean reward {reward:.3g}" if problem and reward is not None else problem


class Truncated(ShareOver):
    """Most completions hit ``max_new_tokens`` without EOS: ``completions/clipped_ratio > max_fraction``.

    A cut completion is scored on an unfinished answer and never shows the model how to end one.
    Past half of them (the default) the length limit, not the task, decides most rewards. Five
    steps in a row (the default): a model often rambles for its first few steps."""

    name = "truncated"
    consequence = "cut completions are scored unfinished and teach no ending"
    fix = "raise sampling.max_new_tokens, set loss.mask_truncated_completions, or add a length penalty (DAPO's overlong shaping)"
    metric, what = "completions/clipped_ratio", "{share} of the completions hit max_new_tokens without EOS"

    def __init__(self, max_fraction: float = 0.5, patience: int = 5) -> None:
        super().__init__(max_fraction, patience)


class EntropyCollapse(Check):
    """The policy stopped exploring: ``entropy < max(fraction * first entropy, floor)``.

    At a tenth (the default) of the entropy of the first step, sampling gives nearly the same
    completion every time; groups then score alike and learning stalls. The floor, 0.01 nats per
    token by default, is where the top token holds about 99.9% of the probability, whatever the
    start; it catches a model that was near-deterministic from the first step."""

    name = "entropy_collapse"
    consequence = "sampling repeats itself, so groups score alike and exploration has stopped"
    fix = ("lower optim.learning_rate, add an entropy bonus (--model.loss.entropy_coef 0.001, or steer it to a target with "
           "grpo_lightning.algorithms.entropy.AdaptiveEntropy), raise loss.clip_eps_high (DAPO), or use --model ClipCov "
           "or --model KLCov")
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


class ShrinkingAnswers(Check):
    """Completions shrink toward nothing: ``completions/mean_length`` below ``fraction`` of the first
    step's while the shortest (``completions/min_length``) is at most ``min_tokens``, ``patience`` steps.

    A reward that teaches a model to stop rambling shortens its completions too, but leaves an answer
    in each: the shortest stays above a token or two. Half the first step's mean length (the default)
    with some completions of a single token is a policy that ends its turns at once, which a run with
    almost no reward signal can drift into (a whole group of empty answers scores alike)."""

    name = "shrinking_answers"
    consequence = "the policy is learning to end its turn at once, with no answer to score"
    fix = ("see equal_rewards: with almost no reward signal the model drifts; warm-start it on the task, use easier "
           "prompts or partial credit, raise kl.beta to hold it near its start, and check that no reward pays short answers")
    state_names = (*Check.state_names, "first")

    def __init__(self, fraction: float = 0.5, min_tokens: int = 1, patience: int = 5) -> None:
        super().__init__(patience)
        self.fraction, self.min_tokens = fraction, min_tokens
        self.first: float | None = None

    def holds(self, metrics: dict[str, float]) -> str | None:
        mean, shortest = _finite(metrics, "completions/mean_length"), _finite(metrics, "completions/min_length")
        if mean is None or shortest is None:
            return None
        if self.first is None:
            self.first = mean
        if mean < self.fraction * self.first and shortest <= self.min_tokens:
            return (f"completions average {mean:.3g} tokens (first step: {self.first:.3g}), the shortest "
                    f"{shortest:.0f}")
        return None


class CorrectionMasking(ShareOver):
    """The importance correction drops most of the loss: ``sampling/masked_fraction > max_fraction``,
    ``patience`` steps.

    A masking correction (``sampling.correction`` ``icepop``, ``geo_rs``, ``kpop``, ``m2po``, the
    ``*_mask`` modes) gives weight 0 to the tokens whose sampling and training probabilities disagree
    past its bounds. Past half of them (the default) the update learns from the few it keeps: on
    SmolLM2 with rollouts one update stale, Geo-RS's default bounds (0.999-1.001 on a 16-token
    completion's geometric-mean ratio) masked 87% of the tokens and its training accuracy stalled at
    82% where the other corrections passed 95% (benchmarks/RESULTS.md). Five steps in a row (the
    default): the first steps after a jump in staleness mask more."""

    name = "correction_masking"
    consequence = "the update learns from the few tokens the correction keeps"
    fix = ("widen the correction's bounds (sampling.correction_lower and correction_upper, correction_kl_threshold, "
           "correction_second_moment or correction_cap), sample fewer updates ahead (StaleRollouts.max_staleness), "
           "or take a correction that truncates the weights instead of masking them (token_truncate)")
    metric, what = "sampling/masked_fraction", "sampling.correction gave weight 0 to {share} of the loss tokens"

    def __init__(self, max_fraction: float = 0.5, patience: int = 5) -> None:
        super().__init__(max_fraction, patience)
