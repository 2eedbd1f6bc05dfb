import csv
import math

import numpy as np
import pytest

from grpo_lightning.report import (
    Run,
    Series,
    aligned_curve,
    bootstrap_ci,
    build_report,
    discover_cells,
    holm,
    load_run,
    main,
    mean_ci,
    welch_dof,
    welch_test,
    wilson_interval,
)

# Final val/accuracy of the synthetic sweep (tests/report/conftest.py), three seeds per variant.
FINAL_ACCURACY = {"grpo": [0.5, 0.6, 0.7], "dapo": [0.2, 0.3, 0.4]}
INITIAL_ACCURACY = 0.1


def test_mean_ci_by_hand():
    # mean 0.6, s = 0.1, se = 0.1 / sqrt(3) = 0.0577350
    # t(0.975, 2) = (2p - 1) / sqrt(2 p (1 - p)) at p = 0.975 = 0.95 / sqrt(0.04875) = 4.3026527
    # half width = 4.3026527 * 0.0577350 = 0.2484138
    mean, low, high = mean_ci([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6)
    assert low == pytest.approx(0.6 - 0.2484138, abs=1e-6)
    assert high == pytest.approx(0.6 + 0.2484138, abs=1e-6)
    # 90%: t(0.95, 2) = 0.9 / sqrt(2 * 0.95 * 0.05) = 2.9199856; half = 0.1685851
    assert mean_ci([0.5, 0.6, 0.7], confidence=0.90)[1] == pytest.approx(0.6 - 0.1685851, abs=1e-6)
    # n = 4: values 1, 2, 3, 6: mean 3, s^2 = (4 + 1 + 0 + 9) / 3 = 14 / 3, se = sqrt(14 / 12) = 1.0801234
    # t(0.975, 3) = 3.1824463 (table value); half = 3.4374349
    assert mean_ci([1, 2, 3, 6])[2] == pytest.approx(3 + 3.4374349, abs=1e-6)
    one = mean_ci([0.4])
    assert one[0] == 0.4 and math.isnan(one[1]) and math.isnan(one[2])
    assert all(math.isnan(v) for v in mean_ci([]))


def test_bootstrap_interval_by_hand():
    # two values: resampled means 0 (p 1/4), 0.5 (p 1/2), 1 (p 1/4); 2.5% and 97.5% quantiles 0 and 1
    assert bootstrap_ci([0.0, 1.0]) == (0.5, 0.0, 1.0)
    # three values: all three draws the lowest with p 1/27 = 3.7% > 2.5%: the interval is the range
    assert bootstrap_ci([0.5, 0.6, 0.7]) == pytest.approx((0.6, 0.5, 0.7))
    assert bootstrap_ci([0.3, 0.3, 0.3]) == pytest.approx((0.3, 0.3, 0.3))
    one = bootstrap_ci([0.4])
    assert one[0] == 0.4 and math.isnan(one[1]) and math.isnan(one[2])
    assert all(math.isnan(v) for v in bootstrap_ci([]))


def test_bootstrap_interval_stays_inside_the_data_and_the_bounds():
    # skewed accuracies: Student t gives 0.2 -+ 2.776 * 0.4472 / sqrt(5) = [-0.355, 0.755], below 0
    values = [0.0, 0.0, 0.0, 0.0, 1.0]
    assert mean_ci(values)[1] < 0
    mean, low, high = bootstrap_ci(values, bounds=(0.0, 1.0))
    assert mean == pytest.approx(0.2) and 0.0 <= low <= mean <= high <= 1.0
    assert bootstrap_ci(values, bounds=(0.0, 1.0)) == (mean, low, high)  # a fixed generator seed
    seconds = [3.0, 5.0, 100.0, 4.0]  # one slow outlier: the interval stays within [3, 100]
    mean, low, high = bootstrap_ci(seconds, bounds=(0.0, math.inf))
    assert 3.0 <= low < mean < high <= 100.0
    # five distinct values: the interval lies strictly inside their range (p of all-lowest = 1/3125)
    mean, low, high = bootstrap_ci([1, 2, 3, 4, 5])
    assert 1 < low < 3 < high < 5
    # the bounds of the quantity clip the interval
    assert bootstrap_ci([0.5, 0.6, 0.7], bounds=(0.55, 1.0))[1] == pytest.approx(0.55)


def test_wilson_interval_by_hand():
    # 7 of 10, z = 1.959964 (z^2 = 3.841459): centre (0.7 + 3.841459 / 20) / (1 + 0.3841459) = 0.644491;
    # half z * sqrt(0.21 / 10 + 3.841459 / 400) / 1.3841459 = 1.959964 * 0.1749390 / 1.3841459 = 0.247715
    low, high = wilson_interval(7, 10)
    assert low == pytest.approx(0.644491 - 0.247715, abs=1e-5) and high == pytest.approx(0.644491 + 0.247715, abs=1e-5)
    # 0 of 10: low 0, high z^2/n / (1 + z^2/n) = 0.3841459 / 1.3841459 = 0.277533
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson_interval(10, 10) == pytest.approx((1 - 0.277533, 1.0), abs=1e-6)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_welch_by_hand():
    # a = 0.5, 0.6, 0.7; b = 0.2, 0.3, 0.4: both s^2 = 0.01, n = 3
    # t = 0.3 / sqrt(0.01/3 + 0.01/3) = 0.3 / 0.0816497 = 3.6742346 (t^2 = 13.5)
    # dof = (2 * 0.01/3)^2 / (2 * (0.01/3)^2 / 2) = 4
    # for 4 dof the two-sided p is 1 - t (t^2 + 6) / (t^2 + 4)^(3/2) = 1 - 3.6742346 * 19.5 / 17.5^1.5
    #   = 1 - 71.647575 / 73.207325 = 0.0213116
    t, p = welch_test([0.5, 0.6, 0.7], [0.2, 0.3, 0.4])
    assert t == pytest.approx(3.6742346, abs=1e-6)
    assert p == pytest.approx(0.0213116, abs=1e-6)
    assert welch_dof([0.5, 0.6, 0.7], [0.2, 0.3, 0.4]) == pytest.approx(4.0)
    # unequal variances and sizes: a = 1, 2, 3 (s^2 = 1), b = 0, 0, 4, 4 (s^2 = 16/3)
    # t = (2 - 2) / ... = 0; swap b = 1, 1, 5, 5 (mean 3, s^2 = 16/3): t = -1 / sqrt(1/3 + 4/3) = -0.7745967
    # dof = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 3) = 2.7777778 / 0.6481481 = 4.2857143
    t, _ = welch_test([1, 2, 3], [1, 1, 5, 5])
    assert t == pytest.approx(-0.7745967, abs=1e-6)
    assert welch_dof([1, 2, 3], [1, 1, 5, 5]) == pytest.approx(4.2857143, abs=1e-6)
    assert all(math.isnan(v) for v in welch_test([0.5], [0.2, 0.3]))
    assert all(math.isnan(v) for v in welch_test([0.5, 0.5], [0.2, 0.2]))


def test_holm():
    # sorted 0.01, 0.02, 0.04 -> 3 * 0.01, max(0.03, 2 * 0.02), max(0.04, 1 * 0.04)
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    adjusted = holm([math.nan, 0.5])
    assert math.isnan(adjusted[0]) and adjusted[1] == pytest.approx(0.5)


def test_aligned_curve_by_hand():
    def run(steps, values):
        steps = np.asarray(steps)
        return Run(None, {"m": Series(steps, np.asarray(values, dtype=float), steps * 1.0)}, t0=0.0)

    # x = steps + 1 (no update log): run a at 1, 2, 3 -> 0, 1, 2; run b at 1, 3 -> 2, 4 (3 at x = 2 by interpolation)
    # grid 1, 2, 3; mean (0+2)/2, (1+3)/2, (2+4)/2; std (ddof 1) of two values d apart is d / sqrt(2) = 1.4142136
    x, mean, std, n = aligned_curve([run([0, 1, 2], [0, 1, 2]), run([0, 2], [2, 4])], "m", "step")
    assert n == 2 and x.tolist() == [1, 2, 3] and mean.tolist() == [1, 2, 3]
    assert std.tolist() == pytest.approx([1.4142136] * 3)
    # ranges that only partly overlap: the common range 2..3 only
    x, mean, _, _ = aligned_curve([run([0, 1, 2], [0, 1, 2]), run([1, 2, 3], [5, 6, 7])], "m", "step")
    assert x.tolist() == [2, 3] and mean.tolist() == [3, 4]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cell_writer):
    root = tmp_path_factory.mktemp("sweep") / "synthetic"
    for variant, finals in FINAL_ACCURACY.items():
        for seed, final in enumerate(finals):
            cell_writer(root, variant, seed, final)
    cell_writer(root, "grpo", 3, 0.0, finished=False)  # unfinished: left out
    return root


