"""Three figures on one GPU: on-policy distillation from a GRPO-trained teacher, the difficulty
curriculum on against off, and W5 with token-budget micro-batches against a fixed row count.

    python benchmarks/ecosystem.py learn --seeds 0 1 2 --out OUT --work runs/ecosystem   # distill and curriculum at once
    python benchmarks/ecosystem.py distill --out OUT --work runs/ecosystem               # OUT/distillation.json
    python benchmarks/ecosystem.py curriculum --seeds 0 1 2 --out OUT                    # OUT/curriculum.json
    python benchmarks/ecosystem.py w5 --w5-steps 4 --out OUT                             # OUT/w5.json

``distill`` and ``curriculum`` train SmolLM2-135M-Instruct on reasoning-gym's ``gcd`` (numbers up to
50) with the settings of ``configs/ablation/smollm2_variants.yaml`` (its ``args`` and
``base_configs``), each fit a ``grpo-lightning fit`` process validating on the held-out problems
before its first step and every ``--val-every`` steps (greedy, ``val/accuracy``):

- ``distill``: GRPO fits a teacher; its ``last.ckpt`` is exported (``save_pretrained``); a fresh
  student from the base model distils from that folder (``configs/variant/on_policy_distillation.yaml``,
  ``--model.teacher``), while this process validates the exported teacher on the same problems.
  The JSON names the folders each fit read (from the student's saved ``config.yaml``) and checks
  that the teacher is the export and the student the base model.
- ``curriculum``: GRPO with and without ``grpo_lightning.data.DifficultyCurriculum``, per seed, all
  at once; final accuracy, curves and the curriculum's own metrics.
- ``w5``: ``benchmarks/run.py --workload W5`` once per arm, one after the other (alone on the card):
  ``rows`` (8 completions a pass) and ``tokens`` (a budget of 8 x 2112 tokens a pass, the same bound),
  both packed (``--padding-free``) so that only the micro-batching differs; ``rows_padded`` is W5 as
  in benchmarks/RESULTS.md.

``--smoke MODEL_DIR`` runs ``distill`` and ``curriculum`` on the CPU with a tiny model (the
arithmetic task, a few steps), and ``w5`` as a small W0 with W5's stop lengths (``--smoke`` with
any value): the plumbing, not the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "configs" / "ablation" / "smollm2_variants.yaml"
CURRICULUM = "grpo_lightning.data.DifficultyCurriculum"
#: Scalars kept per fit: validation, reward and, where logged, the distillation's and curriculum's own.
CURVE_TAGS = ("val/accuracy", "reward", "distill/reverse_kl", "distill/teacher_logp", "curriculum/measured",
              "curriculum/too_easy", "curriculum/too_hard", "curriculum/skipped", "perf/step_s")  # fmt: skip
#: W5's rows a pass, and the longest row: prompt and completion tokens.
W5_ROWS, W5_ROW_TOKENS = 8, 64 + 2048
#: W0 made small, with W5's drawn stop lengths: the CPU smoke of the W5 stage.
W5_SMOKE = ["--workload", "W0", "--accelerator", "cpu", "--rollout", "static", "--stop-lengths", "lognormal", "--prompts", "4",
            "--group-size", "4", "--prompt-tokens", "4", "--max-new-tokens", "32", "--threads", "1",
            "--micro-batch-size", str(W5_ROWS)]  # fmt: skip
W5_SMOKE_ROW_TOKENS = 4 + 32
#: The threads that wait for the fits running at once.
FITS = ThreadPoolExecutor(max_workers=16)


@dataclass
class Setup:
    """What every fit shares: the start model, the YAML files after the variant's, the fixed flags."""

    model: str
    base_configs: list[str]
    args: dict[str, Any] = field(default_factory=dict)


def smollm2_setup(val_every: int) -> Setup:
    """The SmolLM2 sweep's task, batch, learning rate and lengths; greedy validation only (no pass@k)."""
    from grpo_lightning.ablation.spec import flatten

    spec = yaml.safe_load(SPEC.read_text())
    args = flatten(spec["args"])
    args.update({"trainer.val_check_interval": val_every, "model.init_args.evaluation.pass_at_k_samples": 0})
    return Setup(spec["model"], [str(ROOT / path) for path in spec["base_configs"]], args)


