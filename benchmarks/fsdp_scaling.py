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
4. with ``--variant NAME=ARGS`` (repeatable), ``fsdp-N-NAME``: ``--devices`` GPUs under the
   strategy with more run.py arguments, e.g. ``--variant sgo="--sharding-strategy SHARD_GRAD_OP"``.
5. with ``--weak``, ``fsdp-N-weak``: each GPU with all of the workload's prompts (weak scaling: an
   ``N`` times larger global batch).

It prints and writes (``scaling.json``) the scaling efficiency (generated tokens per second per
GPU of an ``N``-GPU run over those of ``single``) and the training metrics of the first steps of
``fsdp-N`` beside ``fsdp-1`` (same numerics, same global batch): loss, reward, KL, entropy, ...;
those of each variant beside ``fsdp-1`` under ``variant_agreement``. ``--skip-fsdp-1`` leaves
``fsdp-1`` out (throughput only: no agreement); ``--weak --skip-strong`` runs ``single`` and
``fsdp-N-weak`` alone.

In bf16 the two runs' completions drift apart token by token (another batch shape, other bf16
roundings of the logits, and a near-uniform random model turns each into another sample), so
``--check-fp32`` runs the agreement check alone with ``mixed_precision`` off (fp32 throughout) on a
smaller batch of the same model (``fsdp-1-fp32``, ``fsdp-N-fp32``, and ``single-fp32``: one GPU,
no FSDP). Each run dumps its first step (run.py ``--dump-first-step``, into ``RUN.dump/``), and
``check_fp32.json`` holds, for fsdp-1 against fsdp-N and single against fsdp-1: the step metrics,
how many completions differ (rows matched by prompt text and their index among that prompt's
rows), and the per-parameter gradients of the first step with the largest relative differences;
with each run's first-step gradient norm and TF32 settings.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import shutil
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


def load_dump(directory: Path) -> dict[str, Any]:
    """One run's ``--dump-first-step`` files merged: every rank's rows in rank order, rank 0's
    gradient statistics and TF32 settings."""
    import torch

    files = sorted(directory.glob("rank*.pt"), key=lambda f: int(f.stem.removeprefix("rank")))
    if not files:
        raise SystemExit(f"no first-step dump in {directory}")
    parts = [torch.load(f, weights_only=True) for f in files]
    return {"rows": [row for part in parts for row in part["rows"]], "grads": parts[0]["grads"] or {},
            "grads_at": parts[0]["grads_at"], "tf32": parts[0]["tf32"]}  # fmt: skip


def keyed_completions(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[int]]:
    """Completion token ids by (prompt text, index among the rows of that prompt text)."""
    seen: dict[str, int] = {}
    keyed = {}
    for row in rows:
        index = seen[row["prompt"]] = seen.get(row["prompt"], -1) + 1
        keyed[(row["prompt"], index)] = row["completion"]
    return keyed


def compare_completions(reference: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, Any]:
    """How many matched rows' completions differ, and the first token at which each does."""
    a, b = keyed_completions(reference), keyed_completions(other)
    first_differences = []
    for key in sorted(a.keys() & b.keys()):
        x, y = a[key], b[key]
        if x != y:
            first_differences.append(next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y))))
    return {"rows": len(a.keys() & b.keys()), "differ": len(first_differences), "unmatched": len(a.keys() ^ b.keys()),
            "first_difference": first_differences}  # fmt: skip


def grad_norm(grads: dict[str, dict[str, float]]) -> float:
    return math.sqrt(sum(g["sq_norm"] for g in grads.values()))


def _relative(difference: float, scale: float) -> float:
    return difference / scale if scale > 0 else (0.0 if difference == 0 else math.inf)


def compare_gradients(reference: dict[str, dict[str, float]], other: dict[str, dict[str, float]], top: int = 10) -> dict[str, Any]:
    """The ``top`` parameters with the largest relative difference of gradient norm, and of probe
    dot product. The latter is ``|probe . (g_other - g_reference)| / |g_reference|``: the probe is
    standard normal, so it estimates the relative difference of the gradient vectors themselves,
    which equal norms can hide."""
    rows = []
    for name in sorted(reference.keys() & other.keys()):
        a, b = reference[name], other[name]
        norm, other_norm = math.sqrt(a["sq_norm"]), math.sqrt(b["sq_norm"])
        rows.append({"name": name, "norm": norm, "other_norm": other_norm, "norm_rel_diff": _relative(abs(other_norm - norm), norm),
                     "probe_dot": a["probe_dot"], "other_probe_dot": b["probe_dot"],
                     "probe_rel_diff": _relative(abs(b["probe_dot"] - a["probe_dot"]), norm)})  # fmt: skip
    return {
        "parameters": len(rows),
        "unmatched": sorted(reference.keys() ^ other.keys()),
        "norm": sorted(rows, key=lambda r: r["norm_rel_diff"], reverse=True)[:top],
        "probe": sorted(rows, key=lambda r: r["probe_rel_diff"], reverse=True)[:top],
    }