def test_load_run_axes(sweep):
    run = load_run(sweep / "grpo-seed1")
    assert run.initial == {"val/accuracy": pytest.approx(INITIAL_ACCURACY)}
    x, y = run.axis("val/accuracy", "step")
    assert x.tolist() == [0.0, 3.0, 6.0] and y.tolist() == pytest.approx([0.1, 0.35, 0.6])
    x, _ = run.axis("val/accuracy", "tokens")
    assert x.tolist() == [0.0, 100 + 110 + 120, 100 + 110 + 120 + 130 + 140 + 150]
    x, _ = run.axis("reward", "time")
    assert x.tolist() == pytest.approx([2.0, 4.0, 6.0, 8.0, 10.0, 12.0])  # the first step started at T0
    assert run.train_time_s == pytest.approx(12.0)


def test_logs_repeated_without_an_update_are_dropped(tmp_path, cell_writer):
    directory = cell_writer(tmp_path, "dapo", 0, 0.4, stale=(1, 4))
    run = load_run(directory)
    assert run.update_steps.tolist() == [0, 2, 3, 5, 6, 7]
    x, y = run.axis("reward", "step")
    assert x.tolist() == [1, 2, 3, 4, 5, 6] and len(set(y.tolist())) == 6
    x, _ = run.axis("val/accuracy", "step")
    assert x.tolist() == [0, 2, 6]  # TensorBoard steps 2 and 7: after 2 and 6 updates
    assert run.axis("perf/generated_tokens", "tokens")[0].tolist() == run.axis("perf/generated_tokens", "step")[1].tolist()