def smoke_setup(model_dir: str, val_every: int) -> Setup:
    """The tiny model on the CPU: the arithmetic task, 2 prompts x 2 completions of 4 tokens."""
    return Setup(model_dir, [str(ROOT / "configs/trainer/gpu_cells.yaml"), str(ROOT / "configs/data/arithmetic.yaml")], {
        "trainer.accelerator": "cpu", "trainer.precision": "32-true", "trainer.val_check_interval": val_every,
        "data.init_args.num_train": 32, "data.init_args.num_val": 8, "data.init_args.batch_size": 2,
        "model.init_args.sampling.group_size": 2, "model.init_args.sampling.max_new_tokens": 4,
        "model.init_args.optim.micro_batch_size": 4, "model.init_args.evaluation.temperature": 0.0,
    })  # fmt: skip


def fit_args(setup: Setup, variant: str, folder: Path, seed: int, steps: int, extra: dict[str, Any] | None = None) -> list[str]:
    """``grpo-lightning fit``'s arguments for one fit logging into ``folder``: an ablation cell's
    (:func:`~grpo_lightning.ablation.sweep.cell_command`), then ``steps`` and the ``extra`` flags."""
    from grpo_lightning.ablation.spec import Cell, SweepSpec, cli_value
    from grpo_lightning.ablation.sweep import cell_command

    spec = SweepSpec(output_dir=folder.parent, base_configs=[Path(path) for path in setup.base_configs], variants=[variant],
                     seeds=[seed], args={**setup.args, "trainer.max_steps": steps, **(extra or {})})  # fmt: skip
    command = cell_command(spec, Cell(variant, seed), folder, setup.model)
    arguments = command[command.index("fit") + 1 :]
    return [*arguments, "--trainer.enable_progress_bar", cli_value(False)]


def start_fit(arguments: list[str], folder: Path, callbacks: Sequence[str] = ()) -> Future:
    """``python -m grpo_lightning.cli fit ARGUMENTS`` in the background, forked from a process that
    imported the CLI once (as an ablation sweep's cells are), its output in ``folder/train.log``."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = [sys.executable, "-m", "grpo_lightning.cli", "fit", *arguments, *(f"--trainer.callbacks+={c}" for c in callbacks)]
    (folder / "command.json").write_text(json.dumps(command) + "\n")
    return FITS.submit(run_fit, command, folder / "train.log")


def run_fit(command: list[str], log: Path) -> tuple[int, float]:
    """The fit's exit status and seconds."""
    from grpo_lightning.ablation.cell_process import can_fork, run_forked

    started = time.perf_counter()
    if can_fork(command):
        status = run_forked(command, log, dict(os.environ), None)
    else:
        with open(log, "w") as output:
            status = subprocess.run(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT).returncode
    return status, time.perf_counter() - started


def finish(fit: Future, folder: Path) -> dict[str, Any]:
    """Wait for a fit; its exit status, seconds and curves."""
    status, seconds = fit.result()
    if status != 0:
        print(f"{folder.name}: exit status {status}; the end of {folder / 'train.log'}:\n"
              + (folder / "train.log").read_text()[-3000:], file=sys.stderr, flush=True)  # fmt: skip
    return {"folder": str(folder), "exit_status": status, "seconds": round(seconds, 1), "curves": curves(folder)}


def curves(folder: Path) -> dict[str, list[list[float]]]:
    """``tag -> [[step, value], ...]`` of the fit's logged scalars in ``CURVE_TAGS``."""
    from grpo_lightning.ablation.runs import read_scalars

    if not any(folder.glob("events.out.tfevents*")):
        return {}
    scalars = read_scalars(folder)
    return {tag: [[int(s), float(v)] for s, v in zip(scalars[tag].steps, scalars[tag].values)]
            for tag in CURVE_TAGS if tag in scalars}  # fmt: skip


