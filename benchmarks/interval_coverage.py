"""Coverage at nominal 95% of the report's intervals of an arm's difference to the baseline, simulated.

    python benchmarks/interval_coverage.py                        # the table the report's Method quotes
    python benchmarks/interval_coverage.py --simulations 400      # quicker, noisier

Each simulation draws a sweep of two arms: ``S`` seeds each, validated on ``P = 100`` prompts
(one 0/1 outcome per prompt, or normal scores), and asks whether the interval of ``arm - baseline``
holds the true difference over new seeds and new prompts of the task. Scenarios:

- ``normal, seeds dominate``: ``D[s, p] = 0.03 + a_s + e_sp``, ``a ~ N(0, 0.05^2)``, ``e ~ N(0, 0.1^2)``.
- ``normal, prompts dominate``: ``D[s, p] = 0.03 + b_p + e_sp``, ``b, e ~ N(0, 0.1^2)``: the arm helps on some
  prompts and not others, the same at every seed.
- ``skewed``: each prompt's success probability ``q_p ~ Beta(0.5, 4.5)`` (mean 0.1, most prompts near 0); a run
  answers prompt ``p`` right with probability ``logistic(logit(q_p) + u_s)``, ``u_s ~ N(0, 0.5^2)`` per seed
  and arm; the arm adds ``0.3 + w_p``, ``w_p ~ N(0, 0.3^2)``, on the logit scale.
- ``collapse``: as ``skewed``, for an arm that trains well (lift 2.0, seed spread 0.2 on the logit scale),
  where each of its seeds collapses with probability 0.2 (its success probabilities times 0.05).

Methods: ``two-level t`` (``report.paired.two_level_interval``, the report's interval where per-prompt
outcomes exist), ``seed t`` (``statistics.seed_interval`` of the seeds' mean differences, the fallback)
and ``two-level bootstrap`` (percentile, 1,000 resamples: seeds with replacement, then prompts with
replacement within each drawn seed, the same prompts for both arms). The figures go into
``grpo_lightning/report/sections/method.py`` (``COVERAGE``); ``tests/report/test_paired.py`` reruns them.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable

import numpy as np

from grpo_lightning.report.paired import SPREAD_ALPHA, normal_spread_p, outlying_seeds, two_level_interval
from grpo_lightning.report.statistics import t_quantile

PROMPTS = 100
SEEDS = (3, 5, 10)
#: Seeds at which the check for a collapsed seed is measured (it needs four).
DETECTION_SEEDS = (4, 5, 10)
#: Seeds at which the check of a whole arm is measured (it needs eight).
SPREAD_SEEDS = (8, 10, 14)
METHODS = ("two-level t", "seed t", "two-level bootstrap")
CONFIDENCE = 0.95
#: The logit-scale seed spread, lift and prompt spread of the lift: of the ``skewed`` scenario, and of
#: ``collapse`` (an arm that trains well).
SPECS = {
    "skewed": {"seed_sd": 0.5, "effect": 0.3, "prompt_sd": 0.3},
    "collapse": {"seed_sd": 0.2, "effect": 2.0, "prompt_sd": 0.3},
}
COLLAPSE_RATE, COLLAPSE_FACTOR = 0.2, 0.05


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _prompt_logits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    q = np.clip(rng.beta(0.5, 4.5, shape), 1e-6, 1 - 1e-6)
    return np.log(q / (1 - q))


def skewed_scores(rng: np.random.Generator, simulations: int, seeds: int, spec: str = "skewed", collapse: float = 0.0,
                  prompts: int = PROMPTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """``(arm, baseline, collapsed)``: 0/1 outcomes ``[simulations, seeds, prompts]`` of ``SPECS[spec]``
    where each of the arm's seeds collapses with probability ``collapse``, and which did ``[simulations, seeds]``."""
    spec = SPECS[spec]
    shape, seed_shape = (simulations, 1, prompts), (simulations, seeds, 1)
    base = _prompt_logits(rng, shape)
    lift = spec["effect"] + spec["prompt_sd"] * rng.normal(size=shape)
    p_arm = _logistic(base + lift + spec["seed_sd"] * rng.normal(size=seed_shape))
    p_base = _logistic(base + spec["seed_sd"] * rng.normal(size=seed_shape))
    collapsed = rng.random((simulations, seeds)) < collapse
    p_arm = np.where(collapsed[..., None], COLLAPSE_FACTOR * p_arm, p_arm)
    arm = (rng.random(p_arm.shape) < p_arm).astype(float)
    return arm, (rng.random(p_base.shape) < p_base).astype(float), collapsed


