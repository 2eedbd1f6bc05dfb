"""``parity.py``'s results: assembled from the runs' records (``OUT/plan.json``, ``OUT/runs/``), and each
variant's arms compared with TRL's run, seed by seed, at the last evaluated step both reached.

An arm is ``VARIANT-ROLE``: ``ours`` (our preset matched to TRL: ``parity_trl``), ``trl``, ``ours_full``
(the preset as it is, where the match turns a part off: DAPO's dynamic sampling) and
``ours_keep_zero`` (ours stepping on zero gradients too). Each variant's arms are compared with that
variant's TRL run only, with a verdict (worse, not worse within ``NON_INFERIORITY_MARGIN``, undetermined):
on greedy accuracy at that step, and on the training reward over the ``REWARD_WINDOW`` steps up to it.
Every run's last evaluation is also checked against the start model's (``harm_check``: answers as
non-empty, a mean length within 20%, accuracy not below the start's beyond the evaluation's noise), and
says whether the run reached all its steps, and if not, whether a deadline stopped it or it failed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable


def collect(job: dict[str, Any]) -> dict[str, Any]:
    """A job's identity, exit status (``None``: not known, the driver was stopped; of its last process),
    step rows, checkpoints, and the steps its run was resumed from (``resumes`` times; a run started
    anew after a stop before its first checkpoint is not resumed)."""
    directory = Path(job["directory"])
    keep = ("tier", "task", "variant", "role", "arm", "seed", "note", "steps", "returncode")
    resumed_from = [start["step"] for start in records(directory / "starts.jsonl") if start["step"] > 0]
    return {**{k: job.get(k) for k in keep}, **identity(job), "rows": records(directory / "rows.jsonl"),
            "checkpoints": records(directory / "checkpoints.jsonl"), "resumes": len(resumed_from),
            "resumed_from": resumed_from}  # fmt: skip


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none when it does not exist)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def identity(run: dict[str, Any]) -> dict[str, str]:
    """A run's ``variant``, ``role`` and arm ``VARIANT-ROLE`` (the records of one variant before ``--variants``
    named the arm by its role alone)."""
    if "role" in run:
        return {k: run[k] for k in ("variant", "role", "arm")}
    return {"variant": run["variant"], "role": run["arm"], "arm": f"{run['variant']}-{run['arm']}"}


def assemble(out: Path) -> dict[str, Any]:
    """``out``'s results: the plan (``plan.json``), each run's records and the summary; a run cut short
    (deadline, or the driver stopped) keeps what it recorded."""
    plan = json.loads((out / "plan.json").read_text())
    for job in plan["jobs"]:  # the folders as they are now, wherever the plan was written
        job["directory"] = str(out / "runs" / Path(job["directory"]).name)
    results = {**plan["header"], "tasks": plan["tasks"], "runs": [collect(job) for job in plan["jobs"]]}
    results["summary"] = summarize(results)
    return results


def join(parts: list[dict[str, Any]], settings_of: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """One grid run in parts (other seeds or tiers, in other calls or on other machines): the parts' results
    as one, its summary over all their runs. Refused, naming what differs, when the parts are not one grid's:
    steps, card, TRL mapping or the settings of their commands (``settings_of``: all but which runs) differ,
    a tier's task or start evaluation differs, or a run (tier, arm, seed) is in two parts. Every run keeps
    the commit it ran at, and ``commits`` lists each commit's runs."""
    first = parts[0]
    for number, part in enumerate(parts[1:], 2):
        for key in ("steps", "card", "pairs"):
            if part.get(key) != first.get(key):
                raise ValueError(f"part {number}'s {key} is {part.get(key)!r}, part 1's {first.get(key)!r}: not one grid")
        ours = settings_of(commands(first)[0])
        for command in commands(part):
            theirs = settings_of(command)
            differing = sorted(key for key in ours.keys() | theirs.keys() if ours.get(key) != theirs.get(key))
            if differing:
                raise ValueError(f"part {number} ran with other settings than part 1: {', '.join(differing)} "
                                 f"({command!r} against {commands(first)[0]!r})")  # fmt: skip
    tasks: dict[str, Any] = {}
    for number, part in enumerate(parts, 1):
        for tier, choice in part["tasks"].items():
            known = tasks.setdefault(tier, choice)
            if (known["task"], known["start"]["accuracy"], known["start"]["mean_length"]) != (
                    choice["task"], choice["start"]["accuracy"], choice["start"]["mean_length"]):
                raise ValueError(f"tier {tier}: part {number} chose {choice['task']} starting at {choice['start']['accuracy']}, "
                                 f"an earlier part {known['task']} at {known['start']['accuracy']}: not one grid")  # fmt: skip
    runs, part_of = [], {}
    for number, part in enumerate(parts, 1):
        for run in part["runs"]:
            key = (run["tier"], identity(run)["arm"], run["seed"])
            if key in part_of:
                raise ValueError(f"{key[0]}-{key[1]}-s{key[2]} is in parts {part_of[key]} and {number}: each run is joined once")
            part_of[key] = number
            runs.append({**run, "commit": run.get("commit") or part.get("commit"), "dirty": run.get("dirty") or part.get("dirty")})
    commits: dict[str, list[str]] = {}
    for run in runs:
        commits.setdefault(run["commit"], []).append(f"{run['tier']}-{identity(run)['arm']}-s{run['seed']}")
    results = {"date": max(part["date"] for part in parts), "steps": first["steps"], "card": first.get("card"),
               "seeds": sorted({seed for part in parts for seed in part["seeds"]}),
               "variants": list(dict.fromkeys(v for part in parts for v in part["variants"])), "pairs": first["pairs"],
               "commands": [command for part in parts for command in commands(part)], "commits": commits, "tasks": tasks,
               "runs": runs}  # fmt: skip
    results["summary"] = summarize(results)
    return results


