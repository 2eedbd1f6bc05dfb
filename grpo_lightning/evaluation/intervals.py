"""The interval of a share of right answers over prompts, whose completions tend to agree with each
other: Clopper & Pearson's (1934) exact binomial interval at the effective number of independent
completions (Kish's design effect). NumPy and SciPy only, so that reports read it without torch.

Simulated coverage: ``tests/evaluation/test_interval_coverage.py``.
"""

from __future__ import annotations

import math

import numpy as np

#: The coverage of the intervals validation logs.
CONFIDENCE = 0.95


def effective_samples(values: np.ndarray, samples: int) -> float:
    """The number of independent 0/1 outcomes whose mean is as precise as the mean of ``values``
    ``[P]`` in [0, 1], each from ``samples`` completions of one prompt: ``m (1 - m) P / s^2``
    (Kish's design effect, with ``m`` the mean and ``s^2`` the prompts' variance), between ``P`` (a
    prompt's completions all alike; no mean of values in [0, 1] varies more) and ``P x samples``
    (completions independent of their prompt). ``s^2`` is taken with one value at 0 and one at 1
    added, so that a few prompts that differ from the rest cannot claim the precision of many
    independent completions; ``P`` where ``m`` is 0 or 1, which says nothing of how a prompt's
    completions vary."""
    prompts, mean = values.size, float(values.mean())
    if mean <= 0.0 or mean >= 1.0:
        return float(prompts)
    spread = float(np.var(np.concatenate([values, [0.0, 1.0]]), ddof=1))
    return min(max(mean * (1.0 - mean) * prompts / spread, prompts), prompts * samples)


def proportion_interval(values: np.ndarray, samples: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of the mean of per-prompt ``values`` ``[P]`` in [0, 1] (NaN left out), each the share
    of ``samples`` completions that succeed (or pass@k of them): Clopper & Pearson's exact binomial
    interval of ``x = m N`` successes of ``N`` (:func:`effective_samples`), from the beta quantiles
    ``B(a/2; x, N - x + 1)`` and ``B(1 - a/2; x + 1, N - x)``. Never of zero width: 0 of 100 prompts
    gives [0, 0.0362]."""
    from scipy import stats

    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return (math.nan, math.nan)
    trials = effective_samples(values, samples)
    successes, tail = float(values.mean()) * trials, (1.0 - confidence) / 2
    low = 0.0 if successes <= 0 else float(stats.beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes >= trials else float(stats.beta.ppf(1.0 - tail, successes + 1, trials - successes))
    return (low, high)