@functools.lru_cache(maxsize=None)
def skewed_truth(spec: str = "skewed", collapse: float = 0.0, draws: int = 2_000_000) -> float:
    """The true mean difference of the ``skewed`` scenario: ``E[p_arm - p_baseline]`` by Monte Carlo
    over prompts and seeds (fixed generator; its error is near 2e-4)."""
    rng = np.random.default_rng(12345)
    spec = SPECS[spec]
    base = _prompt_logits(rng, (draws,))
    lift = spec["effect"] + spec["prompt_sd"] * rng.normal(size=draws)
    p_arm = _logistic(base + lift + spec["seed_sd"] * rng.normal(size=draws)) * (1 - collapse * (1 - COLLAPSE_FACTOR))
    return float((p_arm - _logistic(base + spec["seed_sd"] * rng.normal(size=draws))).mean())


def normal_differences(rng: np.random.Generator, simulations: int, seeds: int, seed_sd: float, prompt_sd: float,
                       prompts: int = PROMPTS) -> tuple[np.ndarray, float]:  # fmt: skip
    d = (0.03 + seed_sd * rng.normal(size=(simulations, seeds, 1)) + prompt_sd * rng.normal(size=(simulations, 1, prompts))
         + 0.1 * rng.normal(size=(simulations, seeds, prompts)))  # fmt: skip
    return d, 0.03


#: Scenario name -> draw(rng, simulations, seeds) -> (differences [simulations, seeds, prompts], true mean).
SCENARIOS: dict[str, Callable[[np.random.Generator, int, int], tuple[np.ndarray, float]]] = {
    "normal, seeds dominate": lambda rng, n, s: normal_differences(rng, n, s, 0.05, 0.0),
    "normal, prompts dominate": lambda rng, n, s: normal_differences(rng, n, s, 0.0, 0.1),
    "skewed": lambda rng, n, s: (np.subtract(*skewed_scores(rng, n, s)[:2]), skewed_truth()),
    "collapse": lambda rng, n, s: (np.subtract(*skewed_scores(rng, n, s, "collapse", COLLAPSE_RATE)[:2]),
                                   skewed_truth("collapse", COLLAPSE_RATE)),
}


