"""Spread of each variant's gain over the warm start, across seeds and machine-like differences.

Runs the fits of ``tests/end_to_end/test_learning.py`` (the quickstart configs, the cached
warm start, greedy validation on the 200 held-out problems) for every variant, over several
``seed_everything`` values, intra-op thread counts and CPU kernel paths, and reports per variant
and step count the mean gain, its standard deviation and its minimum.

Machines differ in the vectorised kernels torch picks for their CPU (AVX-512, AVX2, Arm, ...),
which round differently: the warm start itself then ends elsewhere. ``ATEN_CPU_CAPABILITY``
forces one of those paths on this machine, so each ``--capabilities`` entry stands for another
machine (with its own warm start, cached in its own folder); ``native`` leaves torch's choice.

    python benchmarks/learning_spread.py --seeds 0 1 2 3 4 --capabilities native avx2 default

Each fit appends one line to ``runs.jsonl`` under ``--out`` (fits already there are skipped, so
an interrupted run resumes); the summary goes to ``summary-steps<N>.json`` there and to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "learning_spread"


def fit_args(model_dir: str, variant: str, steps: int, every: int, seed: int, log_dir: str) -> list[str]:
    """The test's fit (``tests/end_to_end/test_learning.py``), validated every ``every`` steps."""
    from grpo_lightning.quickstart import quickstart_args

    return quickstart_args(
        model_dir,
        variant,
        [
            f"--seed_everything={seed}",
            f"--trainer.max_steps={steps}",
            f"--trainer.val_check_interval={every}",
            f"--trainer.logger.init_args.save_dir={log_dir}",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]",
            "--trainer.enable_progress_bar=false",
        ],
    )


def worker(args: argparse.Namespace) -> None:
    """Fit every variant once for one (capability, threads, seed); one JSON line per fit."""
    import torch
    from lightning.pytorch.callbacks import Callback

    from grpo_lightning.cli.app import GRPOLightningCLI
    from grpo_lightning.quickstart.cached_build import read_marker
    from grpo_lightning.quickstart.warmstart import warm_start

    torch.set_num_threads(args.threads)
    model_dir = str(warm_start())
    marker = read_marker(model_dir)

    class Record(Callback):
        def __init__(self) -> None:
            self.accuracy: dict[int, float] = {}

        def on_validation_end(self, trainer, pl_module) -> None:
            if not trainer.sanity_checking:
                self.accuracy[trainer.global_step] = trainer.callback_metrics["val/accuracy"].item()

    def validate(cli, temperature: float) -> float:
        """Validation accuracy, greedy (0) or sampled once per prompt at ``temperature`` (seeded)."""
        cli.model.val_sampling = dataclasses.replace(cli.model.val_sampling, temperature=temperature)
        torch.manual_seed(0)
        return cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]["val/accuracy"]

    with tempfile.TemporaryDirectory() as logs:
        cli = GRPOLightningCLI(args=fit_args(model_dir, "grpo", 1, 1, 0, logs), run=False)
        warm = validate(cli, 0.0)
        warm_sampled = validate(cli, 1.0)
        for variant in args.variants:
            started = time.perf_counter()
            cli = GRPOLightningCLI(args=fit_args(model_dir, variant, args.steps, args.every, args.seed, logs), run=False)
            record = Record()
            cli.trainer.callbacks.append(record)
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
            after = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]["val/accuracy"]
            after_sampled = validate(cli, 1.0)
            row = {
                "capability": args.capability,
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "threads": args.threads,
                "seed": args.seed,
                "variant": variant,
                "steps": args.steps,
                "every": args.every,
                "warm_start_accuracy": warm,
                "warm_start_steps": marker["stopped_at"],
                "accuracy_during_fit": record.accuracy,
                "optimizer_steps": cli.trainer.global_step,
                "accuracy": after,
                "warm_start_sampled_accuracy": warm_sampled,
                "sampled_accuracy": after_sampled,
                "seconds": round(time.perf_counter() - started, 1),
            }
            print("ROW " + json.dumps(row), flush=True)


def run_key(row: dict) -> tuple:
    return row["capability"], row["threads"], row["seed"], row["variant"], row["steps"], row["every"]


def summarize(rows: list[dict], variants: list[str], sampled: bool = False) -> dict:
    """Per variant: gains over the warm start after the fit, their mean, std and min."""
    after, before = ("sampled_accuracy", "warm_start_sampled_accuracy") if sampled else ("accuracy", "warm_start_accuracy")
    summary: dict[str, dict] = {}
    for variant in variants:
        gains = [row[after] - row[before] for row in rows if row["variant"] == variant and after in row]
        if not gains:
            continue
        mean = statistics.fmean(gains)
        std = statistics.stdev(gains) if len(gains) > 1 else float("nan")
        paths = {}
        for capability in sorted({row["capability"] for row in rows}):
            mine = [row[after] - row[before] for row in rows if row["variant"] == variant and row["capability"] == capability and after in row]
            if len(mine) > 1:
                path_mean, path_std = statistics.fmean(mine), statistics.stdev(mine)
                paths[capability] = {
                    "runs": len(mine),
                    "mean_gain": round(path_mean, 4),
                    "std": round(path_std, 4),
                    "min": round(min(mine), 4),
                    "mean_minus_3std": round(path_mean - 3 * path_std, 4),
                }
        summary[variant] = {
            "runs": len(gains),
            "mean_gain": round(mean, 4),
            "std": round(std, 4),
            "min": round(min(gains), 4),
            "mean_minus_3std": round(mean - 3 * std, 4),
            # Each kernel path stands for a class of machines, each deterministic: the worst class decides.
            "worst_path_mean_minus_3std": round(min((p["mean_minus_3std"] for p in paths.values()), default=float("nan")), 4),
            "per_path": paths,
        }
    return summary


