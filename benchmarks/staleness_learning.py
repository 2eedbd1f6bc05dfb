"""Learning with stale rollouts: SmolLM2-135M-Instruct trained with GRPO on rollouts ``k`` updates stale
(``StaleRollouts(max_staleness=k)``, partial rollouts where asked) under each importance correction
(``sampling.correction``), beside synchronous training, all runs at once on one machine.

The acceptance is prime-rl's sanity check: on a task the model starts out solving 20-80% of the time, a
sound correction takes the training accuracy (the sampled completions' mean reward) above 95%. The task
is ``parity.py``'s easy one (one-digit sums and differences, the recipe's chat prompts, 32 prompts x 8
completions x 16 tokens a step). Each run is ``parity.py``'s job (its probe records every optimizer
step's reward, ``sampling/behaviour_kl``, ``sampling/masked_fraction`` and ``rollout/staleness``, and
scores the saved model greedily every ``--eval-every`` steps); the same command on the same ``--out``
continues the runs from their checkpoints until all reach ``--steps`` (``--max-runs N``: N of them a call,
for a card that does not hold them all)::

    python benchmarks/staleness_learning.py --steps 60 --max-runs 16 --deadline-min 9 --out DIR
    python benchmarks/staleness_learning.py --report DIR     # the table of DIR's runs

A run's training accuracy is the mean reward of its last ``--window`` optimizer steps; ``reached_at``
is the first step whose trailing ``--window``-step mean passes 0.95.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from parity import (CANDIDATES, evaluate, finished, print_progress, provenance, run_plan,  # noqa: E402
                    save_start_model, task_settings)
from parity_report import records, run_status  # noqa: E402

from grpo_lightning.algorithms.rollout_correction import CORRECTIONS  # noqa: E402

#: The acceptance: training accuracy above this (prime-rl's sanity check).
TARGET = 0.95
#: Corrections compared (``none``: the update's own clip, no importance correction against the sampler).
DEFAULT_CORRECTIONS = ["none", "token_truncate", "icepop", "geo_rs", "kpop", "m2po"]


def arms(staleness: list[int], corrections: list[str], partial: list[str]) -> list[dict[str, Any]]:
    """Synchronous training, then each ``k`` with each correction, then ``k >= 2`` with partial rollouts for
    the corrections in ``partial``."""
    found = [{"name": "sync", "k": 0, "partial": False, "correction": "none"}]
    for k in staleness:
        found += [{"name": f"k{k}-{c}", "k": k, "partial": False, "correction": c} for c in corrections]
        if k >= 2:
            found += [{"name": f"k{k}-partial-{c}", "k": k, "partial": True, "correction": c} for c in partial]
    return found


def stale_callback(arm: dict[str, Any]) -> list[dict[str, Any]]:
    if not arm["k"]:
        return []
    return [{"class_path": "grpo_lightning.rollout.stale.StaleRollouts",
             "init_args": {"max_staleness": arm["k"], "partial_rollouts": arm["partial"]}}]  # fmt: skip


def plan_jobs(args, work: Path, start_model: str, eval_device: str) -> list[dict[str, Any]]:
    jobs = []
    for arm in arms(args.staleness, args.corrections, args.partial):
        correction = "null" if arm["correction"] == "none" else arm["correction"]
        settings_file = work / f"{arm['name']}.json"
        settings_file.write_text(json.dumps(task_settings(args.model, [*args.set, f"model.sampling.correction={correction}"], args.task)))
        for seed in args.seeds:
            jobs.append({"tier": "easy", "task": args.task, "variant": "grpo", "role": "ours_full", "arm": arm["name"],
                         "stale": arm, "seed": seed, "steps": args.steps, "eval_every": args.eval_every,
                         "checkpoint_every": args.checkpoint_every, "device": args.device, "eval_device": eval_device,
                         "settings_file": str(settings_file), "start_model": start_model, "callbacks": stale_callback(arm),
                         "directory": str(work / f"{arm['name']}-s{seed}")})  # fmt: skip
    return jobs


def trailing_mean(values: list[float], window: int) -> list[float]:
    return [statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def run_summary(job: dict[str, Any], window: int) -> dict[str, Any]:
    """One run: its training accuracy at the first update (the start model's samples for every ``k``) and at
    the end (the last ``window`` steps' mean; ``passes`` once the run finished with it above ``TARGET``),
    the first step its trailing mean passed ``TARGET`` (a run may pass it and fall back), its last
    greedy evaluation, the behaviour KL's and the masked share's means over its steps, and its last step's
    staleness (optimizer steps between the sampling weights and the update: 0 at the first update, ``k``
    once ``k`` updates have run)."""
    directory = Path(job["directory"])
    rows = [row for row in records(directory / "rows.jsonl") if math.isfinite(row.get("reward", math.nan))]
    rewards = [row["reward"] for row in rows]
    trailing = trailing_mean(rewards, window)
    reached = next((rows[i]["step"] for i, value in enumerate(trailing) if i + 1 >= window and value > TARGET), None)
    checkpoints = records(directory / "checkpoints.jsonl")

    def mean_of(name: str) -> float | None:
        values = [row[name] for row in rows if math.isfinite(row.get(name, math.nan))]
        return statistics.fmean(values) if values else None

    return {"arm": job["arm"], "seed": job["seed"], **{k: job["stale"][k] for k in ("k", "partial", "correction")},
            "steps": rows[-1]["step"] if rows else 0, "finished": finished(job), "returncode": job.get("returncode"),
            "start_reward": rewards[0] if rewards else None,
            "final_reward": trailing[-1] if rewards else None, "reached_at": reached,
            "passes": finished(job) and len(rewards) >= window and trailing[-1] > TARGET,  # a stopped run passes nothing
            "greedy": checkpoints[-1]["accuracy"] if checkpoints else None,
            "greedy_step": checkpoints[-1]["step"] if checkpoints else None,
            "behaviour_kl": mean_of("behaviour_kl"), "masked_fraction": mean_of("masked_fraction"),
            "staleness": rows[-1].get("staleness") if rows else None, "time_s": rows[-1]["time_s"] if rows else None}  # fmt: skip


def table(runs: list[dict[str, Any]], start: dict[str, Any] | None, window: int) -> str:
    def number(value, spec):
        return "—" if value is None else format(value, spec)

    lines = []
    if start:
        lines.append(f"start model: greedy accuracy {start['accuracy']:.3f} on the held-out problems")
    lines += [f"training accuracy (the sampled completions' mean reward): start at the first update, final over the last "
              f"{window} steps; passes: final above {TARGET}",
              "| arm | seed | steps | start | final | passes | reached at | greedy | behaviour KL | masked | staleness |",
              "|:---|---:|---:|---:|---:|:---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for run in runs:
        state = "" if run["finished"] else f" ({run_status(False, run['returncode'], bool(run['steps']))})"
        lines.append(
            f"| {run['arm']} | {run['seed']} | {run['steps']}{state} | {number(run['start_reward'], '.3f')} | "
            f"{number(run['final_reward'], '.3f')} | {'yes' if run['passes'] else 'no'} | {number(run['reached_at'], 'd')} | "
            f"{number(run['greedy'], '.3f')} | {number(run['behaviour_kl'], '.2e')} | {number(run['masked_fraction'], '.3f')} | "
            f"{number(run['staleness'], '.2f')} |"
        )
    return "\n".join(lines)


def report(out: Path, window: int) -> dict[str, Any]:
    """``OUT/results.json`` and ``OUT/summary.md`` from the runs' records under ``OUT/runs`` (wherever the
    folder was when they ran)."""
    plan = json.loads((out / "plan.json").read_text())
    runs = [run_summary({**job, "directory": str(out / "runs" / Path(job["directory"]).name)}, window) for job in plan["jobs"]]
    results = {"header": plan["header"], "start": plan.get("start"), "runs": runs, "window": window}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(runs, plan.get("start"), window)
    (out / "summary.md").write_text(text + "\n")
    print(text, flush=True)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps of every run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 4, 8], help="the k of StaleRollouts")
    known = ["none", *CORRECTIONS]
    parser.add_argument("--corrections", nargs="+", default=DEFAULT_CORRECTIONS, choices=known,
                        help="sampling.correction values (none: off)")
    parser.add_argument("--partial", nargs="*", default=["m2po"], choices=known,
                        help="corrections also run with partial rollouts (k >= 2)")
    parser.add_argument("--task", default="add_sub_1digit", choices=list(CANDIDATES))
    parser.add_argument("--eval-every", type=int, default=30)
    parser.add_argument("--window", type=int, default=10, help="steps the training accuracy is averaged over")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    parser.add_argument("--model", default=None, help="the recipe's model, replaced")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe setting, e.g. data.num_val=50")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--max-runs", type=int, default=None,
                        help="start at most this many unfinished runs, in the table's order (one H200 holds about 17 "
                        "at ~7.5 GiB each); the same command again goes on with the rest")
    parser.add_argument("--deadline-min", type=float, default=None)
    parser.add_argument("--stop-margin-min", type=float, default=1.5)
    parser.add_argument("--out", type=Path, default=Path("staleness-results"))
    parser.add_argument("--report", type=Path, default=None, help="only summarise an --out folder")
    args = parser.parse_args(argv)
    if args.report:
        return report(args.report, args.window)
    if any(not 1 <= k <= 16 for k in args.staleness):
        parser.error("--staleness: each k from 1 to 16")

    started = time.time()
    deadline = started + 60 * args.deadline_min if args.deadline_min else math.inf
    eval_device = "cuda" if args.device == "gpu" else "cpu"
    work = args.out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    previous = json.loads((args.out / "plan.json").read_text()) if (args.out / "plan.json").exists() else None
    command = " ".join(["python", "benchmarks/staleness_learning.py", *(sys.argv[1:] if argv is None else argv)])
    header = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "seeds": args.seeds, "task": args.task,
              "command": command, "calls": previous["header"]["calls"] + 1 if previous else 1, **provenance()}  # fmt: skip
    try:
        settings = task_settings(args.model, args.set, args.task)
        model = settings["model"]["init_args"]["model"]
        start = previous["start"] if previous else evaluate(model, model, settings, keep=4, device=eval_device)
        start_model = save_start_model(model, work / "start")
        jobs = plan_jobs(args, work, start_model, eval_device)
        run_plan(args.out, {"header": header, "start": start, "jobs": jobs}, previous, deadline, 60 * args.stop_margin_min,
                 args.max_runs)  # fmt: skip
    finally:
        shutil.rmtree(work / "start", ignore_errors=True)
    print_progress(jobs)
    return report(args.out, args.window)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the driver stopped: its runs killed
    main()
