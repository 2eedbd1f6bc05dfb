"""The metrics the report tabulates and ranks, what range each can take, and which is better."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

UNBOUNDED = (-math.inf, math.inf)
PROPORTION = (0.0, 1.0)
NON_NEGATIVE = (0.0, math.inf)


@dataclass(frozen=True)
class Metric:
    """A final metric: a scalar tag or a computed key (``initial:<tag>``, ``gain:<tag>``,
    ``steps``, ``batches``, ``train_time_s``); ``direction`` +1 higher is better, -1 lower is
    better, 0 no preference."""

    key: str
    label: str
    direction: int = 0


FINAL_METRICS = [
    Metric("val/accuracy", "val/accuracy", 1),
    Metric("initial:val/accuracy", "val/accuracy before training"),
    Metric("gain:val/accuracy", "val/accuracy gain", 1),
    Metric("val/reward", "val/reward", 1),
    Metric("val/mean_length", "val/mean_length"),
    Metric("reward", "reward", 1),
    Metric("reward_std", "reward_std"),
    Metric("frac_reward_zero_std", "frac_reward_zero_std"),
    Metric("kl", "kl"),
    Metric("entropy", "entropy"),
    Metric("completions/mean_length", "completions/mean_length"),
    Metric("clip_ratio/region", "clip_ratio/region"),
    Metric("clip_ratio/low", "clip_ratio/low"),
    Metric("clip_ratio/high", "clip_ratio/high"),
    Metric("step_of:val/accuracy", "step of the final validation"),
    Metric("steps", "optimizer steps"),
    Metric("batches", "generation batches"),
    Metric("perf/generated_tokens", "generated tokens", -1),
    Metric("train_time_s", "training wall-clock (s)", -1),
]

#: Columns of the per-run table.
PER_RUN_METRICS = {"val/accuracy", "initial:val/accuracy", "reward", "kl", "step_of:val/accuracy", "steps",
                   "perf/generated_tokens", "train_time_s"}  # fmt: skip

#: Metrics the summary compares with the baseline: (key, label, direction).
SUMMARY_METRICS = [
    ("val/accuracy", "final val/accuracy", 1),
    ("reward", "training reward", 1),
    ("kl", "KL to the reference", -1),
    ("perf/generated_tokens", "generated tokens", -1),
    ("train_time_s", "training wall-clock", -1),
]

#: Config settings that set the scale of the training reward: arms that differ in one are not
#: compared on it (parts of flattened config keys).
REWARD_SCALE_KEYS = (
    "rewards.funcs",
    "rewards.weights",
    "rewards.aggregation",
    "reward_funcs",
    "reward_weights",
    "step_reward",
    "reward_aggregation",
    "reward_model",
)  # and the flat names of runs recorded before the groups

#: Wall-clock metrics: meaningless when the machine was loaded (see ``provenance.wall_clock_caveat``).
WALL_CLOCK_METRICS = {"train_time_s"}

_PROPORTIONS = re.compile(r"^(val|test)/(accuracy|pass@\d+|maj@\d+)$|^(frac_|clip_ratio/|completions/clipped_ratio)")
_NON_NEGATIVE = re.compile(r"length|entropy|reward_std|^perf/|^train_time_s$|^steps$|^batches$")
#: Computed keys that count steps or tokens.
_STEP_KINDS = {"step_of", "steps_to", "tokens_to"}


def metric_bounds(key: str) -> tuple[float, float]:
    """The range a metric can take: accuracies and shares in ``[0, 1]``, a gain of accuracy in
    ``[-1, 1]``, times, counts, lengths and entropies ``>= 0``; unbounded otherwise."""
    kind, _, tag = key.rpartition(":")
    kind = kind.partition("@")[0]  # auc@0-400, steps_to@0.33: the parameter does not change the range
    if kind in _STEP_KINDS:
        return NON_NEGATIVE
    if _PROPORTIONS.search(tag):
        return (-1.0, 1.0) if kind == "gain" else PROPORTION
    if _NON_NEGATIVE.search(tag) and kind != "gain":
        return NON_NEGATIVE
    return UNBOUNDED
