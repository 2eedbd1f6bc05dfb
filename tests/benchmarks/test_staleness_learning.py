"""benchmarks/staleness_learning.py: stale-rollout runs through parity.py's jobs, and their table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
for name in ("parity", "staleness_learning"):  # the CLI's class paths name the probe "parity.ParityProbe"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
staleness_learning = sys.modules["staleness_learning"]


def test_the_trailing_mean_and_the_step_it_passes_the_target(tmp_path):
    """Rewards 0.9, 1, 1, 1 over a window of 2: trailing means 0.9, 0.95, 1, 1; passes (above 0.95) at the
    third row, step 30; the start is the first row's, 0.9."""
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    rows = [{"step": 10 * (i + 1), "reward": r, "time_s": i, "staleness": min(i, 2)} for i, r in enumerate([0.9, 1.0, 1.0, 1.0])]
    (run / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "checkpoints.jsonl").write_text(json.dumps({"step": 40, "accuracy": 0.5}) + "\n")
    job = {"directory": str(run), "arm": "k2-m2po", "seed": 0, "steps": 40,
           "stale": {"k": 2, "partial": False, "correction": "m2po"}}  # fmt: skip
    summary = staleness_learning.run_summary(job, window=2)
    assert staleness_learning.trailing_mean([0.9, 1.0, 1.0, 1.0], 2) == [0.9, 0.95, 1.0, 1.0]
    assert (summary["start_reward"], summary["final_reward"], summary["reached_at"]) == (0.9, 1.0, 30)
    assert summary["passes"] and summary["finished"] and summary["greedy"] == 0.5 and summary["staleness"] == 2


def test_synchronous_stale_and_partial_runs_train_and_record_their_staleness(tiny_model_dir, tmp_path):
    """The tiny model, 3 optimizer steps, two runs a call: the first call runs the synchronous run (no
    staleness) and k = 2 with M2PO, the second the partial-rollout run; k = 2 trains on rollouts two
    updates old by its third step, and the table has one row a run."""
    out = tmp_path / "out"
    command = [
        "--steps", "3", "--eval-every", "3", "--checkpoint-every", "3", "--window", "2", "--device", "cpu",
        "--model", tiny_model_dir, "--staleness", "2", "--corrections", "m2po", "--partial", "m2po", "--out", str(out),
        "--set", "model.sampling.max_new_tokens=4", "--set", "model.sampling.group_size=2",
        "--set", "model.optim.micro_batch_size=4", "--set", "data.batch_size=2", "--set", "trainer.precision=32-true",
        "--max-runs", "2"]  # fmt: skip
    first = {run["arm"]: run["steps"] for run in staleness_learning.main(command)["runs"]}
    assert first == {"sync": 3, "k2-m2po": 3, "k2-partial-m2po": 0}
    runs = {run["arm"]: run for run in staleness_learning.main(command)["runs"]}
    assert list(runs) == ["sync", "k2-m2po", "k2-partial-m2po"]
    assert all(run["finished"] and run["steps"] == 3 and run["returncode"] == 0 for run in runs.values()), runs
    assert runs["sync"]["staleness"] is None
    assert runs["k2-m2po"]["staleness"] == 2.0 and runs["k2-m2po"]["behaviour_kl"] is not None
    assert runs["k2-partial-m2po"]["staleness"] is not None and 0 < runs["k2-partial-m2po"]["staleness"] <= 2.0
    assert (out / "summary.md").read_text().count("\n| k2-") == 2
