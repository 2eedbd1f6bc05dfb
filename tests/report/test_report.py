import json
import math

import numpy as np
import pytest
import yaml

from grpo_lightning.report import (
    Run,
    Series,
    aligned_curve,
    build_report,
    discover_cells,
    holm,
    load_run,
    main,
    mean_ci,
    welch_dof,
    welch_test,
)

# Final val/accuracy of the synthetic sweep, three seeds per variant.
FINAL_ACCURACY = {"grpo": [0.5, 0.6, 0.7], "dapo": [0.2, 0.3, 0.4]}
INITIAL_ACCURACY = 0.1
STEPS = 6
T0 = 1_000_000.0  # wall time of the first event


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


def _reward(variant: str, seed: int, step: int) -> float:
    return (0.1 if variant == "grpo" else 0.05) * step + 0.01 * seed


def write_cell(root, variant: str, seed: int, final_accuracy: float, finished: bool = True, stem: str = "", stale=()):
    """A cell folder as grpo-lightning-ablate leaves it; ``stale``: TensorBoard steps without an
    update, where the previous training values are logged again (as Lightning does)."""
    from torch.utils.tensorboard import SummaryWriter

    name = f"{variant}-seed{seed}{stem}"
    directory = root / name
    directory.mkdir(parents=True)
    record = {"name": name, "arm": variant + stem, "variant": variant, "seed": seed, "overrides": {}, "command": []}
    (directory / "cell.json").write_text(json.dumps(record))
    config = {
        "seed_everything": seed,
        "trainer": {"max_steps": STEPS, "logger": {"init_args": {"save_dir": str(directory)}}},
        "model": {
            "class_path": f"variants.{variant.upper()}",
            "init_args": {"group_size": 4, "clip_eps_high": 0.28 if variant == "dapo" else 0.2},
        },
        "data": {"init_args": {"num_train": 32}},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    writer = SummaryWriter(log_dir=str(directory))
    wall = T0
    writer.add_scalar("val/accuracy", INITIAL_ACCURACY, 0, walltime=wall)
    tokens = 0
    previous = {}
    for step in range(STEPS + len(stale)):
        if step in stale:
            wall += 0.5
            for tag, value in previous.items():
                writer.add_scalar(tag, value, step, walltime=wall)
            continue
        wall += 2.0 if variant == "grpo" else 1.0
        tokens += 100 + 10 * step
        scalars = {
            "reward": _reward(variant, seed, step),
            "kl": 0.01 * step,
            "entropy": 1.0 - 0.05 * step,
            "completions/mean_length": 10.0 + step,
            "clip_ratio/low": 0.01,
            "clip_ratio/high": 0.02,
            "frac_reward_zero_std": 0.5,
            "perf/step_s": 2.0 if variant == "grpo" else 1.0,
            "perf/generated_tokens": float(tokens),
        }
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step, walltime=wall)
        previous = scalars
        if step in (2, STEPS + len(stale) - 1):
            accuracy = final_accuracy if step == STEPS + len(stale) - 1 else (INITIAL_ACCURACY + final_accuracy) / 2
            writer.add_scalar("val/accuracy", accuracy, step, walltime=wall + 0.5)
    writer.close()
    if finished:
        (directory / "DONE").write_text("")
    return directory


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep") / "synthetic"
    for variant, finals in FINAL_ACCURACY.items():
        for seed, final in enumerate(finals):
            write_cell(root, variant, seed, final)
    write_cell(root, "grpo", 3, 0.0, finished=False)  # unfinished: left out
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