def last_value(fit: dict[str, Any], tag: str) -> float | None:
    points = fit["curves"].get(tag)
    return points[-1][1] if points else None


def first_value(fit: dict[str, Any], tag: str) -> float | None:
    points = fit["curves"].get(tag)
    return points[0][1] if points else None


def median_step_s(fit: dict[str, Any]) -> float | None:
    """Median seconds per optimizer step, the first left out."""
    steps = [value for _, value in fit["curves"].get("perf/step_s", [])][1:]
    return round(statistics.median(steps), 3) if steps else None


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


# ------------------------------------------------------------------ distillation


def export_teacher(fit_folder: Path, output: Path) -> Path:
    """The fit's ``last.ckpt`` as a ``save_pretrained`` folder; the checkpoint is removed afterwards."""
    from grpo_lightning.checkpoints.export import export_checkpoint

    checkpoint = max(fit_folder.rglob("last*.ckpt"), key=lambda path: path.stat().st_mtime)
    shutil.rmtree(output, ignore_errors=True)
    exported = export_checkpoint(checkpoint, output)
    shutil.rmtree(checkpoint.parent, ignore_errors=True)  # the optimizer state: 4x the weights
    return exported


def validate_model(setup: Setup, model: str, folder: Path) -> float:
    """Greedy ``val/accuracy`` of ``model`` on the setup's held-out problems, in this process."""
    from grpo_lightning.cli.app import GRPOLightningCLI

    shutil.rmtree(folder, ignore_errors=True)
    arguments = fit_args(Setup(model, setup.base_configs, setup.args), "grpo", folder, seed=0, steps=1)
    cli = GRPOLightningCLI(args=arguments, run=False)
    return float(cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]["val/accuracy"])


def saved_model_paths(fit_folder: Path) -> dict[str, str | None]:
    """``model`` and ``teacher`` as the fit resolved them (its ``config.yaml``, saved by LightningCLI)."""
    config = yaml.safe_load((fit_folder / "config.yaml").read_text())
    arguments = config["model"]["init_args"]
    return {"model": arguments.get("model"), "teacher": arguments.get("teacher")}


def distill(args: argparse.Namespace, setup: Setup) -> dict[str, Any]:
    """Teacher by GRPO, its export, then the student distilled from the export (see the docstring)."""
    work = args.work / "distill"
    out = args.out / "distillation.json"
    result: dict[str, Any] = {"setup": vars(setup), "teacher_steps": args.teacher_steps, "student_steps": args.student_steps}
    started = time.perf_counter()
    teacher_folder = work / "teacher"
    teacher_fit = start_fit(fit_args(setup, "grpo", teacher_folder, args.seed, args.teacher_steps,
                                     {"trainer.enable_checkpointing": True}), teacher_folder)  # fmt: skip
    import grpo_lightning.checkpoints.export, grpo_lightning.cli.app  # noqa: E401, F401  (while the teacher trains)

    teacher = result["teacher_fit"] = finish(teacher_fit, teacher_folder)
    write_json(out, result)
    if teacher["exit_status"] != 0:
        return result
    export = export_teacher(teacher_folder, work / "teacher_export")
    result["teacher_export"] = str(export)
    result["teacher_ready_s"] = round(time.perf_counter() - started, 1)
    student_folder = work / "student"
    student_process = start_fit(fit_args(setup, "on_policy_distillation", student_folder, args.seed, args.student_steps,
                                         {"model.init_args.teacher": str(export)}), student_folder)  # fmt: skip
    result["teacher_export_accuracy"] = validate_model(setup, str(export), work / "teacher_validation")
    student = finish(student_process, student_folder)
    result["student_fit"] = student
    result["total_s"] = round(time.perf_counter() - started, 1)
    if student["exit_status"] == 0:
        used = saved_model_paths(student_folder)
        result["student_read"] = used
        result["checks"] = {"teacher_is_the_export": used["teacher"] == str(export),
                            "student_starts_from_the_base_model": used["model"] == setup.model,
                            "teacher_is_not_the_base_model": used["teacher"] != setup.model}  # fmt: skip
    result["accuracy"] = {
        "start": first_value(teacher, "val/accuracy"),
        "teacher": last_value(teacher, "val/accuracy"),
        "teacher_export": result["teacher_export_accuracy"],
        "student_start": first_value(student, "val/accuracy"),
        "student": last_value(student, "val/accuracy"),
    }
    result["median_step_s"] = {"teacher": median_step_s(teacher), "student": median_step_s(student)}
    write_json(out, result)
    print(json.dumps({"accuracy": result["accuracy"], "checks": result.get("checks")}), flush=True)
    return result


