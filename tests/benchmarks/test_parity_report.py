"""benchmarks/parity_report.py: each variant's arms are compared with that variant's TRL run alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
_spec = importlib.util.spec_from_file_location("parity_report", BENCHMARKS / "parity_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def run(variant: str, role: str, seed: int, accuracies: dict[int, float], note: str | None = None) -> dict:
    """A run's record: greedy accuracy at each evaluated step, no step rows."""
    checkpoints = [{"step": step, "accuracy": accuracy, "mean_length": 4.0, "empty_share": 0.0}
                   for step, accuracy in accuracies.items()]  # fmt: skip
    return {"tier": "easy", "task": "add_1digit", "variant": variant, "role": role, "arm": f"{variant}-{role}",
            "seed": seed, "note": note, "rows": [], "checkpoints": checkpoints}  # fmt: skip


def results(runs: list[dict]) -> dict:
    start = {"accuracy": 0.5, "mean_length": 4.0, "empty_share": 0.0}
    return {"seeds": [0, 1], "steps": 100, "tasks": {"easy": {"task": "add_1digit", "start": start}}, "runs": runs}


def test_each_variant_s_arms_are_paired_with_its_own_trl_run_at_the_step_both_reached():
    summary = report.summarize(results([
        run("grpo", "ours", 0, {50: 0.6}), run("grpo", "trl", 0, {50: 0.5}),
        run("grpo", "ours", 1, {50: 0.7, 100: 0.8}), run("grpo", "trl", 1, {50: 0.6}),  # TRL stopped at 50
        run("dapo", "ours", 0, {50: 0.9}), run("dapo", "trl", 0, {50: 0.6}),
        run("dapo", "ours", 1, {50: 0.8}), run("dapo", "trl", 1, {50: 0.7}),
        run("dapo", "ours_full", 0, {50: 0.95}, note="ours only"), run("dapo", "ours_full", 1, {50: 0.65}, note="ours only"),
    ]))["easy"]  # fmt: skip
    assert list(summary["variants"]) == ["grpo", "dapo"]
    grpo, dapo = summary["variants"]["grpo"], summary["variants"]["dapo"]
    assert list(grpo["arms"]) == ["grpo-ours", "grpo-trl"] and list(grpo["minus_trl"]) == ["grpo-ours"]
    assert grpo["minus_trl"]["grpo-ours"]["by_seed"] == pytest.approx([0.1, 0.1])  # seed 1 at step 50, not 100
    assert [f["step"] for f in grpo["arms"]["grpo-ours"]] == [50, 50]
    assert list(dapo["arms"]) == ["dapo-ours", "dapo-ours_full", "dapo-trl"]
    assert dapo["minus_trl"]["dapo-ours"]["by_seed"] == pytest.approx([0.3, 0.1])
    assert dapo["minus_trl"]["dapo-ours_full"]["by_seed"] == pytest.approx([0.35, -0.05])
    assert dapo["notes"] == {"dapo-ours_full": "ours only"} and grpo["notes"] == {}


def test_records_from_before_variants_named_the_arm_are_read_as_one_variant_s():
    old = [{**run("grpo", "ours", seed, {25: 0.9}), "arm": "ours"} for seed in (0, 1)]
    old += [{**run("grpo", "trl", seed, {25: 0.8}), "arm": "trl"} for seed in (0, 1)]
    for record in old:
        del record["role"]
    summary = report.summarize(results(old))["easy"]["variants"]["grpo"]
    assert list(summary["arms"]) == ["grpo-ours", "grpo-trl"]
    assert summary["minus_trl"]["grpo-ours"]["by_seed"] == pytest.approx([0.1, 0.1])


def test_the_start_model_s_behaviour_is_kept_within_the_evaluation_s_noise_by_hand():
    start = {"accuracy": 0.01, "mean_length": 16.0, "empty_share": 0.0}
    # 200 problems at 1%: twice the binomial standard error is 2 sqrt(0.01 x 0.99 / 200) = 0.01407, so 1 correct
    # (0.005) against the start's 2 is kept, and none correct (0.0) too; 13 tokens is 18.75% shorter: kept
    final = {"step": 200, "accuracy": 0.0, "mean_length": 13.0, "empty_share": 0.0, "problems": 200}
    kept = report.harm_check(final, start, 200)
    assert kept["kept"] and kept["complete"] and kept["accuracy_floor"] == pytest.approx(0.01 - 0.0140712, abs=1e-6)
    # answers that end at once: 12 tokens is 25% shorter, and a few are empty
    harmed = report.harm_check({**final, "mean_length": 12.0, "empty_share": 0.02}, start, 200)
    assert not harmed["kept"] and harmed["checks"] == {"non_empty": False, "length": False, "accuracy": True}
    # on an easy task 0.70 of 200 from 0.76: the floor is 0.76 - 2 sqrt(0.76 x 0.24 / 200) = 0.69960, kept; 0.69 is not
    easy = {"accuracy": 0.76, "mean_length": 9.2, "empty_share": 0.0}
    assert report.harm_check({**final, "accuracy": 0.70, "mean_length": 9.2}, easy, 300)["kept"]
    cut = report.harm_check({**final, "accuracy": 0.69, "mean_length": 9.2}, easy, 300)
    assert cut["checks"]["accuracy"] is False and cut["complete"] is False  # and the run stopped at 200 of 300


