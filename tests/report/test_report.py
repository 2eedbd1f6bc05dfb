import csv
import math

import numpy as np
import pytest

from grpo_lightning.ablation.runs import Run, Series, load_run
from grpo_lightning.report import (
    aligned_curve,
    build_report,
    discover_cells,
    holm,
    main,
    welch_dof,
    welch_test,
    wilson_interval,
)

# Final val/accuracy of the synthetic sweep (tests/report/conftest.py), three seeds per variant.
FINAL_ACCURACY = {"grpo": [0.5, 0.6, 0.7], "dapo": [0.2, 0.35, 0.3]}
INITIAL_ACCURACY = 0.1


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
        "## Seeds",
        "## Effects against the baseline (grpo)",
        "## Effects at matched compute",
        "## Learning curves",
        "## Method",
        "## Provenance",
    ]:
        assert section in md
    for title in ["val/accuracy", "reward", "kl", "entropy", "completions/mean_length", "clip_ratio", "frac_reward_zero_std"]:
        assert f"### {title}\n" in md
    pngs = sorted(p.name for p in target.glob("*.png"))
    assert pngs == sorted(
        ["final_val_accuracy.png", "budgets_val_accuracy.png"] + [f"curves_{s}.png"
         for s in ["val_accuracy", "reward", "kl", "entropy", "mean_length", "clip_ratio", "frac_reward_zero_std"]]
    )  # fmt: skip
    for png in pngs:
        assert f"]({png})" in md and f'src="{png}"' in html

    # grpo first (variant order), the unfinished seed 3 left out and counted among grpo's seeds
    assert "| grpo (n=3 of 4; seed 3 unfinished (no DONE marker)) | dapo (n=3) |" in md.replace("metric | ", "")
    assert "Seeds left out: **grpo** seed 3 unfinished (no DONE marker): in none of its numbers." in md
    assert "grpo-seed3" in md and "unfinished" in md
    # configuration: what differs, with per-run paths and the seed left out
    assert "| `model.class_path` | grpo_lightning.variants.GRPO | grpo_lightning.variants.DAPO |" in md
    assert "| `model.init_args.loss.clip_eps_high` | 0.2 | 0.28 |" in md
    assert "seed_everything" not in md and "save_dir" not in md
    assert "`model.init_args.sampling.group_size` | 4 |" in md  # shared

    # Student t over three seeds: 0.6 -+ 4.3026527 * 0.1 / sqrt(3) = 0.6 -+ 0.2484138;
    # dapo 0.2, 0.35, 0.3: s = 0.0763763, 0.2833333 -+ 0.1897292
    assert "| val/accuracy | 0.6 [0.3516, 0.8484] | 0.2833 [0.0936, 0.4731] |" in md
    assert "| val/accuracy before training | 0.1 (all seeds equal) | 0.1 (all seeds equal) |" in md
    # reward 0.1 * step + 0.01 * seed over 6 steps: the mean of the last 10 (all 6) is 0.25 + 0.01 * seed
    assert "| reward | 0.26 [0.2352, 0.2848] |" in md
    assert "| generated tokens | 750 (all seeds equal) | 750 (all seeds equal) |" in md
    # paired: dapo - grpo = -0.3, -0.25, -0.4 at seeds 0, 1, 2: mean -0.3166667, s_d = 0.0763763,
    # t = -0.3166667 / (0.0763763 / sqrt(3)) = -7.181325 with 2 dof, p = 0.0188442 (scipy.stats.ttest_rel);
    # d_z = -4.146; interval -0.3166667 -+ 4.3026527 * 0.0440959 = [-0.5064, -0.1269]
    # three pairs of the four seeds either arm ran: grpo's seed 3 is unfinished and dapo never ran it
    assert ("| **dapo** | 3 of 4 (seed 3: not run by dapo; grpo unfinished (no DONE marker)) | -0.3167 [-0.5064, -0.1269] "
            "| -4.15 | 0.0188 | 0.0188 |") in md  # fmt: skip
    assert "**dapo** (3 pairs of 4 seeds) -0.3167 [-0.5064, -0.1269], worse (Holm p = 0.0188); 1x the tokens" in md
    # equal token counts at every seed; every grpo step takes 2 s, every dapo step 1 s: no spread, no test
    assert "On generated tokens (grpo 750): **dapo** (3 pairs of 4 seeds) identical at every seed." in md
    assert "On training wall-clock (grpo 12 s): **dapo** (3 pairs of 4 seeds) no test: the difference is -6 at every seed" in md
    assert "tie" not in md.split("## Summary")[1].split("## Runs")[0]
    assert "Before training, val/accuracy was 0.1 on average." in md
    assert "no `provenance.json`: the code these runs used is unknown" in md
    assert "<table>" in html and "0.6 [0.3516, 0.8484]" in html
    assert '<a href="final_metrics.csv">final_metrics.csv</a>' in html