# ------------------------------------------------------------------ curriculum


def curriculum(args: argparse.Namespace, setup: Setup) -> dict[str, Any]:
    """GRPO with and without the difficulty curriculum, every seed, all fits at once."""
    work = args.work / "curriculum"
    extra = {"data.init_args.num_train": args.num_train} if args.num_train else {}
    arms = {"off": [], "on": [CURRICULUM]}
    started = time.perf_counter()
    running = {(arm, seed): start_fit(fit_args(setup, "grpo", work / f"{arm}-seed{seed}", seed, args.curriculum_steps, extra),
                                      work / f"{arm}-seed{seed}", callbacks)
               for seed in args.seeds for arm, callbacks in arms.items()}  # fmt: skip
    fits = {f"{arm}-seed{seed}": finish(process, work / f"{arm}-seed{seed}") for (arm, seed), process in running.items()}
    result: dict[str, Any] = {"setup": vars(setup), "steps": args.curriculum_steps, "seeds": args.seeds, "num_train": args.num_train,
                              "wall_s": round(time.perf_counter() - started, 1), "fits": fits}  # fmt: skip
    result["summary"] = curriculum_summary(fits, args.seeds)
    write_json(args.out / "curriculum.json", result)
    print(json.dumps(result["summary"]), flush=True)
    return result


def curriculum_summary(fits: dict[str, dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """Per arm: start and final greedy accuracy per seed and their mean; the paired difference on - off."""
    summary: dict[str, Any] = {}
    for arm in ("off", "on"):
        mine = [fits[f"{arm}-seed{seed}"] for seed in seeds]
        final = [last_value(fit, "val/accuracy") for fit in mine]
        summary[arm] = {"start_accuracy": [first_value(fit, "val/accuracy") for fit in mine], "final_accuracy": final,
                        "mean_final_accuracy": _mean(final), "median_step_s": [median_step_s(fit) for fit in mine],
                        "final_skipped": [last_value(fit, "curriculum/skipped") for fit in mine]}  # fmt: skip
    pairs = [(on, off) for on, off in zip(summary["on"]["final_accuracy"], summary["off"]["final_accuracy"])
             if on is not None and off is not None]  # fmt: skip
    summary["on_minus_off"] = [on - off for on, off in pairs]
    summary["mean_on_minus_off"] = _mean(summary["on_minus_off"])
    return summary


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(known) if known else None


def learn(args: argparse.Namespace, setup: Setup) -> dict[str, Any]:
    """``distill`` and ``curriculum`` at once: the teacher trains beside the curriculum's fits."""
    with ThreadPoolExecutor(max_workers=1) as beside:
        compared = beside.submit(curriculum, args, setup)
        return {"distillation": distill(args, setup), "curriculum": compared.result()}


# ------------------------------------------------------------------ W5


def w5_arm_flags(arm: str, row_tokens: int = W5_ROW_TOKENS) -> list[str]:
    """``rows``: ``W5_ROWS`` completions a pass; ``tokens``: a budget of that many longest rows a pass
    (the same bound on memory); both packed. ``rows_padded``: W5 as benchmarks/RESULTS.md has it."""
    budget = ["--micro-batch-tokens", str(W5_ROWS * row_tokens)]
    return {"rows": ["--padding-free"], "tokens": ["--padding-free", *budget], "rows_padded": []}[arm]


def w5_command(arm: str, steps: int, workdir: Path, out: Path, smoke: bool = False) -> list[str]:
    """``benchmarks/run.py --workload W5`` for one arm: our side only, no first-step processes
    (``smoke``: a small W0 with W5's stop lengths on the CPU)."""
    workload = W5_SMOKE if smoke else ["--workload", "W5"]
    flags = w5_arm_flags(arm, W5_SMOKE_ROW_TOKENS if smoke else W5_ROW_TOKENS)
    return [sys.executable, str(ROOT / "benchmarks" / "run.py"), *workload, "--steps", str(steps),
            "--first-step", "none", "--workdir", str(workdir), "--out", str(out), *flags]  # fmt: skip


def w5(args: argparse.Namespace) -> dict[str, Any]:
    """Each arm in turn, alone on the card, until ``--deadline-s``; a summary row per arm."""
    work, deadline = args.work / "w5", time.monotonic() + args.deadline_s
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"steps": args.w5_steps, "arms": {}}
    for arm in args.arms:
        left = deadline - time.monotonic()
        if left < 30:
            result["arms"][arm] = {"skipped": "deadline"}
            continue
        out = work / f"{arm}.json"
        command = w5_command(arm, args.w5_steps, work / "files", out, smoke=args.smoke is not None)
        with open(work / f"{arm}.log", "w") as log:
            try:
                status = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=left).returncode
            except subprocess.TimeoutExpired:
                status = "timeout"
        result["arms"][arm] = {"command": command, "exit_status": status, **w5_row(out)}
        write_json(args.out / "w5.json", result)
    print(json.dumps(result["arms"]), flush=True)
    return result


