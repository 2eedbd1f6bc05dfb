"""Metrics of ``n`` sampled completions per prompt, with confidence intervals over prompts.

- ``pass@k``: the chance that at least one of ``k`` completions drawn without replacement from the
  ``n`` is correct, by the unbiased estimator of Chen et al. 2021 (eq. 1),
  ``1 - C(n - c, k) / C(n, k)`` for a prompt with ``c`` correct completions, averaged over prompts.
- ``maj@n``: whether the answer most completions of a prompt give is correct (self-consistency,
  Wang et al. 2023); completions without an answer do not vote, ties go to the answer seen first.
- Intervals: the percentile bootstrap over prompts (Efron & Tibshirani 1993, ch. 13), which stays
  inside the range a bounded quantity can take.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from grpo_lightning.rewards.consistency import majority_answer

#: Bootstrap resamples of the prompts behind each interval, and the interval's coverage.
BOOTSTRAP_RESAMPLES = 1000
CONFIDENCE = 0.95


def pass_at_k(num_samples: int, num_correct: Tensor, k: int) -> Tensor:
    """Per-prompt unbiased ``pass@k`` (Chen et al. 2021, eq. 1) from ``num_correct`` ``[P]`` of
    ``num_samples`` completions: ``1 - C(n - c, k) / C(n, k)``, computed as the product
    ``prod_{i = n - c + 1}^{n} (1 - k / i)`` so no binomial coefficient overflows."""
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@k needs 1 <= k <= n samples per prompt, got k={k}, n={num_samples}")
    values = []
    for correct in num_correct.tolist():
        if num_samples - correct < k:
            values.append(1.0)
        else:
            values.append(1.0 - math.prod(1.0 - k / i for i in range(num_samples - int(correct) + 1, num_samples + 1)))
    return torch.tensor(values, dtype=torch.float64)


def pass_k_values(num_samples: int) -> list[int]:
    """The ``k`` reported for ``n`` samples per prompt: 1, 2, 4, ... up to ``n``, and ``n`` itself."""
    ks = [2**i for i in range(num_samples.bit_length()) if 2**i <= num_samples]
    return ks if ks[-1] == num_samples else [*ks, num_samples]


def majority_correct(votes: Sequence[Hashable | None], correct: Sequence[float]) -> float:
    """1.0 when the most common answer among ``votes`` (one per completion of a prompt, ``None``
    for a completion without an answer) belongs to a correct completion, else 0.0; no vote: 0.0."""
    winner = majority_answer(votes)
    if winner is None:
        return 0.0
    return 1.0 if float(correct[list(votes).index(winner)]) == 1.0 else 0.0


def bootstrap_interval(
    values: Tensor, resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` ``[P]`` (one per prompt); NaN values
    are left out. Seeded, so the same values give the same interval."""
    values = values.double()
    values = values[~values.isnan()]
    if values.numel() == 0:
        return (math.nan, math.nan)
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(values.numel(), (resamples, values.numel()), generator=generator)
    means = values[index].mean(dim=1)
    tail = (1.0 - confidence) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return (low, high)


def summarize(per_prompt: dict[str, Tensor]) -> dict[str, float]:
    """``name``, ``name_ci_low``, ``name_ci_high`` for each per-prompt metric ``[P]`` (NaN: left out)."""
    summary = {}
    for name, values in per_prompt.items():
        kept = values.double()[~values.double().isnan()]
        summary[name] = float(kept.mean()) if kept.numel() else math.nan
        summary[f"{name}_ci_low"], summary[f"{name}_ci_high"] = bootstrap_interval(values)
    return summary


def prompt_metrics(correct: Tensor, rewards: Tensor, lengths: Tensor, votes: Sequence[Hashable | None]) -> dict[str, Tensor]:
    """Per-prompt metrics of ``[P, n]`` scores (``correct``: the accuracy function's, NaN where it
    does not apply), rewards and lengths, and the ``P * n`` answers that vote: ``accuracy`` (the mean
    over the ``n``), ``reward``, ``mean_length``, and for ``n > 1`` ``pass@k`` and ``maj@n``. A prompt
    whose accuracy does not apply is NaN in every accuracy metric."""
    num_samples = correct.size(1)
    applies = ~correct.isnan().any(dim=1)
    solved = torch.nan_to_num(correct.double(), nan=0.0)
    metrics = {
        "accuracy": torch.where(applies, solved.mean(dim=1), math.nan),
        "reward": rewards.double().mean(dim=1),
        "mean_length": lengths.double().mean(dim=1),
    }
    if num_samples > 1:
        num_correct = (solved == 1.0).sum(dim=1)
        for k in pass_k_values(num_samples):
            metrics[f"pass@{k}"] = torch.where(applies, pass_at_k(num_samples, num_correct, k), math.nan)
        majority = torch.tensor(
            [majority_correct(votes[p * num_samples : (p + 1) * num_samples], solved[p].tolist()) for p in range(len(solved))],
            dtype=torch.float64,
        )
        metrics[f"maj@{num_samples}"] = torch.where(applies, majority, math.nan)
    return metrics