def test_discover_cells(sweep):
    cells = discover_cells(sweep)
    assert [c.name for c in cells if not c.finished] == ["grpo-seed3"]
    assert {c.arm for c in cells} == {"grpo", "dapo"}


def test_report_sections_and_numbers(sweep, tmp_path):
    assert main([str(sweep), "--output", str(tmp_path / "reports" / "synthetic")]) is None  # exit status 0
    target = tmp_path / "reports" / "synthetic"
    md = (target / "report.md").read_text()
    html = (target / "report.html").read_text()
    for section in [
        "# Ablation report: synthetic",
        "## Summary",
        "## Runs",
        "## Configuration",
        "## Final metrics",
        "## Pairwise comparison on final val/accuracy",
        "## Learning curves",
        "## Method",
        "## Provenance",
    ]:
        assert section in md
    for title in ["val/accuracy", "reward", "kl", "entropy", "completions/mean_length", "clip_ratio", "frac_reward_zero_std"]:
        assert f"### {title}\n" in md
    pngs = sorted(p.name for p in target.glob("*.png"))
    assert pngs == sorted(
        f"curves_{s}.png"
        for s in ["val_accuracy", "reward", "kl", "entropy", "mean_length", "clip_ratio", "frac_reward_zero_std"]
    )
    for png in pngs:
        assert f"]({png})" in md and f'src="{png}"' in html

    # grpo first (variant order), the unfinished seed 3 left out
    assert "| grpo (n=3) | dapo (n=3) |" in md.replace("metric | ", "")
    assert "grpo-seed3" in md and "unfinished" in md
    # configuration: what differs, with per-run paths and the seed left out
    assert "| `model.class_path` | variants.GRPO | variants.DAPO |" in md
    assert "| `model.init_args.clip_eps_high` | 0.2 | 0.28 |" in md
    assert "seed_everything" not in md and "save_dir" not in md
    assert "`model.init_args.group_size` | 4 |" in md  # shared

    # Percentile bootstrap over three seeds: a resample is all-lowest with probability 1/27 > 2.5%, so the
    # 2.5% quantile of the resampled means is the lowest seed, the 97.5% quantile the highest.
    assert "| val/accuracy | **0.6 [0.5, 0.7]** | 0.3 [0.2, 0.4] |" in md
    assert "| val/accuracy before training | 0.1 [0.1, 0.1] | 0.1 [0.1, 0.1] |" in md
    assert "| reward | **0.51 [0.5, 0.52]** |" in md  # 0.5 + 0.01 * seed
    assert "| generated tokens | 750 [750, 750] | 750 [750, 750] |" in md  # equal: nobody in bold
    # Welch on final val/accuracy: t = 3.6742346, dof 4, p = 0.0213116 (see test_welch_by_hand)
    assert "| grpo | dapo | 3 | 3 | 0.3 | 3.674 | 4 | 0.0213 | 0.0213 | significant at 0.05 |" in md
    assert ("**grpo** has the highest final val/accuracy (0.6), ahead of the runner-up **dapo** (0.3; significant: "
            "Welch p = 0.0213 after Holm's correction).") in md  # fmt: skip
    assert "**grpo** and **dapo** tie for the fewest generated tokens (750, 750)" in md
    # every grpo step takes 2 s, every dapo step 1 s: no variance, no test, but intervals [12, 12] and [6, 6]
    assert ("**dapo** has the shortest training wall-clock (6 s), ahead of the runner-up **grpo** (12 s; the "
            "intervals do not overlap; no test possible).") in md  # fmt: skip
    assert "Before training, val/accuracy was 0.1." in md
    assert "No `provenance.json` in the sweep folder" in md
    assert "<table>" in html and "<strong>0.6 [0.5, 0.7]</strong>" in html
    assert '<a href="final_metrics.csv">final_metrics.csv</a>' in html