def commands(results: dict[str, Any]) -> list[str]:
    """The commands that ran ``results``' runs: one, or a join's several."""
    return results.get("commands") or [results["command"]]


def common_step(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """The last evaluated step that both runs reached."""
    steps = {c["step"] for c in a["checkpoints"]} & {c["step"] for c in b["checkpoints"]}
    return max(steps) if steps else None


def at_step(run: dict[str, Any], step: int) -> dict[str, Any]:
    return next(c for c in run["checkpoints"] if c["step"] == step)


def sampled_tail(run: dict[str, Any], step: int, window: int = 20) -> dict[str, float]:
    """Means over the ``window`` steps up to ``step`` of the sampled completions' length, shortest length and at-once share."""
    rows = window_rows(run, step, window)
    return {key: sum(r[key] for r in rows) / len(rows) for key in ("mean_length", "min_length", "at_once_share")} if rows else {}


def window_rows(run: dict[str, Any], step: int, window: int) -> list[dict[str, Any]]:
    """The run's step rows in ``(step - window, step]``."""
    return [r for r in run["rows"] if step - window < r["step"] <= step]


#: The training reward is compared over this many steps up to the common step: each step's reward is the
#: mean of every sampled completion's (256 a step at 32 x 8), so the curve's tail is a finer measure of where
#: a run ended than a greedy evaluation of a few hundred problems.
REWARD_WINDOW = 50


def training_reward(run: dict[str, Any], step: int, window: int = REWARD_WINDOW) -> float | None:
    """The mean task reward of the steps in ``(step - window, step]`` (``None``: a step of them is missing)."""
    rewards = [r["reward"] for r in window_rows(run, step, window)]
    return sum(rewards) / len(rewards) if len(rewards) == window else None


#: The order of a variant's arms in the summary.
ROLES = ("ours", "ours_full", "ours_keep_zero", "trl")


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per tier and variant: each arm's greedy evaluation per seed at the step it shares with TRL (TRL's:
    with the matched arm ``ours``), each of our arms minus TRL by seed (mean and 95% t-interval, paired
    t-test), the sampled completions' lengths near that step, and what the arms leave out of the match."""
    summary = {}
    runs = [{**run, **identity(run)} for run in results["runs"]]
    for tier, choice in results["tasks"].items():
        variants = {}
        for variant in dict.fromkeys(r["variant"] for r in runs if r["tier"] == tier):
            of_variant = [r for r in runs if r["tier"] == tier and r["variant"] == variant]
            variants[variant] = compare_with_trl({(r["role"], r["seed"]): r for r in of_variant}, results["seeds"])
            notes = {r["arm"]: r["note"] for r in of_variant if r.get("note")}
            variants[variant]["notes"] = notes
        start = {k: choice["start"].get(k) for k in ("accuracy", "mean_length", "empty_share")}
        harm = {r["arm"]: [] for r in runs if r["tier"] == tier}
        for run in (r for r in runs if r["tier"] == tier):
            final = harm_check(run["checkpoints"][-1], start, results.get("steps")) if run["checkpoints"] else {"complete": False}
            recorded = bool(run["rows"] or run["checkpoints"])
            harm[run["arm"]].append({"seed": run["seed"], **final,
                                     "status": run_status(final["complete"], run.get("returncode"), recorded)})  # fmt: skip
        summary[tier] = {"task": choice["task"], "start": start, "variants": variants, "harm": harm}
    return summary


