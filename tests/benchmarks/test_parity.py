"""benchmarks/parity.py: what our side records of each optimizer step."""

from __future__ import annotations

import importlib.util
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if "parity" not in sys.modules:  # the CLI's class paths name it "parity"
    _spec = importlib.util.spec_from_file_location("parity", BENCHMARKS / "parity.py")
    sys.modules["parity"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["parity"])
parity = sys.modules["parity"]


def test_the_probe_writes_a_row_per_optimizer_step_with_every_completion_sampled_since_the_last(tmp_path):
    """DAPO's dynamic sampling may sample batches that end without an update: they get no row, and
    their completions count in the next update's."""
    settings = tmp_path / "settings.json"
    settings.write_text("{}")
    probe = parity.ParityProbe(str(tmp_path / "run"), str(settings), "start", "cpu", eval_every=100, max_steps=100)
    module = SimpleNamespace(last_step_metrics={"reward": 0.5, "entropy": 1.0})

    def batch_end(global_step: int, lengths: list[int]) -> None:
        outputs = {"rollout": SimpleNamespace(lengths=torch.tensor(lengths))}
        probe.on_train_batch_end(SimpleNamespace(global_step=global_step), module, outputs, None, 0)

    batch_end(0, [1, 3])  # sampled only
    batch_end(1, [2, 1])  # the first update
    batch_end(2, [4, 4])
    rows = [json.loads(line) for line in (tmp_path / "run" / "rows.jsonl").read_text().splitlines()]
    assert [(row["step"], row["at_once_share"], row["reward"]) for row in rows] == [(1, 0.5, 0.5), (2, 0.0, 0.5)]
    assert math.isnan(parity.at_once_share([]))


# ------------------------------------------------------------------ resuming across calls

REPO_ROOT = BENCHMARKS.parent
#: parity.py on the tiny model: 6 steps of 2 prompts x 2 completions x 4 tokens, an evaluation every 3
#: steps, a checkpoint every 2, and a reward with variance (and a signal where the test asks for one).
TINY_PARITY = ["--steps", "6", "--seeds", "0", "--tiers", "no_signal", "--eval-every", "3", "--checkpoint-every", "2",
               "--device", "cpu", "--set", "model.sampling.max_new_tokens=4", "--set", "model.sampling.group_size=2",
               "--set", "model.optim.micro_batch_size=4", "--set", "data.batch_size=2", "--set", "trainer.precision=32-true",
               "--set", "model.rewards.funcs=[tests.benchmarks.interrupting_reward.interrupting_reward]"]  # fmt: skip


def run_records(out: Path, arm: str, name: str) -> list[dict]:
    return parity.records(out / "runs" / f"no_signal-grpo-{arm}-s0" / name)


def without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "time_s"} for row in rows]