def test_final_metrics_csv_and_latex(sweep, tmp_path):
    target = build_report(sweep, tmp_path / "out", name="synthetic")
    md = (target / "report.md").read_text()
    assert "[final_metrics.csv](final_metrics.csv)" in md and "[final_metrics.tex](final_metrics.tex)" in md
    rows = list(csv.DictReader((target / "final_metrics.csv").open()))
    accuracy = {r["arm"]: r for r in rows if r["metric"] == "val/accuracy"}
    assert accuracy["grpo"] == {"metric": "val/accuracy", "arm": "grpo", "n": "3", "mean": "0.6", "ci_low": "0.5",
                                "ci_high": "0.7", "interval": "percentile bootstrap over seeds"}  # fmt: skip
    tex = (target / "final_metrics.tex").read_text()
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    assert r"Metric & grpo ($n=3$) & dapo ($n=3$) \\" in tex
    assert r"val/accuracy & \textbf{0.6 [0.5, 0.7]} & 0.3 [0.2, 0.4] \\" in tex
    assert r"frac\_reward\_zero\_std" in tex and r"\label{tab:synthetic-final-metrics}" in tex


def test_report_is_byte_identical(sweep, tmp_path):
    first = build_report(sweep, tmp_path / "a", name="same")
    files = sorted(p.name for p in first.iterdir())
    assert {"report.md", "report.html", "final_metrics.csv", "final_metrics.tex"} <= set(files)
    before = {name: (first / name).read_bytes() for name in files}
    again = build_report(sweep, tmp_path / "a", name="same")
    other = build_report(sweep, tmp_path / "b", name="same")
    for name in files:
        assert (again / name).read_bytes() == before[name], name
        assert (other / name).read_bytes() == before[name], name
    png = before["curves_reward.png"]
    assert png.startswith(b"\x89PNG") and b"matplotlib" not in png