def test_logs_repeated_without_an_update_are_dropped(tmp_path):
    directory = write_cell(tmp_path, "dapo", 0, 0.4, stale=(1, 4))
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
    assert main([str(sweep), "--out", str(tmp_path / "reports"), "--name", "synthetic"]) is None  # exit status 0
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
    ]:
        assert section in md
    for title in ["val/accuracy", "reward", "kl", "entropy", "completions/mean_length", "clip_ratio", "frac_reward_zero_std"]:
        assert f"### {title}\n" in md
    pngs = sorted(p.name for p in target.glob("*.png"))
    assert pngs == sorted(
        f"curves_{s}.png" for s in ["val_accuracy", "reward", "kl", "entropy", "mean_length", "clip_ratio", "frac_reward_zero_std"]
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

    # final val/accuracy: grpo 0.6 [0.6 -+ 0.2484138], dapo 0.3 [0.3 -+ 0.2484138], grpo in bold
    assert "| val/accuracy | **0.6 [0.3516, 0.8484]** | 0.3 [0.05159, 0.5484] |" in md
    assert "| val/accuracy before training | 0.1 [0.1, 0.1] | 0.1 [0.1, 0.1] |" in md
    # final reward: grpo 0.5 + 0.01 * seed = 0.50, 0.51, 0.52: mean 0.51, s = 0.01, half = 4.3026527 * 0.01 / sqrt(3) = 0.0248414
    assert "| reward | **0.51 [0.4852, 0.5348]** |" in md
    # generated tokens 750 in every run; lower is better but equal: the first arm is bold
    assert "| generated tokens |" in md
    # Welch on final val/accuracy: t = 3.6742346, dof 4, p = 0.0213116 (see test_welch_by_hand)
    assert "| grpo | dapo | 3 | 3 | 0.3 | 3.674 | 4 | 0.0213 | 0.0213 | significant at 0.05 |" in md
    assert "**grpo** has the highest final val/accuracy (0.6); its lead over **dapo** (0.3) is significant (Welch p = 0.0213)." in md
    assert "Before training, val/accuracy was 0.1." in md
    assert "<table>" in html and "<strong>0.6 [0.3516, 0.8484]</strong>" in html


def test_report_is_byte_identical(sweep, tmp_path):
    first = build_report(sweep, tmp_path / "a", name="same")
    files = sorted(p.name for p in first.iterdir())
    before = {name: (first / name).read_bytes() for name in files}
    again = build_report(sweep, tmp_path / "a", name="same")
    other = build_report(sweep, tmp_path / "b", name="same")
    for name in files:
        assert (again / name).read_bytes() == before[name], name
        assert (other / name).read_bytes() == before[name], name
    png = before["curves_reward.png"]
    assert png.startswith(b"\x89PNG") and b"matplotlib" not in png


def test_small_n_is_reported(tmp_path):
    root = tmp_path / "tiny"
    write_cell(root, "grpo", 0, 0.5)
    write_cell(root, "grpo", 1, 0.7)
    write_cell(root, "rloo", 0, 0.4)
    target = build_report(root, tmp_path / "out")
    md = (target / "report.md").read_text()
    assert target.name == "tiny"
    assert "n too small for a test (needs at least 2 seeds per arm)" in md
    assert "| val/accuracy | **0.6 [-0.6706, 1.871]** | 0.4 |" in md  # t(0.975, 1) = 12.706205; half = 12.706205 * 0.1414214 / sqrt(2)
    assert "not tested (too few seeds to test)" in md


def test_cli_errors(tmp_path):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
    with pytest.raises(FileNotFoundError):
        main([str(tmp_path), "--out", str(tmp_path / "out")])


def test_a_wide_sweep_ranks_the_arms_and_groups_the_curves(tmp_path):
    # Nine arms (above WIDE = 6), three seeds each; arm k ends at 0.1 * k (+- 0.01), so the ranking is k = 9 .. 1.
    root = tmp_path / "wide"
    for k in range(1, 10):
        for seed in range(3):
            write_cell(root, "grpo", seed, 0.1 * k + 0.01 * (seed - 1), stem=f"-arm{k}")
    target = build_report(root, tmp_path / "out", name="wide")
    text = (target / "report.md").read_text()
    final = text.split("## Final metrics")[1].split("## Pairwise")[0]
    ranks = [line.split("|")[2].strip() for line in final.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert ranks == [f"grpo-arm{k} (n=3)" for k in range(9, 0, -1)]
    # 36 pairs; neighbours 0.1 apart with a std of 0.01 differ significantly, so the significant ones are shown
    # and all 36 are in the collapsed section.
    assert "pairs that differ significantly after Holm's correction" in text and "All 36 pairs" in text
    # Curves in groups of four, best first: 3 files per curve.
    assert sorted(p.name for p in target.glob("curves_val_accuracy_*.png")) == [f"curves_val_accuracy_{i}.png" for i in (1, 2, 3)]
    assert "val/accuracy: grpo-arm9, grpo-arm8, grpo-arm7, grpo-arm6" in text
