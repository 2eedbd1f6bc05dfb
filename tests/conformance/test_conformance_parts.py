"""Every registered part (:mod:`grpo_lightning.algorithms`: ``ADVANTAGES``, ``AGGREGATIONS``,
``SURROGATES``) against values worked out by hand, and what each kind of part promises.

The tables below are keyed by part name: small inputs, the expected values, and the arithmetic in a
comment. The tests run over the registries, not over the tables, so a part registered without a case
here fails ("registered without a hand-computed case"); a case whose part is gone fails too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning import variants
from grpo_lightning.algorithms import ADVANTAGES, AGGREGATIONS, SURROGATES
from grpo_lightning.algorithms.advantages import TOKEN_STATISTICS_ADVANTAGES, TokenStatistics

f64 = torch.float64
ln = math.log


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=f64)


# ------------------------------------------------------------------ advantages: rewards [P, G] -> [P, G]

# Group 0: rewards 1, 0, 0, 1 (mean 0.5; unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3) = 0.577350);
# group 1: all 2, where every estimator of a group baseline gives exactly 0.
REWARDS = [[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]


def signed(a: float) -> list:
    """``a`` for the rewards of 1 in group 0, ``-a`` for the 0s, and 0 in group 1."""
    return [[a, -a, -a, a], [0.0] * 4]


ADVANTAGE_CASES = {
    "group_std": signed(0.5 / (3**-0.5 + 1e-4)),  # (r - 0.5) / (std + 1e-4) = 0.865875
    "group_mean": signed(0.5),  # r - 0.5
    "leave_one_out": signed(2 / 3),  # r = 1: 1 - (0 + 0 + 1) / 3; r = 0: 0 - (1 + 0 + 1) / 3
    "batch_std": signed(0.5 / (1 / 7) ** 0.5),  # centred 8 entries, sum of squares 1, unbiased std sqrt(1/7)
    "gpg": signed(8 / 6 * 0.5),  # alpha = 8 completions / 6 non-zero rewards, times r - 0.5
    "max_rl": signed(0.5 / (0.5 + 1e-6)),  # (r - 0.5) / (mean 0.5 + 1e-6): +-1 for a success rate of 1/2
    # Per token, T = 2 (TOKEN_STATISTICS below): w = 1 - 2 pi + sum pi^2 is 1 at row 0's first token, else 0.5.
    # Group 0, k = 0: W = 1, .5, .5, .5: B = (1 + .5) / 2.5 = 0.6; k = 1 (rows 0, 1): W = 1.5, 1: B = 1.5 / 2.5 = 0.6.
    # Group 1: equal rewards, B = 2 everywhere.
    "optimal_token_baseline": [[[0.4, 0.4], [-0.6, -0.6], [-0.6, 0.0], [0.4, 0.0]], [[0.0, 0.0]] * 4],
}
# Completions of lengths 2, 2, 1, 1 (group 0) and 2 (group 1); pi = 0.5 and sum pi^2 = 0.5 (w = 0.5),
# but pi = 0.25 at row 0's first token (w = 1).
TOKEN_STATISTICS = {
    "optimal_token_baseline": TokenStatistics(
        logp=torch.tensor([[[0.25, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], [[0.5, 0.5]] * 4]).log(),
        sum_pi_squared=torch.full((2, 4, 2), 0.5),
        mask=torch.tensor([[[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]], [[1.0, 1.0]] * 4]),
    )
}


# ------------------------------------------------------------------ aggregations: loss, mask [N, T] -> []

# Two completions, 3 and 2 valid tokens (5 in all), length limit L = 4; the 7s are padding.
LOSS = [[1.0, 2.0, 3.0, 7.0], [4.0, 5.0, 7.0, 7.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
AGGREGATION_CASES = {
    "token_mean": 3.0,  # (1 + 2 + 3 + 4 + 5) / 5
    "seq_mean_token_mean": 3.25,  # (6 / 3 + 9 / 2) / 2
    "seq_mean_token_sum": 7.5,  # (6 + 9) / 2
    "seq_mean_token_sum_norm": 1.875,  # (6 + 9) / (2 * 4)
}


# ------------------------------------------------------------------ surrogates: (logp, old_logp, A, mask) -> [N, T]


@dataclass(frozen=True)
class SurrogateCase:
    """One call with the part's own defaults (its paper's settings). ``loss`` is expected on the mask
    (padding is the aggregation's to drop); ``grad`` is ``d sum(loss * mask) / d logp``; ``region``
    the tokens it reports in ``clip_ratio/region`` (clipped or dropped), ``None`` where it reports none."""

    logp: list
    old_logp: list
    advantages: list  # [N], or [N, T] where the part takes per-token advantages
    mask: list
    loss: list
    grad: list
    region: list | None = None


S = math.exp(0.2)  # GSPO's sequence ratio exp((0.1 + 0.3) / 2) = 1.2214027581601699
PHI_POS = math.exp(1.5) / 4  # VESPO phi(0.5), A >= 0: exp(3 + 2 ln 0.5 - 3 * 0.5) = 1.1204222675845161
PHI_NEG = 8 * math.exp(-2)  # VESPO phi(2), A < 0: exp(2 + 3 ln 2 - 2 * 2) = 1.0826822658929016
YES, NO = True, False

SURROGATE_CASES = {
    # eps 0.2 / 0.2; old_logp 0, so exp(logp) is the ratio r. Loss -min(r A, clip(r, 0.8, 1.2) A),
    # gradient -r A where the unclipped term is the min, else 0.
    # Row 0, A = +1: r = 1.25 -> -1.2 (clipped); r = 1.1 -> -1.1, grad -1.1.
    # Row 1, A = -1: r = 0.75 -> -min(-0.75, -0.8) = 0.8 (clipped); r = 0.9 -> 0.9, grad 0.9.
    "ppo_clip": SurrogateCase(
        logp=[[ln(1.25), ln(1.1)], [ln(0.75), ln(0.9)]], old_logp=[[0.0, 0.0], [0.0, 0.0]], advantages=[1.0, -1.0],
        mask=[[1, 1], [1, 1]], loss=[[-1.2, -1.1], [0.8, 0.9]], grad=[[0.0, -1.1], [0.0, 0.9]],
        region=[[YES, NO], [YES, NO]],
    ),
    # eps 3e-4 / 4e-4 on the sequence ratio s = exp(mean over the mask of log r): the masked 5.0 is
    # left out, s = exp(0.2) = S, on every token. Row 0, A = -1: -min(-S, -1.0004) = S, unclipped;
    # d (2 S) / d logp_t = 2 * S / 2 = S on each real token. Row 1, A = +1: -min(S, 1.0004) = -1.0004, clipped.
    "gspo": SurrogateCase(
        logp=[[0.1, 0.3, 5.0], [0.1, 0.3, 5.0]], old_logp=[[0.0] * 3] * 2, advantages=[-1.0, 1.0],
        mask=[[1, 1, 0], [1, 1, 0]], loss=[[S, S, 0.0], [-1.0004, -1.0004, 0.0]], grad=[[S, S, 0.0], [0.0] * 3],
        region=[[NO, NO, NO], [YES, YES, NO]],
    ),
    # No lower bound, eps_high 5: loss -sg(w) A log pi, w = min(r, 6); gradient -w A, clipped or not.
    # Row 0, A = +1: r = 0.3 / 0.1 = 3 -> -3 ln 0.3 = 3.611918; r = 7 -> w = 6, -6 ln 0.7 = 2.140050.
    # Row 1, A = -2: r = 0.01 / 0.5 = 0.02 -> 0.04 ln 0.01 = -0.184207; r = 1 -> 2 ln 0.25 = -2.772589.
    "cispo": SurrogateCase(
        logp=[[ln(0.3), ln(0.7)], [ln(0.01), ln(0.25)]], old_logp=[[ln(0.1), ln(0.1)], [ln(0.5), ln(0.25)]],
        advantages=[1.0, -2.0], mask=[[1, 1], [1, 1]],
        loss=[[-3 * ln(0.3), -6 * ln(0.7)], [0.04 * ln(0.01), 2 * ln(0.25)]], grad=[[-3.0, -6.0], [0.04, 2.0]],
        region=[[NO, YES], [NO, NO]],
    ),
    # tau_pos 1, tau_neg 1.05: loss -(4 / tau) sigmoid(tau (r - 1)) A, gradient -4 s (1 - s) r A.
    # r = 1: -(2 / tau) A, gradient -A: -2 (A = 1, tau 1) and 2 / 1.05 = 1.904762 (A = -1).
    # r = 1.5, A = 2: s = sigmoid(0.5) = 0.622459, loss -8 s = -4.979675, gradient -4 s (1 - s) 3 = -2.820045.
    # r = 0.5, A = -1: s = sigmoid(-0.525) = 0.371684, loss (4 / 1.05) s = 1.415938, gradient 2 s (1 - s) = 0.467070.
    "sapo": SurrogateCase(
        logp=[[0.0, ln(1.5)], [0.0, ln(0.5)]], old_logp=[[0.0, 0.0], [0.0, 0.0]], advantages=[[1.0, 2.0], [-1.0, -1.0]],
        mask=[[1, 1], [1, 1]], loss=[[-2.0, -4.979674649614837], [1.9047619047619047, 1.4159383303033666]],
        grad=[[-1.0, -2.820044546419134], [1.0, 0.4670699116426963]],
    ),
    # eps 0.4 / 0.4 in log space: d' = clamp the log-ratio d by the sign of A; loss -A exp(mean_t d')
    # on every token; d (|o| loss) / d logp_t = -A s on a real unclipped token.
    # Row 0, A = +1: d = [0.1, 0.7 -> 0.4, masked]: s = exp(0.25) = 1.284025; gradient -1.284025 on token 0.
    # Row 1, A = -2: d = [-0.7 -> -0.4, 0.7, 0.1]: s = exp(0.4 / 3) = 1.142631, loss 2 s = 2.285262 = its gradient.
    "gmpo": SurrogateCase(
        logp=[[0.1, 0.7, 5.0], [-0.7, 0.7, 0.1]], old_logp=[[0.0] * 3] * 2, advantages=[1.0, -2.0],
        mask=[[1, 1, 0], [1, 1, 1]], loss=[[-math.exp(0.25)] * 2 + [0.0], [2 * math.exp(0.4 / 3)] * 3],
        grad=[[-math.exp(0.25), 0.0, 0.0], [0.0, 2 * math.exp(0.4 / 3), 2 * math.exp(0.4 / 3)]],
        region=[[NO, YES, NO], [YES, NO, NO]],
    ),
    # -A log pi, whatever old_logp: A = 2: -2 * -0.5 = 1, -2 * -2 = 4; gradient -A = -2.
    "reinforce": SurrogateCase(
        logp=[[-0.5, -2.0]], old_logp=[[-3.0, 1.0]], advantages=[2.0], mask=[[1, 1]], loss=[[1.0, 4.0]],
        grad=[[-2.0, -2.0]],
    ),
    # k, lambda = 2, 3 (A >= 0) and 3, 2 (A < 0); w = exp(sum over the mask of log r); loss -sg(phi) A log pi.
    # Row 0, A = +1: w = 0.5 (the masked 9.0 left out), phi = PHI_POS: loss -phi ln 0.5 = 0.776618, 0; gradient -phi.
    # Row 1, A = -1: w = 2, phi = PHI_NEG: loss phi ln 2 = 0.750458, 0, 0; gradient +phi.
    "vespo": SurrogateCase(
        logp=[[ln(0.5), 0.0, 9.0], [ln(2.0), 0.0, 0.0]], old_logp=[[0.0] * 3] * 2, advantages=[1.0, -1.0],
        mask=[[1, 1, 0], [1, 1, 1]], loss=[[-PHI_POS * ln(0.5), 0.0, 0.0], [PHI_NEG * ln(2.0), 0.0, 0.0]],
        grad=[[-PHI_POS, -PHI_POS, 0.0], [PHI_NEG] * 3],
    ),
    # Bounds 0.15 / 0.15 on p - p_old, cap c = 20: loss -valid sg(min(r, 20)) A log pi, gradient -valid min(r, 20) A.
    # Row 0, A = +1: 0.5 -> 0.8 (+0.3 > 0.15: dropped); 0.001 -> 0.1 (+0.099: kept, r = 100 -> 20):
    #   -20 ln 0.1 = 46.051702.
    # Row 1, A = -1: 0.5 -> 0.2 (-0.3 < -0.15: dropped); 0.5 -> 0.6 (kept, r = 1.2): 1.2 ln 0.6 = -0.612991.
    "dppo_tv": SurrogateCase(
        logp=[[ln(0.8), ln(0.1)], [ln(0.2), ln(0.6)]], old_logp=[[ln(0.5), ln(0.001)], [ln(0.5), ln(0.5)]],
        advantages=[1.0, -1.0], mask=[[1, 1], [1, 1]], loss=[[0.0, -20 * ln(0.1)], [0.0, 1.2 * ln(0.6)]],
        grad=[[0.0, -20.0], [0.0, 1.2]], region=[[YES, NO], [YES, NO]],
    ),
    # Bounds 0.05 / 0.05 on D = p_old ln(p_old / p) + (1 - p_old) ln((1 - p_old) / (1 - p)); a token that
    # moved against its advantage's push is always kept. c = 20.
    # Row 0, A = +1: 0.5 -> 0.6: D = 0.020411, kept, r = 1.2: -1.2 ln 0.6 = 0.612991; 0.5 -> 0.9: D = 0.510826, dropped.
    # Row 1, A = -1: 0.5 -> 0.9: p >= p_old, kept, r = 1.8: 1.8 ln 0.9 = -0.189649; 0.5 -> 0.1: D = 0.510826, dropped.
    "dppo_kl": SurrogateCase(
        logp=[[ln(0.6), ln(0.9)], [ln(0.9), ln(0.1)]], old_logp=[[ln(0.5), ln(0.5)], [ln(0.5), ln(0.5)]],
        advantages=[1.0, -1.0], mask=[[1, 1], [1, 1]], loss=[[-1.2 * ln(0.6), 0.0], [1.8 * ln(0.9), 0.0]],
        grad=[[-1.2, 0.0], [1.8, 0.0]], region=[[NO, YES], [NO, YES]],
    ),
    # dro_beta 0.1: loss -(A log pi - 0.05 (log pi - log pi_old)^2), gradient -(A - 0.1 (log pi - log pi_old)).
    # A = 2: log-ratio 0.5: -(-2 - 0.0125) = 2.0125, gradient -(2 - 0.05) = -1.95; log-ratio 0: 1.0, gradient -2.
    "dro": SurrogateCase(
        logp=[[-1.0, -0.5]], old_logp=[[-1.5, -0.5]], advantages=[2.0], mask=[[1, 1]], loss=[[2.0125, 1.0]],
        grad=[[-1.95, -2.0]],
    ),
}

CASES = {"advantage": ADVANTAGE_CASES, "aggregation": AGGREGATION_CASES, "surrogate": SURROGATE_CASES}
REGISTRIES = {"advantage": ADVANTAGES, "aggregation": AGGREGATIONS, "surrogate": SURROGATES}


def case_of(kind: str, name: str):
    assert name in CASES[kind], (
        f"{kind} {name!r} is registered without a hand-computed case: "
        f"add one to {kind.upper()}_CASES in tests/conformance/test_conformance_parts.py"
    )
    return CASES[kind][name]


def test_every_hand_case_is_of_a_registered_part():
    stale = {kind: sorted(set(CASES[kind]) - set(REGISTRIES[kind])) for kind in CASES}
    assert not any(stale.values()), f"cases of parts that are not registered: {stale}"


@pytest.mark.parametrize("name", ADVANTAGES)
def test_each_advantage_against_its_hand_case(name):
    expected = case_of("advantage", name)
    tokens = (TOKEN_STATISTICS[name],) if name in TOKEN_STATISTICS_ADVANTAGES else ()
    assert_close(ADVANTAGES[name](torch.tensor(REWARDS), *tokens), torch.tensor(expected), rtol=1e-6, atol=1e-7)


def test_the_part_that_docs_adding_a_variant_adds_matches_its_hand_case(monkeypatch):
    """The page's function, registered with its case as the page shows: it passes the test above, and
    a variant takes it by name."""
    page = (Path(variants.__file__).resolve().parents[1] / "docs" / "adding_a_variant.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.DOTALL)
    namespace: dict = {"Tensor": torch.Tensor}
    exec(next(block for block in blocks if "def group_max" in block), namespace)  # noqa: S102 - the page's example
    case = re.search(r'ADVANTAGE_CASES = \{\.\.\., "group_max": (.+)\}  #', page)
    assert case, "docs/adding_a_variant.md shows group_max's line of ADVANTAGE_CASES"
    monkeypatch.setitem(ADVANTAGES, "group_max", namespace["group_max"])
    monkeypatch.setitem(ADVANTAGE_CASES, "group_max", eval(case.group(1)))  # noqa: S307 - the page's hand values
    test_each_advantage_against_its_hand_case("group_max")
    rewards = torch.tensor(REWARDS)
    assert torch.equal(variants.GRPO("m", advantage="group_max").advantages(rewards), namespace["group_max"](rewards))


@pytest.mark.parametrize("name", AGGREGATIONS)
def test_each_aggregation_against_its_hand_case(name):
    expected = case_of("aggregation", name)
    assert AGGREGATIONS[name](t(LOSS), t(MASK), max_tokens=4).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", SURROGATES)
def test_each_surrogate_against_its_hand_case(name):
    case = case_of("surrogate", name)
    logp, mask = t(case.logp).requires_grad_(), t(case.mask)
    loss, shares = SURROGATES[name].loss(logp, t(case.old_logp), t(case.advantages), mask)
    (grad,) = torch.autograd.grad((loss * mask).sum(), logp)
    assert_close(loss.detach() * mask, t(case.loss), msg=lambda m: f"{name}: loss: {m}")
    assert_close(grad, t(case.grad), msg=lambda m: f"{name}: gradient: {m}")
    region = shares.get("clip_ratio/region")
    assert (region is None) == (case.region is None), f"{name}: logs clip_ratio/region: {region is not None}"
    if region is not None:
        assert (region & mask.bool()).tolist() == case.region


# ------------------------------------------------------------------ what every part of a kind promises


@pytest.mark.parametrize("name", AGGREGATIONS)
def test_each_aggregation_summed_over_rows_with_the_batch_counts_is_the_batchs(name):
    loss, mask = t(LOSS), t(MASK)
    counts = {"num_sequences": 2, "num_tokens": mask.sum(), "max_tokens": 4}
    split = sum(AGGREGATIONS[name](loss[i : i + 1], mask[i : i + 1], **counts) for i in range(2))
    assert split.item() == pytest.approx(AGGREGATIONS[name](loss, mask, max_tokens=4).item(), rel=1e-12)


def random_batch() -> tuple[torch.Tensor, ...]:
    """Seven ragged rows (one empty); probabilities drawn apart from the old ones (ratios 1/49 to 49),
    so that every clip, gate and divergence bound acts; advantages of both signs."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.tensor([6, 1, 0, 4, 3, 6, 2])
    mask = (torch.arange(6) < lengths.unsqueeze(1)).to(f64)
    probability = lambda: 0.02 + 0.96 * torch.rand(7, 6, generator=generator, dtype=f64)  # noqa: E731
    logp, old_logp = probability().log().requires_grad_(), probability().log()
    return logp, old_logp, torch.randn(7, generator=generator, dtype=f64), mask


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_each_surrogate_under_each_aggregation_gives_the_batchs_loss_and_gradient_in_any_micro_batches(
    surrogate, aggregation
):
    """What a module's micro-batches rely on: each row's loss depends on that row only, and the
    aggregation divides by the counts of the whole batch it is given."""
    logp, old_logp, advantages, mask = random_batch()
    loss_of, aggregate = SURROGATES[surrogate].loss, AGGREGATIONS[aggregation]
    loss, shares = loss_of(logp, old_logp, advantages, mask)
    assert bool((shares.get("clip_ratio/region", mask.bool()) & mask.bool()).any()), "the batch never clips"
    whole = aggregate(loss, mask, max_tokens=6)
    counts = {"num_sequences": 7, "num_tokens": mask.sum(), "max_tokens": 6}
    split = sum(
        aggregate(loss_of(logp[rows], old_logp[rows], advantages[rows], mask[rows])[0], mask[rows], **counts)
        for rows in torch.arange(7).split([2, 3, 1, 1])
    )
    (whole_grad,) = torch.autograd.grad(whole, logp)
    (split_grad,) = torch.autograd.grad(split, logp)
    assert whole_grad.abs().sum() > 0
    assert_close(split, whole)
    assert_close(split_grad, whole_grad)


# ------------------------------------------------------------------ a user's parts, registered from their module

USER_CASES = {
    "advantage": {"group_median": [[1.0, 0.0, 0.0, 1.0], [0.0] * 4]},  # r - lower median: of 1, 0, 0, 1: 0; of 2s: 2
    "aggregation": {"seq_mean_token_sqrt_mean": (6 / 3**0.5 + 9 / 2**0.5) / 2},  # (6 / sqrt 3 + 9 / sqrt 2) / 2 = 4.914031
}


def test_the_parts_a_users_module_registers_pass_every_check_of_their_kind(user_parts, monkeypatch):
    """``tests/conformance/user_parts.py`` registers an advantage and an aggregation on import; named by
    import path, each is checked as a shipped part is: its hand case, and the aggregation's micro-batch
    invariance alone and under every surrogate."""
    assert ADVANTAGES.resolve(f"{user_parts}.group_median") == "group_median"
    assert AGGREGATIONS.resolve(f"{user_parts}.seq_mean_token_sqrt_mean") == "seq_mean_token_sqrt_mean"
    for kind, cases in USER_CASES.items():
        for name, case in cases.items():
            monkeypatch.setitem(CASES[kind], name, case)
    test_every_hand_case_is_of_a_registered_part()
    test_each_advantage_against_its_hand_case("group_median")
    test_each_aggregation_against_its_hand_case("seq_mean_token_sqrt_mean")
    test_each_aggregation_summed_over_rows_with_the_batch_counts_is_the_batchs("seq_mean_token_sqrt_mean")
    for surrogate in SURROGATES:
        test_each_surrogate_under_each_aggregation_gives_the_batchs_loss_and_gradient_in_any_micro_batches(
            surrogate, "seq_mean_token_sqrt_mean"
        )