def test_the_report_goes_into_the_sweep_folder_unless_told(tmp_path, cell_writer):
    root = tmp_path / "runs" / "ablation" / "mine"
    cell_writer(root, "grpo", 0, 0.5)
    cell_writer(root, "dapo", 0, 0.4)
    main([str(root)])
    assert (root / "report" / "report.md").is_file() and "# Ablation report: mine" in (root / "report" / "report.md").read_text()
    main([str(root)])  # the report folder is not taken for a cell
    assert "2 finished runs" in (root / "report" / "report.md").read_text()
    main([str(root), "--output", str(tmp_path / "reports" / "mine")])
    assert (tmp_path / "reports" / "mine" / "final_metrics.tex").is_file()
    with pytest.warns(FutureWarning, match="--output"):
        main([str(root), "--out", str(tmp_path / "old"), "--name", "named"])
    assert (tmp_path / "old" / "named" / "report.md").is_file()


def test_small_n_is_reported(tmp_path, cell_writer):
    root = tmp_path / "tiny"
    cell_writer(root, "grpo", 0, 0.5)
    cell_writer(root, "grpo", 1, 0.7)
    cell_writer(root, "rloo", 0, 0.4)
    target = build_report(root, tmp_path / "out")
    md = (target / "report.md").read_text()
    assert "# Ablation report: tiny" in md
    assert "n too small for a test (needs at least 2 seeds per arm)" in md
    # two seeds: resamples (0.5, 0.5) and (0.7, 0.7) have probability 1/4 each, so the interval is [0.5, 0.7]
    assert "| val/accuracy | 0.6 [0.5, 0.7] | 0.4 |" in md  # a tie (see below): nobody in bold
    assert ("**grpo** and **rloo** tie for the highest final val/accuracy (0.6, 0.4): no difference to **grpo** is "
            "significant after Holm's correction or larger than the intervals (an arm with one seed has no "
            "interval and no test).") in md  # fmt: skip


def test_cli_errors(tmp_path):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
    with pytest.raises(FileNotFoundError):
        main([str(tmp_path), "--output", str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--out", str(tmp_path), "--output", str(tmp_path / "out")])


def test_a_wide_sweep_ranks_the_arms_and_groups_the_curves(tmp_path, cell_writer):
    # Nine arms (above WIDE = 6), three seeds each; arm k ends at 0.1 * k (+- 0.01), so the ranking is k = 9 .. 1.
    root = tmp_path / "wide"
    for k in range(1, 10):
        for seed in range(3):
            cell_writer(root, "grpo", seed, 0.1 * k + 0.01 * (seed - 1), stem=f"-arm{k}")
    target = build_report(root, tmp_path / "out", name="wide")
    text = (target / "report.md").read_text()
    final = text.split("## Final metrics")[1].split("## Pairwise")[0]
    ranks = [
        line.split("|")[2].strip()
        for line in final.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    ]
    assert ranks == [f"grpo-arm{k} (n=3)" for k in range(9, 0, -1)]
    # 36 pairs; neighbours 0.1 apart with a std of 0.01 differ significantly, so the significant ones are shown
    # and all 36 are in the collapsed section.
    assert "pairs that differ significantly after Holm's correction" in text and "All 36 pairs" in text
    # Curves in groups of four, best first: 3 files per curve.
    assert sorted(p.name for p in target.glob("curves_val_accuracy_*.png")) == [f"curves_val_accuracy_{i}.png" for i in (1, 2, 3)]
    assert "val/accuracy: grpo-arm9, grpo-arm8, grpo-arm7, grpo-arm6" in text
    # nine arms with equal token counts: one tie, given as a count and a range
    assert "All 9 arms tie for the fewest generated tokens (from 750 to 750)" in text