def test_final_metrics_csv_and_latex(sweep, tmp_path):
    target = build_report(sweep, tmp_path / "out", name="synthetic")
    md = (target / "report.md").read_text()
    assert "[final_metrics.csv](final_metrics.csv)" in md and "[final_metrics.tex](final_metrics.tex)" in md
    rows = list(csv.DictReader((target / "final_metrics.csv").open()))
    accuracy = {r["arm"]: r for r in rows if r["metric"] == "val/accuracy"}
    assert accuracy["grpo"] == {"metric": "val/accuracy", "arm": "grpo", "n": "3", "mean": "0.6", "ci_low": "0.351586",
                                "ci_high": "0.848414", "interval": "Student t over seeds"}  # fmt: skip
    tex = (target / "final_metrics.tex").read_text()
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    assert r"Metric & grpo ($n=3$) & dapo ($n=3$) \\" in tex
    assert r"val/accuracy & 0.6 [0.3516, 0.8484] & 0.2833 [0.0936, 0.4731] \\" in tex
    assert r"\textbf" not in tex and "Student-t" in tex
    assert r"frac\_reward\_zero\_std" in tex and r"\label{tab:synthetic-final-metrics}" in tex


def test_report_is_byte_identical(sweep, tmp_path):
    first = build_report(sweep, tmp_path / "a", name="same")
    files = sorted(p.name for p in first.iterdir() if p.is_file() and p.name != "REGENERATE")
    assert {"report.md", "report.html", "final_metrics.csv", "final_metrics.tex"} <= set(files)
    before = {name: (first / name).read_bytes() for name in files}
    again = build_report(sweep, tmp_path / "a", name="same")
    other = build_report(sweep, tmp_path / "b", name="same")
    rebuilt = build_report(first / "data", tmp_path / "c")  # from the data folder beside the report
    for name in files:
        assert (again / name).read_bytes() == before[name], name
        assert (other / name).read_bytes() == before[name], name
        assert (rebuilt / name).read_bytes() == before[name], name
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


def test_an_abbreviated_option_is_refused(tmp_path, cell_writer):
    root = tmp_path / "mine"
    cell_writer(root, "grpo", 0, 0.5)
    with pytest.raises(SystemExit):
        main([str(root), "--out", str(tmp_path / "elsewhere")])
    assert not (tmp_path / "elsewhere").exists()


def test_small_n_is_reported(tmp_path, cell_writer):
    root = tmp_path / "tiny"
    cell_writer(root, "grpo", 0, 0.5)
    cell_writer(root, "grpo", 1, 0.7)
    cell_writer(root, "rloo", 0, 0.4)
    target = build_report(root, tmp_path / "out")
    md = (target / "report.md").read_text()
    assert "# Ablation report: tiny" in md
    # two seeds: 0.6 -+ t(0.975, 1) 12.706 * 0.1 = [-0.67, 1.87], clipped to the range of an accuracy;
    # one seed: no interval
    assert "| val/accuracy | 0.6 [0, 1] | 0.4 |" in md
    assert "**rloo** (1 pair of 2 seeds) -0.1, too few seeds (n=1; 3 needed)" in md
    assert "tie" not in md.split("## Summary")[1].split("## Runs")[0]


def test_cli_errors(tmp_path):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
    with pytest.raises(FileNotFoundError):
        main([str(tmp_path), "--output", str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--out", str(tmp_path), "--output", str(tmp_path / "out")])


def test_the_cli_refuses_an_equivalence_margin_that_is_not_positive(tmp_path, capsys):
    for margin in ("0", "-0.02", "nan"):
        with pytest.raises(SystemExit):
            main([str(tmp_path), "--equivalence-margin", margin])
        assert "--equivalence-margin must be a positive number, e.g. 0.02" in capsys.readouterr().err


def test_the_cli_refuses_a_target_mde_that_is_not_positive(tmp_path, capsys):
    for target in ("0", "-0.04", "inf"):
        with pytest.raises(SystemExit):
            main([str(tmp_path), "--target-mde", target])
        assert "--target-mde must be a positive number, e.g. 0.04" in capsys.readouterr().err


def test_a_wide_sweep_ranks_the_arms_and_groups_the_curves(tmp_path, cell_writer):
    # Nine arms (above WIDE = 6), three seeds each; arm k ends near 0.1 * k, so the order is k = 9 .. 1.
    root = tmp_path / "wide"
    for k in range(1, 10):
        for seed in range(3):
            cell_writer(root, "grpo", seed, 0.1 * k + 0.01 * (seed - 1) * k / 3, stem=f"-arm{k}")
    target = build_report(root, tmp_path / "out", name="wide")
    text = (target / "report.md").read_text()
    final = text.split("## Final metrics")[1].split("## Effects")[0]
    ranks = [
        line.split("|")[2].strip()
        for line in final.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    ]
    assert ranks == [f"grpo-arm{k} (n=3)" for k in range(9, 0, -1)]
    # every arm against the baseline, the first arm (grpo-arm1): 8 comparisons, all far above the MDE
    effects = text.split("## Effects against the baseline (grpo-arm1)")[1].split("\n## ")[0]
    assert effects.count("| better |") == 8
    # Curves in groups of four, each with the baseline, the others best first: 3 files per curve.
    assert sorted(p.name for p in target.glob("curves_val_accuracy_*.png")) == [f"curves_val_accuracy_{i}.png" for i in (1, 2, 3)]
    assert "val/accuracy: grpo-arm1, grpo-arm9, grpo-arm8, grpo-arm7" in text
    assert "val/accuracy: grpo-arm1, grpo-arm3, grpo-arm2" in text