def check_fp32_report(results: dict[str, dict[str, Any]], dumps: dict[str, dict[str, Any]], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Step metrics, completions and first-step gradients of each (reference, other) pair of runs."""
    (one, other), *rest = pairs
    report: dict[str, Any] = {"agreement": compare_steps(results[one], results[other])}
    report["agreement_pairs"] = {f"{a} vs {b}": compare_steps(results[a], results[b]) for a, b in rest}
    report["completions"] = {f"{a} vs {b}": compare_completions(dumps[a]["rows"], dumps[b]["rows"]) for a, b in pairs}
    report["grad_norm"] = {name: grad_norm(dump["grads"]) for name, dump in dumps.items()}
    report["logged_grad_norm"] = {name: r["steps_detail"][0].get("grad_norm") for name, r in results.items()}
    report["gradients"] = {f"{a} vs {b}": compare_gradients(dumps[a]["grads"], dumps[b]["grads"]) for a, b in pairs}
    report["tf32"] = {name: dump["tf32"] for name, dump in dumps.items()}
    return report


def print_check_fp32(report: dict[str, Any]) -> None:
    for pair, c in report["completions"].items():
        print(f"\ncompletions, {pair}: {c['differ']} of {c['rows']} rows differ ({c['unmatched']} unmatched)"
              + (f", first differing tokens at {c['first_difference']}" if c["differ"] else ""))  # fmt: skip
    print("\nfirst-step gradient norm (from the dumps; as logged):")
    for name, norm in report["grad_norm"].items():
        print(f"  {name:>16}: {norm:.8g}  {report['logged_grad_norm'].get(name)}")
    for pair, g in report["gradients"].items():
        for key, value, title in (("norm", "norm", "gradient norm"), ("probe", "probe_dot", "probe dot product, over |g|")):
            print(f"\nlargest relative differences of {title}, {pair}:")
            for row in g[key]:
                print(f"  {row[key + '_rel_diff']:.2e}  {row['name']}  ({row[value]:+.6g} {row['other_' + value]:+.6g})")
    print("\nTF32:")
    for name, flags in report["tf32"].items():
        print(f"  {name:>16}: {json.dumps(flags)}")


def scaling_summary(results: dict[str, dict[str, Any]], many: str, variants: list[str]) -> dict[str, Any]:
    """Each run's figures, the scaling efficiency of the multi-GPU runs against ``single``, and
    (when ``fsdp-1`` ran) the step-by-step agreement of ``fsdp-N`` and of each variant with it."""
    baseline = results["single"]["tokens_per_s_per_device"]
    keys = ("median_step_s", "tokens_per_s", "tokens_per_s_per_device", "peak_mem_gib", "phases", "command", "world_size")
    summary: dict[str, Any] = {
        "runs": {name: {k: r[k] for k in keys} for name, r in results.items()},
        "scaling_efficiency": {name: r["tokens_per_s_per_device"] / baseline for name, r in results.items() if r["world_size"] > 1},
    }
    if "fsdp-1" in results:
        summary["agreement"] = compare_steps(results["fsdp-1"], results[f"fsdp-{many}"])
        summary["variant_agreement"] = {v: compare_steps(results["fsdp-1"], results[f"fsdp-{many}-{v}"]) for v in variants}
    return summary


def parse_variant(value: str) -> tuple[str, list[str]]:
    name, equals, arguments = value.partition("=")
    if not equals or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise argparse.ArgumentTypeError(f"expected NAME=ARGS with NAME of letters, digits, '_', '.', '-': {value!r}")
    return name, shlex.split(arguments)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=16, help="16 lets W2 fit an 80 GB card")
    parser.add_argument("--rollout-seed", type=int, default=1234)
    parser.add_argument("--weak", action="store_true", help="also run N GPUs with the whole workload each")
    parser.add_argument("--skip-strong", action="store_true", help="with --weak: no fsdp-1 or fsdp-N run (weak scaling only)")
    parser.add_argument("--check-fp32", action="store_true", help="only the fp32 agreement check (see above)")
    parser.add_argument(
        "--fp32-shape", default="--prompts 8 --max-new-tokens 128 --steps 3",
        help="run.py arguments (one string) that shrink the workload for --check-fp32",
    )
    parser.add_argument(
        "--variant", type=parse_variant, action="append", default=[], metavar="NAME=ARGS",
        help="also run fsdp-N-NAME: N GPUs under FSDP with these run.py arguments (one shell-quoted string); repeatable",
    )
    parser.add_argument("--skip-fsdp-1", action="store_true", help="no fsdp-1 run (throughput only: no agreement)")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more run.py arguments, for every run")
    args = parser.parse_args(argv)
    if args.check_fp32 and (args.variant or args.skip_fsdp_1 or args.weak):
        parser.error("--check-fp32 runs alone: no --variant, --skip-fsdp-1 or --weak")
    if args.skip_strong and not args.weak:
        parser.error("--skip-strong needs --weak")
    if len({name for name, _ in args.variant}) < len(args.variant):
        parser.error("--variant: each NAME once")

    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="grpo-scaling-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=f"grpo-bench-{args.workload}-")  # one model and prompt set for all runs
    common = [
        "--workload", args.workload, "--steps", str(args.steps), "--micro-batch-size", str(args.micro_batch_size),
        "--rollout", "static", "--rollout-seed", str(args.rollout_seed), "--workdir", workdir, "--first-step", "none", *args.extra,
    ]  # fmt: skip
    fsdp = ["--strategy", "fsdp", "--dtype", "float32"]
    many = str(args.devices)
    command = " ".join(["python", "benchmarks/fsdp_scaling.py", *(sys.argv[1:] if argv is None else argv)])

    if args.check_fp32:
        shape = shlex.split(args.fp32_shape)
        runs = {
            "fsdp-1-fp32": [*common, "--devices", "1", *fsdp, "--mixed-precision", "none", *shape],
            f"fsdp-{many}-fp32": [*common, "--devices", many, *fsdp, "--mixed-precision", "none", *shape],
            # The sharded policy takes the unfused LM head: so does this run, for the same arithmetic.
            "single-fp32": [*common, "--devices", "1", "--dtype", "float32", "--fused-lm-head", "off", *shape],
        }
        results, dumps = {}, {}
        for name, arguments in runs.items():
            dump = out_dir / f"{name}.dump"
            shutil.rmtree(dump, ignore_errors=True)  # no rank files of an earlier call
            results[name] = run(name, [*arguments, "--dump-first-step", str(dump)], out_dir)
            dumps[name] = load_dump(dump)
        one = results["fsdp-1-fp32"]
        pairs = [("fsdp-1-fp32", f"fsdp-{many}-fp32"), ("single-fp32", "fsdp-1-fp32")]
        summary = {"workload": args.workload, "devices": args.devices, "device": one["device"], "commit": one["commit"],
                   "date": one["date"], "command": command, **check_fp32_report(results, dumps, pairs)}  # fmt: skip
        (out_dir / "check_fp32.json").write_text(json.dumps(summary, indent=2) + "\n")
        print_agreement(f"fsdp-1 against fsdp-{many}, fp32", summary["agreement"])
        for pair, rows in summary["agreement_pairs"].items():
            print_agreement(f"{pair}, fp32", rows)
        print_check_fp32(summary)
        return summary

    results = {"single": run("single", [*common, "--devices", "1"], out_dir)}
    if not (args.skip_fsdp_1 or args.skip_strong):
        results["fsdp-1"] = run("fsdp-1", [*common, "--devices", "1", *fsdp], out_dir)
    if not args.skip_strong:
        results[f"fsdp-{many}"] = run(f"fsdp-{many}", [*common, "--devices", many, *fsdp], out_dir)
    for name, arguments in args.variant:
        results[f"fsdp-{many}-{name}"] = run(f"fsdp-{many}-{name}", [*common, "--devices", many, *fsdp, *arguments], out_dir)
    if args.weak:
        prompts = results["single"]["shape"]["prompts"] * args.devices
        weak = [*common, "--devices", many, *fsdp, "--prompts", str(prompts)]
        results[f"fsdp-{many}-weak"] = run(f"fsdp-{many}-weak", weak, out_dir)

    summary = {
        "workload": args.workload,
        "devices": args.devices,
        "device": results["single"]["device"],
        "commit": results["single"]["commit"],
        "date": results["single"]["date"],
        "command": command,
        **scaling_summary(results, many, [name for name, _ in args.variant]),
    }
    (out_dir / "scaling.json").write_text(json.dumps(summary, indent=2) + "\n")

    width = max(map(len, summary["runs"]))
    print(f"\n{args.workload}: tokens/s per GPU (phases: rollout / score / log-probs / update, s)")
    for name, r in summary["runs"].items():
        phases = " / ".join(f"{r['phases'].get(p, float('nan')):.2f}" for p in ("rollout_s", "score_s", "logprob_s", "update_s"))
        print(f"  {name:>{width}}: {r['tokens_per_s_per_device']:9.1f}  step {r['median_step_s']:.2f} s  "
              f"peak {r['peak_mem_gib']:.1f} GiB  phases {phases}")  # fmt: skip
    for name, efficiency in summary["scaling_efficiency"].items():
        print(f"scaling efficiency of {name}: {efficiency:.3f}")
    if "agreement" in summary:
        print_agreement(f"fsdp-1 against fsdp-{many}", summary["agreement"])
        for name, rows in summary["variant_agreement"].items():
            print_agreement(f"fsdp-1 against fsdp-{many}-{name}", rows)
    print(json.dumps(summary["scaling_efficiency"]))
    return summary


if __name__ == "__main__":
    main()
