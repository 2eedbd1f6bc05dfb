"""Metrics of ``n`` sampled completions per prompt, with confidence intervals over prompts.

- ``pass@k``: the chance that at least one of ``k`` completions drawn without replacement from the
  ``n`` is correct, by the unbiased estimator of Chen et al. 2021 (eq. 1),
  ``1 - C(n - c, k) / C(n, k)`` for a prompt with ``c`` correct completions, averaged over prompts.
- ``maj@n``: whether the answer most completions of a prompt give is correct (self-consistency,
  Wang et al. 2023); completions without an answer do not vote, ties go to the answer seen first.
- Intervals over prompts. A metric of 0/1 outcomes (accuracy, pass@k, maj@n, the truncated share):
  Clopper & Pearson's (1934) exact binomial interval at the effective number of independent
  completions (Kish's design effect, :mod:`grpo_lightning.evaluation.intervals`), so it keeps its 95% near 0 and 1
  and when a prompt's completions agree with each other. Any other (reward, length): the
  percentile bootstrap over prompts (Efron & Tibshirani 1993, ch. 13).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from grpo_lightning.evaluation import intervals
from grpo_lightning.rewards.consistency import majority_answer

#: Bootstrap resamples of the prompts behind each interval, and the intervals' coverage.
BOOTSTRAP_RESAMPLES = 1000
CONFIDENCE = intervals.CONFIDENCE
#: The per-prompt metrics that are means of 0/1 outcomes (by name, or its prefix): their interval is
#: :func:`proportion_interval` where every value is in [0, 1].
PROPORTIONS = ("accuracy", "pass@", "maj@", "truncated_share")


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


def proportion_interval(values: Tensor, samples: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """:func:`grpo_lightning.evaluation.intervals.proportion_interval` of per-prompt ``values`` ``[P]``."""
    return intervals.proportion_interval(values.double().cpu().numpy(), samples, confidence)


def is_proportion(name: str, kept: Tensor) -> bool:
    """Whether metric ``name`` is a mean of 0/1 outcomes (:data:`PROPORTIONS`) with every value of
    ``kept`` (its values but NaN) in [0, 1]."""
    return name.startswith(PROPORTIONS) and bool(((kept >= 0) & (kept <= 1)).all())


def summarize(per_prompt: dict[str, Tensor], samples: int = 1) -> dict[str, float]:
    """``name``, ``name_ci_low``, ``name_ci_high`` for each per-prompt metric ``[P]`` (NaN: left out);
    ``samples``: the completions drawn per prompt (:func:`proportion_interval`)."""
    summary = {}
    for name, values in per_prompt.items():
        kept = values.double()[~values.double().isnan()]
        summary[name] = float(kept.mean()) if kept.numel() else math.nan
        interval = proportion_interval(kept, samples) if is_proportion(name, kept) else bootstrap_interval(values)
        summary[f"{name}_ci_low"], summary[f"{name}_ci_high"] = interval
    return summary


def prompt_metrics(correct: Tensor, rewards: Tensor, lengths: Tensor, votes: Sequence[Hashable | None],
                   truncated: Tensor | None = None) -> dict[str, Tensor]:  # fmt: skip
    """Per-prompt metrics of ``[P, n]`` scores (``correct``: the accuracy function's, NaN where it
    does not apply), rewards and lengths, and the ``P * n`` answers that vote: ``accuracy`` (the mean
    over the ``n``), ``reward``, ``mean_length``, ``truncated_share`` (of ``truncated`` ``[P, n]``:
    completions cut at the token limit, scored as they stand), and for ``n > 1`` ``pass@k`` and
    ``maj@n``, which count a completion correct at a score of exactly 1: where the scores are not all
    0 or 1 they are left out, with a warning. A prompt whose accuracy does not apply (no completion
    scored: no reference) is NaN in every accuracy metric; a completion left unscored beside scored
    ones counts as incorrect, with a warning (leaving its prompt out would leave out hard prompts)."""
    num_samples = correct.size(1)
    unscored = correct.isnan()
    applies = ~unscored.all(dim=1)
    beside_scored = unscored & applies[:, None]
    if beside_scored.any():
        rank_zero_warn(f"evaluation.accuracy_func gave no score (None or NaN) to {int(beside_scored.sum())} "
                       "completions of prompts whose other completions it scored: they count as incorrect. Return 0 "
                       "for a wrong answer, None only where a prompt has no reference.")  # fmt: skip
    solved = torch.nan_to_num(correct.double(), nan=0.0)
    metrics = {
        "accuracy": torch.where(applies, solved.mean(dim=1), math.nan),
        "reward": rewards.double().mean(dim=1),
        "mean_length": lengths.double().mean(dim=1),
    }
    if truncated is not None:
        metrics["truncated_share"] = truncated.double().mean(dim=1)
    partial = solved[(solved != 0) & (solved != 1)]
    if num_samples > 1 and partial.numel():
        rank_zero_warn(f"evaluation.accuracy_func: scores other than 0 and 1 (e.g. {float(partial[0]):g}), so pass@k "
                       "and maj@n, which count a completion correct at a score of exactly 1, are left out; accuracy "
                       "is the mean score. An accuracy function of 0 or 1 gives them.")  # fmt: skip
    elif num_samples > 1:
        num_correct = (solved == 1.0).sum(dim=1)
        for k in pass_k_values(num_samples):
            metrics[f"pass@{k}"] = torch.where(applies, pass_at_k(num_samples, num_correct, k), math.nan)
        majority = torch.tensor(
            [majority_correct(votes[p * num_samples : (p + 1) * num_samples], solved[p].tolist()) for p in range(len(solved))],
            dtype=torch.float64,
        )
        metrics[f"maj@{num_samples}"] = torch.where(applies, majority, math.nan)
    return metrics