def w5_row(out: Path) -> dict[str, Any]:
    """What the comparison needs of a run.py result: median step, the first step alone, peak memory."""
    if not out.exists():
        return {}
    run = json.loads(out.read_text())
    return {"median_step_s": run["median_step_s"], "first_step_s": run["step_s"][0], "step_s": run["step_s"],
            "peak_mem_gib": run["peak_mem_gib"], "tokens_per_s": run["tokens_per_s"], "phases": run["phases"],
            "micro_batch_tokens": run.get("micro_batch_tokens"), "engine": run.get("engine")}  # fmt: skip


# ------------------------------------------------------------------ command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["learn", "distill", "curriculum", "w5"])
    parser.add_argument("--out", type=Path, required=True, help="the folder of the JSON results")
    parser.add_argument("--work", type=Path, default=Path("runs/ecosystem"), help="the fits' folders")
    parser.add_argument("--smoke", metavar="MODEL_DIR", default=None, help="a tiny model on the CPU instead of SmolLM2")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a fit flag of every fit (distill, curriculum), e.g. model.init_args.sampling.group_size=4")
    parser.add_argument("--val-every", type=int, default=20, help="optimizer steps between validations")
    parser.add_argument("--seed", type=int, default=0, help="distill: the teacher's and the student's seed")
    parser.add_argument("--teacher-steps", type=int, default=40)
    parser.add_argument("--student-steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="curriculum: seeds of each arm")
    parser.add_argument("--curriculum-steps", type=int, default=40)
    parser.add_argument("--w5-steps", type=int, default=4, help="steps of each W5 run; medians leave out the first")
    parser.add_argument("--num-train", type=int, default=None,
                        help="curriculum: training problems (fewer: more epochs, in which the curriculum skips)")  # fmt: skip
    parser.add_argument("--arms", nargs="+", choices=["rows", "tokens", "rows_padded"], default=["rows", "tokens"], help="w5: the arms, in order")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="w5: start no arm after this, stop one at it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.chdir(ROOT)  # the fits' working directory (the forked ones take this process's)
    if args.stage == "w5":
        return w5(args)
    setup = smoke_setup(args.smoke, args.val_every) if args.smoke else smollm2_setup(args.val_every)
    setup.args.update(flag.split("=", 1) for flag in args.set)
    return {"learn": learn, "distill": distill, "curriculum": curriculum}[args.stage](args, setup)


if __name__ == "__main__":
    main()