#: A run's greedy answers may be this much longer or shorter on average than the start model's.
LENGTH_TOLERANCE = 0.2
#: Ours is "not worse" than TRL when the paired interval's lower end is above minus this (accuracy).
NON_INFERIORITY_MARGIN = 0.05


#: Exit statuses of a run that a deadline stopped (SIGTERM: it checkpointed; SIGKILL), not one that failed.
STOPPED_STATUSES = (-9, -15, 137, 143)


def run_status(complete: bool, returncode: int | None, recorded: bool) -> str:
    """``finished``; ``stopped`` (by a deadline: the same command resumes it); ``failed (exit N)`` (its log
    under ``OUT/logs`` says why); ``not started``. A run whose driver was stopped has no exit status: it
    is ``stopped`` once it recorded a step."""
    if complete:
        return "finished"
    if returncode is None:
        return "stopped" if recorded else "not started"
    return "stopped" if returncode in STOPPED_STATUSES else f"failed (exit {returncode})"


def harm_check(final: dict[str, Any], start: dict[str, Any], steps: int | None) -> dict[str, Any]:
    """Whether a run's last evaluation keeps the start model's behaviour: no more empty greedy answers than at
    the start, a mean greedy length within ``LENGTH_TOLERANCE`` of the start's, and accuracy not below the
    start's by more than twice the start's binomial standard error on these problems, ``2 sqrt(p (1 - p) / n)``
    (1 against 2 correct of 200 is no evidence of harm). ``complete``: the run reached ``steps``."""
    p, n = start["accuracy"], final.get("problems") or 0
    tolerance = 2 * math.sqrt(p * (1 - p) / n) if n else 0.0
    checks = {"non_empty": final["empty_share"] <= start["empty_share"],
              "length": abs(final["mean_length"] - start["mean_length"]) <= LENGTH_TOLERANCE * start["mean_length"],
              "accuracy": final["accuracy"] >= p - tolerance}  # fmt: skip
    return {"step": final["step"], "complete": steps is not None and final["step"] >= steps, "accuracy": final["accuracy"],
            "accuracy_floor": p - tolerance, "mean_length": final["mean_length"], "empty_share": final["empty_share"],
            "checks": checks, "kept": all(checks.values())}  # fmt: skip


def trl_verdict(difference: dict[str, Any]) -> str:
    """Ours minus TRL over seeds: worse (the 95% interval below 0), not worse (its lower end above
    ``-NON_INFERIORITY_MARGIN``) or undetermined; no verdict below 3 seeds, nor from equal differences
    (2 of 50 problems behind on every seed gives an interval of no width, which says nothing)."""
    from grpo_lightning.report.statistics import no_spread

    if len(difference["by_seed"]) < 3:
        return "too few seeds for a verdict"
    if no_spread(difference["by_seed"]):  # an interval of no width: the evaluation's noise is not in it
        return "undetermined (the same difference on every seed: no spread to test against)"
    low, high = difference["ci95"]
    if high < 0:
        return "worse"
    return f"not worse (within {NON_INFERIORITY_MARGIN})" if low > -NON_INFERIORITY_MARGIN else "undetermined"