def test_a_run_that_failed_is_told_apart_from_one_a_deadline_stopped_and_one_with_no_evaluation_is_listed(capsys):
    """Out of memory (exit 1) is a failure; SIGTERM at the deadline (143) a stop; a run that died before its
    first evaluation still appears, with its status."""
    finished = {**run("grpo", "ours", 0, {50: 0.6, 100: 0.7}), "returncode": 0}
    stopped = {**run("grpo", "ours", 1, {50: 0.6}), "returncode": 143}
    failed = {**run("grpo", "trl", 0, {}), "rows": [{"step": 1}], "returncode": 1}
    waiting = {**run("grpo", "trl", 1, {}), "returncode": None}
    harm = report.summarize(results([finished, stopped, failed, waiting]))["easy"]["harm"]
    assert [c["status"] for c in harm["grpo-ours"]] == ["finished", "stopped"]
    assert [c["status"] for c in harm["grpo-trl"]] == ["failed (exit 1)", "not started"]
    report.print_summary({"easy": {**report.summarize(results([finished, stopped, failed, waiting]))["easy"], "variants": {}}})
    printed = capsys.readouterr().out
    assert "s1@50 (stopped): kept" in printed and "s0: no evaluation (failed (exit 1))" in printed
    assert report.run_status(False, None, True) == "stopped"  # the driver itself was stopped: no exit status


def test_ours_against_trl_is_worse_not_worse_or_undetermined_from_the_paired_interval():
    def difference(by_seed, low, high):
        return {"by_seed": by_seed, "ci95": [low, high]}

    assert report.trl_verdict(difference([-0.1, -0.2, -0.15], -0.27, -0.03)) == "worse"
    assert report.trl_verdict(difference([0.0, 0.01, -0.01], -0.025, 0.025)) == "not worse (within 0.05)"
    assert report.trl_verdict(difference([0.1, -0.2, 0.0], -0.4, 0.3)) == "undetermined"
    assert report.trl_verdict(difference([0.1, 0.2], 0.0, 0.5)) == "too few seeds for a verdict"
    # 96 / 96 / 94% against 100 / 100 / 98% (2026-12-03, easy, step 50): a t-interval of no width is no evidence
    assert report.trl_verdict(difference([-0.04, -0.04, -0.04], -0.04, -0.04)).startswith("undetermined (the same")
    assert report.trl_verdict(difference([0.005, 0.005, 0.005], 0.005, 0.005)).startswith("undetermined (the same")


def test_the_training_reward_is_compared_over_the_window_up_to_the_common_step_by_hand(capsys):
    """Rows at steps 1..60, reward 0.01 x step for ours and 0.5 for TRL: over steps 1..50 (the window up to
    step 50, both runs' last common evaluation) ours averages 0.255, so ours - TRL is -0.245 on each seed;
    a run missing a row of the window is left out of the comparison rather than averaged over fewer steps."""
    window = report.REWARD_WINDOW
    assert window == 50

    def with_rows(record: dict, reward, steps=range(1, 61)) -> dict:
        return {**record, "rows": [{"step": s, "reward": reward(s), "mean_length": 4.0, "min_length": 1.0, "at_once_share": 0.0}
                                   for s in steps]}  # fmt: skip

    runs = [with_rows(run("grpo", "ours", seed, {50: 0.6, 60: 0.7}), lambda s: 0.01 * s) for seed in (0, 1)]
    runs += [with_rows(run("grpo", "trl", seed, {50: 0.5}), lambda s: 0.5) for seed in (0, 1)]
    grpo = report.summarize(results(runs))["easy"]["variants"]["grpo"]
    assert grpo["arms"]["grpo-ours"][0]["training_reward"] == pytest.approx(0.255)
    assert grpo["training_reward_minus_trl"]["grpo-ours"]["by_seed"] == pytest.approx([-0.245, -0.245])

    runs[2] = with_rows(runs[2], lambda s: 0.5, steps=[s for s in range(1, 61) if s != 7])
    grpo = report.summarize(results(runs))["easy"]["variants"]["grpo"]
    assert grpo["training_reward_minus_trl"]["grpo-ours"]["by_seed"] == pytest.approx([-0.245])

    runs[3] = with_rows(runs[3], lambda s: 0.5, steps=range(20, 61))  # neither seed has the whole window now
    report.print_summary(report.summarize(results(runs)))
    assert "grpo-ours - TRL, training reward: not compared" in capsys.readouterr().out