@pytest.mark.parametrize("arm", ["ours", pytest.param("trl", marks=pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="TRL is not installed"))])  # fmt: skip
def test_a_run_stopped_and_killed_resumes_from_its_checkpoint_to_the_rows_of_an_uninterrupted_run(arm, tiny_model_dir, tmp_path,
                                                                                                 monkeypatch):  # fmt: skip
    """Three calls of the same command: the first asks the run to stop in step 3 (SIGTERM, as the deadline
    does: it ends the step and checkpoints), the second kills it in step 6 (SIGKILL: steps 4 and 5 recorded,
    the checkpoint at 4), the third ends it at step 6; a fourth starts nothing. Each step is recorded
    once, as the uninterrupted run records it (the resume is exact on both sides), and only the finished
    run's records remain."""
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))  # the runs import the reward from tests/
    monkeypatch.delenv("PARITY_TEST_SIGNAL", raising=False)
    command = [*TINY_PARITY, "--model", tiny_model_dir, "--arms", arm]
    reference = subprocess.Popen([sys.executable, str(BENCHMARKS / "parity.py"), *command, "--out", str(tmp_path / "reference")],
                                 cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    out = tmp_path / "resumed"
    run = out / "runs" / f"no_signal-grpo-{arm}-s0"

    monkeypatch.setenv("PARITY_TEST_SIGNAL", "SIGTERM:3")
    parity.main([*command, "--out", str(out)])
    assert [row["step"] for row in run_records(out, arm, "rows.jsonl")] == [1, 2, 3]
    assert parity.newest_checkpoint(parity.json.loads((out / "plan.json").read_text())["jobs"][0]) is not None

    monkeypatch.setenv("PARITY_TEST_SIGNAL", "SIGKILL:3")  # the third step of the resumed process: step 6
    parity.main([*command, "--out", str(out)])
    assert [row["step"] for row in run_records(out, arm, "rows.jsonl")] == [1, 2, 3, 4, 5]

    monkeypatch.delenv("PARITY_TEST_SIGNAL")
    parity.main([*command, "--out", str(out)])
    results = parity.main([*command, "--out", str(out)])  # finished: not started again

    assert reference.wait(timeout=300) == 0, reference.stderr.read()[-3000:]
    rows = run_records(out, arm, "rows.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert without_time(rows) == without_time(run_records(tmp_path / "reference", arm, "rows.jsonl"))
    assert [row["time_s"] for row in rows] == sorted(row["time_s"] for row in rows)  # counted on across resumes
    evaluations = run_records(out, arm, "checkpoints.jsonl")
    assert [c["step"] for c in evaluations] == [3, 6]
    assert [c["weight_change_norm"] for c in evaluations] == [
        c["weight_change_norm"] for c in run_records(tmp_path / "reference", arm, "checkpoints.jsonl")]  # fmt: skip
    assert evaluations[-1]["weight_change_norm"] > 0
    assert [start["step"] for start in run_records(out, arm, "starts.jsonl")] == [0, 3, 4]  # the 4th call started none
    (record,) = results["runs"]
    assert (record["resumes"], record["resumed_from"], record["returncode"]) == (2, [3, 4], 0)
    assert not (run / parity.TRAINER_FOLDER).exists()  # a finished run's checkpoint is removed


def test_the_deadline_asks_runs_to_stop_then_kills_those_left(tmp_path, monkeypatch):
    """``stop_margin_s`` before the deadline every run gets SIGTERM; one that has not ended at the
    deadline gets SIGKILL."""
    stops = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); time.sleep(60)"
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    scripts = {"stops": stops, "ignores": ignores}
    monkeypatch.setattr(parity, "job_command", lambda job: [sys.executable, "-c", scripts[job["name"]]])
    jobs = [{"name": name, "role": "ours", "directory": str(tmp_path / name), "steps": 6} for name in scripts]
    started = time.time()
    parity.run_all(jobs, tmp_path, deadline=started + 5, stop_margin_s=3)
    assert [job["returncode"] for job in jobs] == [143, -signal.SIGKILL]
    assert 5 <= time.time() - started < 15


def test_a_run_left_running_by_an_earlier_call_is_killed_before_its_run_starts_again(tmp_path):
    run = tmp_path / "runs" / "easy-grpo-ours-s0"
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run)], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (tmp_path / "pids.json").write_text(json.dumps({str(run): leftover.pid, str(tmp_path / "runs" / "gone"): other.pid}))
    # A run an earlier call left is long past its exec; right after Popen returns, the kernel may not have
    # set the new command line yet (the parent of a vfork resumes before it): wait for it, as for a real run.
    deadline = time.time() + 10
    while str(run) not in parity.command_line(leftover.pid) and time.time() < deadline:
        time.sleep(0.01)
    try:
        parity.end_leftover_runs(tmp_path)
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None  # its number, but not that run's process
    finally:
        other.kill()
        other.wait()


