"""FSDP scale-out of one workload: per-GPU throughput and step-by-step agreement, in one call.

    python benchmarks/fsdp_scaling.py [--workload W2] [--devices 2] [--steps 4] [--weak] [--out-dir DIR]
    python benchmarks/fsdp_scaling.py --check-fp32 [--devices 2] [--out-dir DIR]

Runs ``benchmarks/run.py`` several times on the same files, one after the other, all with keyed
sampling (``--rollout-seed``), so a completion depends on its prompt and key, not on the device
that samples it:

1. ``single``: one GPU, no FSDP, weights in the workload's dtype (bf16): the throughput baseline.
2. ``fsdp-1``: one GPU under ``PolicyFSDPStrategy`` (fp32 sharded weights, bf16 compute).
3. ``fsdp-N``: ``--devices`` GPUs under the same strategy, each with ``1 / N`` of the workload's
   prompts (strong scaling: the same global batch).
4. with ``--weak``, ``fsdp-N-weak``: each GPU with all of the workload's prompts (weak scaling: an
   ``N`` times larger global batch).

It prints and writes (``scaling.json``) the scaling efficiency (generated tokens per second per
GPU of an ``N``-GPU run over those of ``single``) and the training metrics of the first steps of
``fsdp-N`` beside ``fsdp-1`` (same numerics, same global batch): loss, reward, KL, entropy, ...

In bf16 the two runs' completions drift apart token by token (another batch shape, other bf16
roundings of the logits, and a near-uniform random model turns each into another sample), so
``--check-fp32`` runs the agreement check alone with ``mixed_precision`` off (fp32 throughout) on a
smaller batch of the same model (``fsdp-1-fp32``, ``fsdp-N-fp32``; ``check_fp32.json``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RUN = Path(__file__).with_name("run.py")
COMPARED = ("reward", "reward_std", "loss", "grad_norm", "kl", "entropy", "completions/mean_length", "clip_ratio/region")


def run(name: str, arguments: list[str], out_dir: Path) -> dict[str, Any]:
    out = out_dir / f"{name}.json"
    command = [sys.executable, str(RUN), *arguments, "--out", str(out)]
    print("running:", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return json.loads(out.read_text())


def compare_steps(reference: dict[str, Any], other: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for step, (a, b) in enumerate(zip(reference["steps_detail"], other["steps_detail"]), start=1):
        for name in COMPARED:
            if name in a and name in b:
                difference = b[name] - a[name]
                scale = max(abs(a[name]), 1e-12)
                rows.append({"step": step, "metric": name, "reference": a[name], "other": b[name],
                             "abs_diff": abs(difference), "rel_diff": abs(difference) / scale})  # fmt: skip
    return rows


def print_agreement(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\nfirst steps, {title}:")
    for row in rows:
        print(f"  step {row['step']} {row['metric']:>24}: {row['reference']:+.6g} {row['other']:+.6g}  "
              f"|diff| {row['abs_diff']:.2e} (rel {row['rel_diff']:.2e})")  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=16, help="16 lets W2 fit an 80 GB card")
    parser.add_argument("--rollout-seed", type=int, default=1234)
    parser.add_argument("--weak", action="store_true", help="also run N GPUs with the whole workload each")
    parser.add_argument("--check-fp32", action="store_true", help="only the fp32 agreement check (see above)")
    parser.add_argument(
        "--fp32-shape", default="--prompts 8 --max-new-tokens 128 --steps 3",
        help="run.py arguments (one string) that shrink the workload for --check-fp32",
    )
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more run.py arguments, for every run")
    args = parser.parse_args(argv)

    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="grpo-scaling-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=f"grpo-bench-{args.workload}-")  # one model and prompt set for all runs
    common = [
        "--workload", args.workload, "--steps", str(args.steps), "--micro-batch-size", str(args.micro_batch_size),
        "--rollout-engine", "static", "--rollout-seed", str(args.rollout_seed), "--workdir", workdir, *args.extra,
    ]  # fmt: skip
    fsdp = ["--strategy", "fsdp", "--dtype", "float32"]
    many = str(args.devices)
    command = " ".join(["python", "benchmarks/fsdp_scaling.py", *(sys.argv[1:] if argv is None else argv)])

    if args.check_fp32:
        fp32 = [*fsdp, "--mixed-precision", "none", *shlex.split(args.fp32_shape)]
        one = run("fsdp-1-fp32", [*common, "--devices", "1", *fp32], out_dir)
        other = run(f"fsdp-{many}-fp32", [*common, "--devices", many, *fp32], out_dir)
        summary = {"workload": args.workload, "devices": args.devices, "device": one["device"], "commit": one["commit"],
                   "date": one["date"], "command": command, "agreement": compare_steps(one, other)}  # fmt: skip
        (out_dir / "check_fp32.json").write_text(json.dumps(summary, indent=2) + "\n")
        print_agreement(f"fsdp-1 against fsdp-{many}, fp32", summary["agreement"])
        return summary

    results = {"single": run("single", [*common, "--devices", "1"], out_dir)}
    results["fsdp-1"] = run("fsdp-1", [*common, "--devices", "1", *fsdp], out_dir)
    results[f"fsdp-{many}"] = run(f"fsdp-{many}", [*common, "--devices", many, *fsdp], out_dir)
    if args.weak:
        prompts = results["single"]["shape"]["prompts"] * args.devices
        weak = [*common, "--devices", many, *fsdp, "--prompts", str(prompts)]
        results[f"fsdp-{many}-weak"] = run(f"fsdp-{many}-weak", weak, out_dir)

    baseline = results["single"]["tokens_per_s_per_device"]
    keys = ("median_step_s", "tokens_per_s", "tokens_per_s_per_device", "peak_mem_gib", "phases", "command", "world_size")
    summary = {
        "workload": args.workload,
        "devices": args.devices,
        "device": results["single"]["device"],
        "commit": results["single"]["commit"],
        "date": results["single"]["date"],
        "command": command,
        "runs": {name: {k: r[k] for k in keys} for name, r in results.items()},
        "scaling_efficiency": {name: r["tokens_per_s_per_device"] / baseline for name, r in results.items() if r["world_size"] > 1},
        "agreement": compare_steps(results["fsdp-1"], results[f"fsdp-{many}"]),
    }
    (out_dir / "scaling.json").write_text(json.dumps(summary, indent=2) + "\n")

    print(f"\n{args.workload}: tokens/s per GPU (phases: rollout / score / log-probs / update, s)")
    for name, r in summary["runs"].items():
        phases = " / ".join(f"{r['phases'].get(p, float('nan')):.2f}" for p in ("rollout_s", "score_s", "logprob_s", "update_s"))
        print(f"  {name:>12}: {r['tokens_per_s_per_device']:9.1f}  step {r['median_step_s']:.2f} s  "
              f"peak {r['peak_mem_gib']:.1f} GiB  phases {phases}")  # fmt: skip
    for name, efficiency in summary["scaling_efficiency"].items():
        print(f"scaling efficiency of {name}: {efficiency:.3f}")
    print_agreement(f"fsdp-1 against fsdp-{many}", summary["agreement"])
    print(json.dumps(summary["scaling_efficiency"]))
    return summary


if __name__ == "__main__":
    main()