def environment() -> dict:
    import platform

    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "native_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
    }


def report(args: argparse.Namespace, rows: list[dict], quiet: bool = False) -> None:
    """Write ``summary-steps<N>.json`` under ``--out`` and print the table."""
    summary = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "environment": environment(),
        "fit": f"tests/end_to_end/test_learning.py's fit: {args.steps} optimizer steps (validated every "
        f"{args.every} batches during the fit); gain = greedy validation accuracy after the fit minus the warm start's",
        "warm_starts": {
            cap: sorted({(row["warm_start_accuracy"], row["warm_start_steps"]) for row in rows if row["capability"] == cap})
            for cap in sorted({row["capability"] for row in rows})
        },
        "per_variant": summarize(rows, args.variants),
        "per_variant_sampled": summarize(rows, args.variants, sampled=True),
    }
    (args.out / f"summary-steps{args.steps}.json").write_text(json.dumps(summary, indent=2) + "\n")
    if quiet:
        return
    for key, name in (("per_variant", "greedy"), ("per_variant_sampled", "sampled at T=1")):
        print(f"\n{name}, {args.steps} steps")
        print(f"{'variant':>8} {'runs':>4} {'mean':>7} {'std':>6} {'min':>7} {'mean-3std':>9} {'worst path':>10}")
        for variant, stats in summary[key].items():
            print(
                f"{variant:>8} {stats['runs']:>4} {stats['mean_gain']:>7.3f} {stats['std']:>6.3f} "
                f"{stats['min']:>7.3f} {stats['mean_minus_3std']:>9.3f} {stats['worst_path_mean_minus_3std']:>10.3f}"
            )
            for path, by_path in stats["per_path"].items():
                print(
                    f"{'':>8} {by_path['runs']:>4} {by_path['mean_gain']:>7.3f} {by_path['std']:>6.3f} "
                    f"{by_path['min']:>7.3f} {by_path['mean_minus_3std']:>9.3f} {path:>10}"
                )


def main(argv: list[str] | None = None) -> None:
    from grpo_lightning.quickstart import VARIANTS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--capabilities", nargs="+", default=["native", "avx2", "default"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1], help="intra-op threads of every fit")
    parser.add_argument(
        "--extra-threads", nargs="*", type=int, default=[2], help="also these thread counts, native kernels only"
    )
    parser.add_argument("--extra-seeds", nargs="*", type=int, default=[0, 1], help="seeds of the --extra-threads fits")
    parser.add_argument("--steps", type=int, default=60, help="fit length (the test's STEPS)")
    parser.add_argument(
        "--every", type=int, default=None, help="validate every this many steps (default: --steps, as the test does)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cache", type=Path, default=None, help="warm-start caches (default: a folder under --out)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--capability", default="native", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.every = args.every or args.steps
    if args.worker:
        args.threads = args.threads[0]
        worker(args)
        return

    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache or Path(tempfile.gettempdir()) / "learning_spread_cache"
    runs = args.out / "runs.jsonl"
    rows = [json.loads(line) for line in runs.read_text().splitlines()] if runs.exists() else []
    rows = [row for row in rows if (row["steps"], row["every"]) == (args.steps, args.every)]
    done = {run_key(row) for row in rows}
    plan = []
    for seed in args.seeds:
        plan += [(capability, threads, seed) for capability in args.capabilities for threads in args.threads]
        if seed in args.extra_seeds:
            plan += [("native", threads, seed) for threads in args.extra_threads if threads not in args.threads]
    for capability, threads, seed in plan:
        todo = [v for v in args.variants if (capability, threads, seed, v, args.steps, args.every) not in done]
        if not todo:
            continue
        env = {**os.environ, "GRPO_LIGHTNING_CACHE": str(cache / capability), "PYTHONUNBUFFERED": "1"}
        env.pop("ATEN_CPU_CAPABILITY", None)
        if capability != "native":
            env["ATEN_CPU_CAPABILITY"] = capability
        command = [sys.executable, __file__, "--worker", "--capability", capability, "--threads", str(threads)]
        command += ["--seed", str(seed), "--steps", str(args.steps), "--every", str(args.every), "--variants", *todo]
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in process.stdout:
            if line.startswith("ROW "):
                row = json.loads(line[4:])
                rows.append(row)
                with runs.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                gain = row["accuracy"] - row["warm_start_accuracy"]
                print(
                    f"{capability:>7} t{threads} seed {seed} {row['variant']:>8}: {row['warm_start_accuracy']:.3f} -> "
                    f"{row['accuracy']:.3f} ({gain:+.3f}, {row['optimizer_steps']} steps, {row['seconds']} s); T=1 "
                    f"{row['warm_start_sampled_accuracy']:.3f} -> {row['sampled_accuracy']:.3f}",
                    flush=True,
                )
        if process.wait():
            print(f"worker {capability} t{threads} seed {seed} failed ({process.returncode})", flush=True)
        report(args, rows, quiet=True)

    report(args, rows)


if __name__ == "__main__":
    main()
