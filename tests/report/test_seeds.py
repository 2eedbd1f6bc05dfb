"""The seeds behind every number of the report: a diverged seed is counted and named wherever it
is missing, a seed that two cells of one arm ran is refused, and no comparison over fewer than
three paired seeds gets a verdict."""

import math
import shutil

import pytest

from grpo_lightning.errors import ConfigError
from grpo_lightning.report import build_report, main

SEEDS = range(5)
DIVERGED_SEED = 3


@pytest.fixture(scope="module")
def diverged_report(tmp_path_factory, cell_writer):
    """grpo and dapo over five seeds; grpo's seed 3 diverged at step 4 (its training scalars NaN from there)."""
    root = tmp_path_factory.mktemp("diverged") / "sweep"
    for variant, accuracy in (("grpo", 0.3), ("dapo", 0.4)):
        for seed in SEEDS:
            diverged = 4 if (variant, seed) == ("grpo", DIVERGED_SEED) else None
            cell_writer(root, variant, seed, accuracy + 0.01 * seed, diverged_from=diverged)
    return (build_report(root, root.parent / "report") / "report.md").read_text()


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}")[1].split("\n## ")[0]


def test_a_diverged_seed_is_counted_and_named_in_the_final_metrics(diverged_report):
    # grpo's reward at seed s is 0.25 + 0.01 s; without seed 3 the mean of seeds 0, 1, 2, 4 is 0.2675
    finals = section(diverged_report, "Final metrics")
    assert "| reward | 0.2675 [0.2403, 0.2947] (n=4 of 5; seed 3 diverged (final reward non-finite)) |" in finals
    assert "| metric | grpo (n=5) | dapo (n=5) |" in finals  # val/accuracy and the totals have all five


def test_the_effect_pairs_the_seeds_both_arms_have_and_says_how_many(diverged_report):
    # dapo's reward is 0.125 + 0.01 s, grpo's 0.25 + 0.01 s: d = -0.125 at the 4 seeds both have (nan with seed 3)
    effects = section(diverged_report, "Effects against the baseline (grpo)")
    assert "| **dapo** | 4 of 5 (seed 3: grpo diverged (final training reward non-finite)) | -0.125 [" in effects
    assert "**dapo** (4 pairs of 5 seeds) " in section(diverged_report, "Summary")


def test_the_summary_names_the_seeds_left_out_and_why(diverged_report):
    summary = section(diverged_report, "Summary")
    assert "Seeds left out: **grpo** seed 3 diverged (final reward, " in summary


