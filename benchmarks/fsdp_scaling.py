"""FSDP scale-out of one workload: per-GPU throughput and step-by-step agreement, in one call.

    python benchmarks/fsdp_scaling.py [--workload W2] [--devices 2] [--steps 4] [--out-dir DIR]

Runs ``benchmarks/run.py`` three times on the same files, one after the other:

1. ``single``: one GPU, no FSDP, weights in the workload's dtype (bf16): the throughput baseline.
2. ``fsdp-1``: one GPU under ``PolicyFSDPStrategy`` (fp32 sharded weights, bf16 compute).
3. ``fsdp-N``: ``--devices`` GPUs under the same strategy, each with ``1 / N`` of the prompts.

All three use keyed sampling (``--rollout-seed``), so a completion depends on its prompt and key,
not on the device that samples it. It prints and writes (``scaling.json``):

* scaling efficiency: generated tokens per second per GPU of ``fsdp-N`` over those of ``single``
  (and over ``fsdp-1``);
* the training metrics of the first steps of ``fsdp-N`` beside ``fsdp-1`` (same numerics, same
  global batch), with their differences: loss, reward, KL, entropy, ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RUN = Path(__file__).with_name("run.py")
COMPARED = ("reward", "reward_std", "loss", "kl", "entropy", "completions/mean_length", "clip_ratio/region")


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=16, help="16 lets W2 fit an 80 GB card")
    parser.add_argument("--rollout-seed", type=int, default=1234)
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
    single = run("single", [*common, "--devices", "1"], out_dir)
    fsdp_one = run("fsdp-1", [*common, "--devices", "1", *fsdp], out_dir)
    fsdp_many = run(f"fsdp-{args.devices}", [*common, "--devices", str(args.devices), *fsdp], out_dir)

    per_gpu = fsdp_many["tokens_per_s_per_device"]
    summary = {
        "workload": args.workload,
        "devices": args.devices,
        "device": single["device"],
        "commit": single["commit"],
        "date": single["date"],
        "command": " ".join(["python", "benchmarks/fsdp_scaling.py", *(sys.argv[1:] if argv is None else argv)]),
        "runs": {name: {k: r[k] for k in ("median_step_s", "tokens_per_s", "tokens_per_s_per_device", "peak_mem_gib", "phases", "command")}
                 for name, r in (("single", single), ("fsdp-1", fsdp_one), (f"fsdp-{args.devices}", fsdp_many))},  # fmt: skip
        "scaling_efficiency": per_gpu / single["tokens_per_s_per_device"],
        "scaling_efficiency_vs_fsdp_1": per_gpu / fsdp_one["tokens_per_s_per_device"],
        "agreement": compare_steps(fsdp_one, fsdp_many),
        "agreement_single_vs_fsdp_1": compare_steps(single, fsdp_one),
    }
    (out_dir / "scaling.json").write_text(json.dumps(summary, indent=2) + "\n")

    print(f"\n{args.workload}: tokens/s per GPU")
    for name, r in summary["runs"].items():
        phases = " / ".join(f"{r['phases'].get(p, float('nan')):.2f}" for p in ("rollout_s", "score_s", "logprob_s", "update_s"))
        print(f"  {name:>8}: {r['tokens_per_s_per_device']:9.1f}  step {r['median_step_s']:.2f} s  "
              f"peak {r['peak_mem_gib']:.1f} GiB  phases {phases}")  # fmt: skip
    print(f"scaling efficiency: {summary['scaling_efficiency']:.3f} (against fsdp-1: {summary['scaling_efficiency_vs_fsdp_1']:.3f})")
    print(f"\nfirst steps, fsdp-1 against fsdp-{args.devices}:")
    for row in summary["agreement"]:
        print(f"  step {row['step']} {row['metric']:>24}: {row['reference']:+.6g} {row['other']:+.6g}  "
              f"|diff| {row['abs_diff']:.2e} (rel {row['rel_diff']:.2e})")  # fmt: skip
    print(json.dumps({k: summary[k] for k in ("scaling_efficiency", "scaling_efficiency_vs_fsdp_1")}))
    return summary


if __name__ == "__main__":
    main()