def test_an_engine_setting_given_with_set_reaches_our_fit_beside_the_engine_without_compilation(tmp_path):
    """``--set model.engine.rollout=hf`` is the fit's engine path (it was once replaced by ``NO_COMPILE``
    whole, so the run sampled on the engine it was asked not to); the compile switches stay off."""
    settings = parity.task_settings(None, ["model.engine.rollout=hf", "model.engine.compile=true"], "add_1digit")
    config = parity.ours_config(settings, "grpo", "ours", 3, {}, tmp_path, 10)
    assert config["model"]["init_args"]["engine"] == {**parity.NO_COMPILE, "rollout": "hf", "compile": True}
    plain = parity.ours_config(parity.task_settings(None, [], "add_1digit"), "grpo", "ours", 3, {}, tmp_path, 10)
    assert plain["model"]["init_args"]["engine"] == parity.NO_COMPILE


def test_the_results_name_the_commit_the_runs_ran_at(monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_COMMIT", "0123abcd" * 5)
    assert parity.provenance() == {"commit": "0123abcd" * 5, "dirty": None,
                                   "card": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"}  # fmt: skip
    monkeypatch.delenv("GRPO_BENCH_COMMIT")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS, capture_output=True, text=True).stdout.strip()
    assert parity.provenance()["commit"] == (commit or None)


def part(seeds: list[int], accuracy: float, commit: str, learning_rate: str = "2e-5") -> dict:
    """A grid's results: GRPO ours and TRL on the easy tier, greedy accuracy ``accuracy`` for ours and 0.5 for TRL
    at step 50 on each of ``seeds``."""
    command = (f"python benchmarks/parity.py --steps 50 --seeds {' '.join(map(str, seeds))} --tiers easy --arms ours trl "
               f"--set model.optim.learning_rate={learning_rate} --out /tmp/parity --deadline-min 9")  # fmt: skip
    runs = [{"tier": "easy", "task": "add_1digit", "variant": "grpo", "role": role, "arm": f"grpo-{role}", "seed": seed,
             "rows": [], "checkpoints": [{"step": 50, "accuracy": value, "mean_length": 4.0, "empty_share": 0.0}]}
            for seed in seeds for role, value in (("ours", accuracy), ("trl", 0.5))]  # fmt: skip
    start = {"accuracy": 0.4, "mean_length": 4.0, "empty_share": 0.0}
    return {"date": "2026-12-03", "steps": 50, "seeds": seeds, "variants": ["grpo"], "pairs": {"grpo": {"trl": {}}},
            "command": command, "commit": commit, "dirty": None, "card": "NVIDIA H200",
            "tasks": {"easy": {"task": "add_1digit", "start": start}}, "runs": runs}  # fmt: skip


def test_grids_run_with_other_seeds_are_joined_into_one_comparison_and_keep_their_commits(tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b" / "results.json"  # a results file, and a grid's --out folder
    second.parent.mkdir()
    first.write_text(json.dumps(part([0, 1], 0.6, "a" * 40)))
    second.write_text(json.dumps(part([2, 3, 4], 0.7, "b" * 40)))
    joined = parity.main(["--report", str(first), str(second.parent), "--out", str(tmp_path / "joined" / "results.json")])
    assert joined["seeds"] == [0, 1, 2, 3, 4]
    assert joined["commits"] == {"a" * 40: ["easy-grpo-ours-s0", "easy-grpo-trl-s0", "easy-grpo-ours-s1", "easy-grpo-trl-s1"],
                                 "b" * 40: [f"easy-grpo-{role}-s{seed}" for seed in (2, 3, 4) for role in ("ours", "trl")]}  # fmt: skip
    minus_trl = joined["summary"]["easy"]["variants"]["grpo"]["minus_trl"]["grpo-ours"]
    assert minus_trl["by_seed"] == pytest.approx([0.1, 0.1, 0.2, 0.2, 0.2])
    assert json.loads((tmp_path / "joined" / "results.json").read_text())["seeds"] == [0, 1, 2, 3, 4]
    printed = capsys.readouterr().out
    assert f"4 runs at {'a' * 40}" in printed and f"6 runs at {'b' * 40}" in printed
    assert "these runs come from 2 commits" in printed

    third = tmp_path / "c.json"  # a joined grid joins again: its runs keep their commits
    third.write_text(json.dumps(part([5], 0.5, "c" * 40)))
    again = parity.main(["--report", str(tmp_path / "joined" / "results.json"), str(third), "--out", str(tmp_path / "again.json")])
    assert again["seeds"] == [0, 1, 2, 3, 4, 5] and list(again["commits"]) == ["a" * 40, "b" * 40, "c" * 40]
    assert len(again["commands"]) == 3


@pytest.mark.parametrize("second, named", [
    (part([1, 2], 0.7, "b" * 40), "easy-grpo-ours-s1 is in parts 1 and 2"),  # a seed run twice
    (part([2, 3], 0.7, "b" * 40, learning_rate="5e-5"), "other settings than part 1: set"),
    ({**part([2, 3], 0.7, "b" * 40), "steps": 100}, "part 2's steps is 100, part 1's 50"),
    ({**part([2, 3], 0.7, "b" * 40), "tasks": {"easy": {"task": "add_2digit", "start": {"accuracy": 0.2, "mean_length": 5.0}}}},
     "tier easy: part 2 chose add_2digit"),
])  # fmt: skip
def test_parts_that_are_not_one_grid_s_are_refused_by_what_differs(second, named, tmp_path):
    first_file, second_file = tmp_path / "a.json", tmp_path / "b.json"
    first_file.write_text(json.dumps(part([0, 1], 0.6, "a" * 40)))
    second_file.write_text(json.dumps(second))
    with pytest.raises(ValueError, match=named):
        parity.main(["--report", str(first_file), str(second_file), "--out", str(tmp_path / "joined.json")])
    with pytest.raises(SystemExit, match="a .json file"):
        parity.main(["--report", str(first_file), str(second_file), "--out", str(tmp_path / "joined")])
    with pytest.raises(SystemExit, match="--report: no results at .*empty.results.json"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        parity.main(["--report", str(first_file), str(tmp_path / "empty"), "--out", str(tmp_path / "joined.json")])


def test_more_seeds_of_a_grid_take_its_tasks_and_start_evaluations_instead_of_choosing_again(tiny_model_dir, tmp_path,
                                                                                               monkeypatch):  # fmt: skip
    """``--tasks-from`` gives the runs the earlier grid's tasks (a greedy start evaluation on a GPU may
    differ in a token between machines, and the join compares them); a tier it lacks is refused by name.
    The fits themselves are replaced: this checks what the plan is given."""
    earlier = part([0, 1], 0.6, "a" * 40)
    earlier["tasks"]["medium"] = {"task": "add_2digit", "start": {"accuracy": 0.2, "mean_length": 13.0, "empty_share": 0.0}}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    planned = {}
    monkeypatch.setattr(parity, "choose_tasks", lambda model, overrides, tiers, device: {tier: pytest.fail(f"chose {tier}") for tier in tiers})
    monkeypatch.setattr(parity, "save_start_model", lambda model, directory: str(directory))
    monkeypatch.setattr(parity, "plan_jobs", lambda args, tasks, *rest: planned.update(tasks) or [])
    monkeypatch.setattr(parity, "run_plan", lambda *args, **kwargs: None)
    monkeypatch.setattr(parity, "assemble", lambda out: {"summary": {}})
    arguments = ["--steps", "50", "--seeds", "2", "--tiers", "easy", "medium", "--device", "cpu", "--model", tiny_model_dir,
                 "--out", str(tmp_path / "more"), "--tasks-from", str(tmp_path / "earlier.json")]  # fmt: skip
    parity.main(arguments)
    assert planned == {tier: earlier["tasks"][tier] for tier in ("easy", "medium")}
    with pytest.raises(SystemExit, match="has no task for no_signal"):
        parity.main([*arguments[:5], "easy", "no_signal", *arguments[7:]])
    (tmp_path / "other.json").write_text(json.dumps({"steps": 5}))
    for wrong in ("other.json", "missing.json"):
        with pytest.raises(SystemExit, match=f"--tasks-from .*{wrong}: not the results.json of a parity grid"):
            parity.main([*arguments[:-1], str(tmp_path / wrong)])