def compare_with_trl(runs: dict[tuple[str, int], dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """One variant's ``runs`` by ``(role, seed)``: each arm's evaluation per seed and each of ours minus TRL."""
    from grpo_lightning.report.statistics import paired_test, seed_interval

    roles = sorted({role for role, _ in runs}, key=lambda role: ROLES.index(role) if role in ROLES else len(ROLES))
    per_arm: dict[str, list[dict[str, Any]]] = {}
    differences: dict[str, list[float]] = {}
    reward_differences: dict[str, list[float]] = {}
    for seed in seeds:
        trl = runs.get(("trl", seed))
        for role in roles:
            run = runs.get((role, seed))
            other = runs.get(("ours", seed)) if role == "trl" else trl  # TRL against ours, every other arm against TRL
            step = common_step(run, other) if run and other else (run["checkpoints"][-1]["step"] if run and run["checkpoints"] else None)
            if step is None:
                continue
            final, reward = at_step(run, step), training_reward(run, step)
            per_arm.setdefault(run["arm"], []).append({
                "seed": seed, "step": step, "accuracy": final["accuracy"], "mean_length": final["mean_length"],
                "empty_share": final["empty_share"], "weight_change_norm": final.get("weight_change_norm"),
                "sampled": sampled_tail(run, step), "training_reward": reward})  # fmt: skip
            if role != "trl" and other is not None and common_step(run, other) is not None:
                differences.setdefault(run["arm"], []).append(final["accuracy"] - at_step(other, step)["accuracy"])
                trl_reward = training_reward(other, step)
                if reward is not None and trl_reward is not None:
                    reward_differences.setdefault(run["arm"], []).append(reward - trl_reward)

    def paired(by_arm: dict[str, list[float]]) -> dict[str, Any]:
        out = {}
        for arm, by_seed in by_arm.items():
            mean, low, high = seed_interval(by_seed)
            out[arm] = {"by_seed": by_seed, "mean": mean, "ci95": [low, high], "p": paired_test(by_seed)[1]}
        return out

    return {"arms": per_arm, "minus_trl": paired(differences), "training_reward_minus_trl": paired(reward_differences)}


def print_summary(summary: dict[str, Any]) -> None:
    for tier, s in summary.items():
        start = s["start"]
        print(f"{tier} ({s['task']}): start accuracy {start['accuracy']:.3f}, greedy length {start['mean_length']}, "
              f"empty {start['empty_share']}")  # fmt: skip
        for variant, v in s["variants"].items():
            print(f"  {variant}")
            for arm, finals in v["arms"].items():
                cells = ", ".join(f"s{f['seed']}@{f['step']}: {f['accuracy']:.3f} (len {f['mean_length']:.2f}, empty "
                                  f"{f['empty_share']:.2f}, sampled len {f['sampled'].get('mean_length', math.nan):.2f}, at once "
                                  f"{f['sampled'].get('at_once_share', math.nan):.3f})" for f in finals)  # fmt: skip
                print(f"    {arm}: {cells}")
            for arm, d in v["minus_trl"].items():
                print(f"    {arm} - TRL: {[round(x, 3) for x in d['by_seed']]}, mean {d['mean']:+.3f} "
                      f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], p {d['p']:.3f}: {trl_verdict(d)}")  # fmt: skip
            rewards = v.get("training_reward_minus_trl", {})
            for arm, d in rewards.items():
                print(f"    {arm} - TRL, training reward over the last {REWARD_WINDOW} steps: {[round(x, 3) for x in d['by_seed']]}, "
                      f"mean {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], p {d['p']:.3f}: {trl_verdict(d)}")  # fmt: skip
            for arm in (arm for arm in v["minus_trl"] if arm not in rewards and "training_reward_minus_trl" in v):
                print(f"    {arm} - TRL, training reward: not compared (no seed has a row for each of the {REWARD_WINDOW} "
                      "steps up to the compared step on both sides)")  # fmt: skip
            for arm, note in v["notes"].items():
                print(f"    {arm}: {note}")
        for arm, checks in s.get("harm", {}).items():
            cells = ", ".join(f"s{c['seed']}: no evaluation ({c['status']})" if "checks" not in c else
                              f"s{c['seed']}@{c['step']}{'' if c['complete'] else ' (' + c['status'] + ')'}: "
                              f"{'kept' if c['kept'] else 'HARMED: ' + ', '.join(k for k, ok in c['checks'].items() if not ok)}"
                              for c in checks)  # fmt: skip
            print(f"  start model's behaviour, {arm}: {cells}")