def seed_t_bounds(d: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """``statistics.seed_interval`` of each simulation's seed means, vectorised."""
    means = d.mean(axis=-1)
    seeds = means.shape[-1]
    half = t_quantile((1 + confidence) / 2, seeds - 1) * means.std(axis=-1, ddof=1) / math.sqrt(seeds)
    return means.mean(axis=-1) - half, means.mean(axis=-1) + half


def bootstrap_bounds(d: np.ndarray, rng: np.random.Generator, resamples: int = 1000,
                     confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Percentile interval of the two-level bootstrap: ``S`` seeds with replacement, then ``P``
    prompts with replacement within each drawn seed (the same prompts for both arms: ``d`` pairs them)."""
    simulations, seeds, prompts = d.shape
    means = np.empty((simulations, resamples))
    for b in range(resamples):
        drawn = d[:, rng.integers(0, seeds, seeds)]
        picks = rng.integers(0, prompts, (1, seeds, prompts))
        means[:, b] = np.take_along_axis(drawn, np.broadcast_to(picks, drawn.shape), axis=-1).mean(axis=(-2, -1))
    tail = (1 - confidence) / 2
    return np.quantile(means, tail, axis=1), np.quantile(means, 1 - tail, axis=1)


def coverage(scenario: str, seeds: int, simulations: int, methods=METHODS, resamples: int = 1000,
             seed: int = 0) -> dict[str, float]:  # fmt: skip
    """The share of ``simulations`` sweeps whose interval of each of ``methods`` holds the truth."""
    rng = np.random.default_rng((seed, seeds, sorted(SCENARIOS).index(scenario)))
    d, truth = SCENARIOS[scenario](rng, simulations, seeds)
    found = {}
    for method in methods:
        if method == "two-level t":
            low, high = two_level_interval(d, CONFIDENCE)[1:3]
        elif method == "seed t":
            low, high = seed_t_bounds(d)
        else:
            low, high = bootstrap_bounds(d, rng, resamples)
        found[method] = float(np.mean((low <= truth) & (truth <= high)))
    return found


def collapse_detection(seeds: int, simulations: int, seed: int = 0) -> tuple[float, float]:
    """``(found, false)``: the share of ``collapse`` sweeps with one collapsed seed of the arm in
    which ``outlying_seeds`` of the arm's seed accuracies names exactly that seed, and the share of
    the same sweeps without collapse in which it names any seed."""
    rng = np.random.default_rng((seed, seeds, 99))
    arm, _, collapsed = skewed_scores(rng, simulations, seeds, "collapse", COLLAPSE_RATE)
    one = collapsed.sum(axis=1) == 1
    found = [outlying_seeds(a, floor=0.01) == [int(np.flatnonzero(c)[0])] for a, c in zip(arm[one].mean(-1), collapsed[one])]
    intact = skewed_scores(rng, simulations, seeds, "collapse")[0].mean(-1)
    return float(np.mean(found)), float(np.mean([bool(outlying_seeds(a, floor=0.01)) for a in intact]))


def several_collapse_detection(seeds: int, simulations: int, seed: int = 0) -> tuple[float, float, float]:
    """``(one, whole, false)`` over ``collapse`` sweeps with two or more collapsed seeds of the arm: the share in
    which ``outlying_seeds`` names any seed (several collapsed seeds widen the others' spread and hide each other),
    the share in which the check of the whole arm fires where it names none (``normal_spread_p`` below
    ``SPREAD_ALPHA``), and, in the same sweeps without collapse, the share in which that check fires."""
    rng = np.random.default_rng(seed)
    arm, _, collapsed = skewed_scores(rng, simulations, seeds, "collapse", COLLAPSE_RATE)
    several = arm[collapsed.sum(axis=1) >= 2].mean(-1)

    def flags(values: np.ndarray) -> tuple[bool, bool]:
        far = bool(outlying_seeds(values, floor=0.01))
        return far, not far and normal_spread_p(values) < SPREAD_ALPHA

    found = np.array([flags(a) for a in several], dtype=bool).reshape(-1, 2)
    intact = np.array([flags(a)[1] for a in skewed_scores(rng, simulations, seeds, "collapse")[0].mean(-1)])
    return float(found[:, 0].mean()), float(found[:, 1].mean()), float(intact.mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulations", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args(argv)
    print(f"| scenario | seeds | {' | '.join(METHODS)} |\n|---|---|" + "---|" * len(METHODS))
    table = {}
    for scenario in SCENARIOS:
        for seeds in SEEDS:
            found = coverage(scenario, seeds, args.simulations, resamples=args.resamples)
            table[(scenario, seeds)] = tuple(round(found[m], 3) for m in METHODS)
            print(f"| {scenario} | {seeds} | " + " | ".join(f"{found[m]:.1%}" for m in METHODS) + " |", flush=True)
    print(f"\n{args.simulations} simulations per row, {PROMPTS} prompts; for method.py's COVERAGE:\n{table}")
    detection = {seeds: tuple(round(v, 3) for v in collapse_detection(seeds, args.simulations)) for seeds in DETECTION_SEEDS}
    print(f"collapsed seed named by outlying_seeds (one collapsed), any seed named without collapse:\n{detection}")
    whole = {seeds: tuple(round(v, 3) for v in several_collapse_detection(seeds, args.simulations)) for seeds in SPREAD_SEEDS}
    print(f"two or more collapsed: named by outlying_seeds, by the whole-arm check alone; whole-arm check without "
          f"collapse:\n{whole}")


if __name__ == "__main__":
    main()