def test_a_seed_run_twice_in_one_arm_is_refused_in_one_line(tmp_path, cell_writer, capsys):
    sweep = tmp_path / "sweep"
    for seed in (0, 1, 2):
        cell_writer(sweep, "grpo", seed, 0.3)
    shutil.copytree(sweep / "grpo-seed1", sweep / "grpo-seed1-again")
    with pytest.raises(ConfigError, match=r"arm 'grpo' has seed 1 twice, in .*grpo-seed1 and .*grpo-seed1-again; remove one"):
        build_report(sweep, tmp_path / "report")
    with pytest.raises(SystemExit) as exit_info:
        main([str(sweep), "--output", str(tmp_path / "report")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and error.count("\n") == 1 and "rerun the sweep into a fresh folder" in error


def test_two_seeds_give_numbers_but_no_verdict(tmp_path, cell_writer):
    """dapo ends 0.6 and 0.64 above grpo: a paired t-test over the 2 seeds gives p = 0.02, yet a
    test on one degree of freedom is no ground for "better"."""
    sweep = tmp_path / "sweep"
    for variant, finals in (("grpo", (0.3, 0.31)), ("dapo", (0.9, 0.95))):
        for seed, accuracy in enumerate(finals):
            cell_writer(sweep, variant, seed, accuracy)
    text = (build_report(sweep, tmp_path / "report") / "report.md").read_text()
    effects, summary = section(text, "Effects against the baseline (grpo)"), section(text, "Summary")
    assert "| **dapo** | 2 | +0.62 [0.3659, 0.8741] |" in effects
    assert "| too few seeds (n=2; 3 needed) |" in effects
    assert "**dapo** +0.62 [0.3659, 0.8741], too few seeds (n=2; 3 needed)" in summary
    rows = [line for line in effects.splitlines() if line.startswith("| **dapo**")]
    assert len(rows) == 5 and not any(word in " ".join(rows) + summary for word in ("better", "worse", "Holm p ="))


def test_a_collapsed_seed_is_named_beside_the_median_and_iqm(tmp_path, cell_writer):
    """dapo's seed 4 ends at 0.02 against 0.40-0.43: its residual among the other four (mean 0.415,
    s = 0.0129) is 26, beyond t(1 - 0.05 / 10, 3) = 5.84; grpo's 0.30-0.34 are one spread."""
    sweep = tmp_path / "sweep"
    for seed in SEEDS:
        cell_writer(sweep, "grpo", seed, 0.30 + 0.01 * seed)
        cell_writer(sweep, "dapo", seed, (0.40, 0.41, 0.42, 0.43, 0.02)[seed])
    target = build_report(sweep, tmp_path / "report")
    text = (target / "report.md").read_text()
    seeds = section(text, "Seeds")
    # dapo: mean 0.336; sorted 0.02 0.40 0.41 0.42 0.43, median 0.41, IQM (one dropped from each end) 0.41
    assert "| **dapo** | 5 | 0.336 [" in seeds and "| 0.41 | 0.41 | 0: 0.4, 1: 0.41, 2: 0.42, 3: 0.43, 4: 0.02 (far) |" in seeds
    assert "| **grpo** | 5 | 0.32 [0.3004, 0.3396] | 0.32 | 0.32 | 0: 0.3, 1: 0.31, 2: 0.32, 3: 0.33, 4: 0.34 |" in seeds
    warning = ("**Warning:** **dapo** seed 4 ended val/accuracy 0.02, far below its other seeds (0.4, 0.41, 0.42, 0.43): "
               "a collapsed run? Its seeds are not spread around one value")  # fmt: skip
    assert warning in seeds and warning in section(text, "Summary") and "**grpo** seed" not in text
    effects = section(text, "Effects against the baseline (grpo)")
    assert "Seeds far from their arm's others (see Seeds): **dapo** seed 4." in effects
    assert (target / "final_val_accuracy.png").is_file() and "](final_val_accuracy.png)" in seeds


def test_several_collapsed_seeds_that_hide_each_other_are_named_by_the_check_of_the_whole_arm(tmp_path, cell_writer):
    """dapo's seeds 7-9 end at 0.05-0.07 against 0.40-0.46: each widens the others' spread, so no one of them is
    far by the test of one seed (seed 7's residual is about 1.6 against t(1 - 0.05 / 20, 8) = 4.2), but Shapiro
    and Wilk's test of the ten rejects normal seeds; grpo's evenly spread 0.30-0.39 pass it."""
    sweep = tmp_path / "sweep"
    dapo = (0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.46, 0.05, 0.06, 0.07)
    for seed in range(10):
        cell_writer(sweep, "grpo", seed, 0.30 + 0.01 * seed)
        cell_writer(sweep, "dapo", seed, dapo[seed])
    text = (build_report(sweep, tmp_path / "report") / "report.md").read_text()
    seeds = section(text, "Seeds")
    assert "(far)" not in seeds  # the check of one seed finds none
    warning = ("**Warning:** **dapo**'s seeds are not spread as normal ones would be (Shapiro-Wilk p = 0.00")
    ends = "over 10 seeds; lowest seed 7: 0.05, seed 8: 0.06, seed 9: 0.07; highest seed 6: 0.46, seed 5: 0.45, seed 4: 0.44)"
    assert warning in seeds and ends in seeds and warning in section(text, "Summary") and "**grpo**'s seeds" not in text


def test_the_check_of_a_whole_arm_needs_eight_seeds_with_a_spread():
    from grpo_lightning.report.paired import normal_spread_p

    assert math.isnan(normal_spread_p([0.4, 0.41, 0.42, 0.43, 0.44, 0.05, 0.06]))  # seven seeds: no check
    assert math.isnan(normal_spread_p([0.4] * 8)) and math.isnan(normal_spread_p([0.4] * 7 + [math.nan]))
    assert normal_spread_p([0.30 + 0.01 * s for s in range(10)]) > 0.5  # evenly spread: no sign against normal
    assert normal_spread_p([0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.46, 0.05, 0.06, 0.07]) < 0.01
