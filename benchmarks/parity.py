"""Equal optimizer steps: grpo-lightning against TRL's ``GRPOTrainer`` on SmolLM2-135M-Instruct, on three
arithmetic tasks that the model starts out good at, poor at, and almost never solves.

Both libraries get the same model, prompts (the recipe's chat template), reward (the last number of
the answer), group size, prompts per step, completion length, temperature, learning rate (constant),
clip range, ``beta``, precision and seed, and run ``--steps`` optimizer steps each
(``configs/recipes/smollm2.yaml``, 32 prompts a step; the TRL side is ``smollm2.py``'s ``trl_config``).
Each run is a subprocess; all of them run at once. Every step logs the reward, the sampled completions'
mean and shortest length in tokens (end of turn included), the share of them that end at once
(one token or none), the policy's entropy and the gradient norm before clipping. Every
``--eval-every`` steps and at the end, the run saves its model and one evaluator (``smollm2.py``'s
``evaluate``, fp32 greedy, 16 tokens) scores it on the task's held-out problems: accuracy, mean answer
length, share of empty answers, and the weights' distance from the start model.

The tasks come from the built-in arithmetic generator (``grpo_lightning.data.arithmetic``). Each tier
tries its candidates in turn and keeps the first whose greedy start accuracy is in the tier's range
(all the start accuracies measured are in the results)::

    python benchmarks/parity.py --steps 200 --seeds 0 1 2 --keep-zero-gradients no_signal --out DIR
    python benchmarks/parity.py --report DIR    # (re)assemble DIR/results.json from the runs' records

``--keep-zero-gradients TIER`` adds, on that tier, a run of ours whose optimizer also steps on a
gradient of exactly zero (the library drops such a step: see ``clip_and_log_gradient_norm``), to see
what that drop changes. ``--deadline-min`` stops the runs still going at that time; the comparison
then uses, per seed, the last evaluated step that both libraries reached. Each run records into
``OUT/runs/``, so ``--report OUT`` assembles the results of runs that were cut short too. Our side runs without
``torch.compile`` (which changes speed, not results): many runs share the machine's CPU cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import Callback

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from budget_race import RACE_TRAINER, recipe_settings  # noqa: E402
from smollm2 import VARIANT_CLASSES, evaluate  # noqa: E402

#: The report's setting: 32 prompts x 8 completions x 16 tokens a step (the recipe has 8 prompts), in
#: micro-batches of 32 on both sides (memory only: 21 runs at once then fit one 140 GB card).
PARITY_SETTINGS = ["data.batch_size=32", "model.optim.micro_batch_size=32"]
#: Arithmetic tasks (``ArithmeticDataModule`` arguments); the held-out problems are never trained on.
CANDIDATES = {
    "add_sub_1digit": {"digits": 1, "operations": "+-", "num_train": 105, "num_val": 50},
    "add_1digit": {"digits": 1, "operations": "+", "num_train": 60, "num_val": 40},
    "add_2digit": {"digits": 2, "operations": "+", "num_train": 2000, "num_val": 200},
    "sub_2digit": {"digits": 2, "operations": "-", "num_train": 2000, "num_val": 200},
    "mul_2digit": {"digits": 2, "operations": "*", "num_train": 2000, "num_val": 200},
    "mul_3digit": {"digits": 3, "operations": "*", "num_train": 2000, "num_val": 200},
}
#: Each tier's candidates, in the order tried, and the range its greedy start accuracy must fall in.
TIERS = {
    "easy": (["add_sub_1digit", "add_1digit"], (0.30, 1.0)),
    "medium": (["add_2digit", "sub_2digit", "mul_2digit"], (0.05, 0.20)),
    "no_signal": (["mul_3digit", "mul_2digit"], (0.0, 0.01)),
}
#: Our engine without compilation: the same arithmetic, and no compile for each of many runs at once.
NO_COMPILE = {"compile": False, "logprob_compile": False, "model_compile": False}
#: Per-step metrics: ours' logged name -> the row's name (TRL logs the same names).
STEP_METRICS = {"reward": "reward", "completions/mean_length": "mean_length", "completions/min_length": "min_length",
                "entropy": "entropy", "grad_norm": "grad_norm", "frac_zero_gradient": "zero_gradient"}  # fmt: skip


def task_settings(model: str | None, overrides: list[str], task: str) -> dict[str, Any]:
    """The recipe with the parity settings, ``overrides`` and ``task``'s problems."""
    items = CANDIDATES[task].items()
    return recipe_settings(model, [*PARITY_SETTINGS, *overrides, *(f"data.{key}={json.dumps(value)}" for key, value in items)])


# ------------------------------------------------------------------ what both sides record


def at_once_share(lengths: list[int]) -> float:
    """The share of completions that end at once: one token (the end of turn) or none."""
    return sum(length <= 1 for length in lengths) / len(lengths)


def step_row(step: int, logged: dict[str, float], lengths: list[int]) -> dict[str, float]:
    """One step's row: the metrics of ``STEP_METRICS`` that ``logged`` has, and the at-once share."""
    row = {"step": step, **{name: float(logged[key]) for key, name in STEP_METRICS.items() if key in logged}}
    return {**row, "at_once_share": at_once_share(lengths)}


class Recorder:
    """Appends step rows and checkpoint evaluations to ``DIRECTORY/rows.jsonl`` and ``checkpoints.jsonl``;
    a checkpoint is saved by ``save(directory)``, scored by ``smollm2.evaluate`` and removed."""

    def __init__(self, directory: str, settings_file: str, start_model: str, device: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.settings = json.loads(Path(settings_file).read_text())
        self.start_model, self.device = start_model, device
        self._start_weights = None
        self.started = time.time()

    def row(self, row: dict[str, float]) -> None:
        self._append("rows.jsonl", {**row, "time_s": round(time.time() - self.started, 2)})

    def checkpoint(self, step: int, save) -> None:
        model = self.directory / f"model-{step}"
        save(str(model))
        result = evaluate(str(model), str(model), self.settings, keep=4, device=self.device)
        result["weight_change_norm"] = self.weight_change_norm(model)
        shutil.rmtree(model)
        self._append("checkpoints.jsonl", {"step": step, **result})
        print(f"step {step}: greedy accuracy {result['accuracy']:.3f}, mean length {result['mean_length']:.2f}, "
              f"empty {result['empty_share']:.3f}", flush=True)  # fmt: skip

    def weight_change_norm(self, model: Path) -> float:
        """The L2 norm of the saved weights minus the start model's (the weights both files hold)."""
        from safetensors.torch import load_file

        if self._start_weights is None:
            self._start_weights = load_file(str(Path(self.start_model) / "model.safetensors"))
        weights = load_file(str(model / "model.safetensors"))
        shared = weights.keys() & self._start_weights.keys()
        return math.sqrt(sum(float((weights[k].float() - self._start_weights[k].float()).pow(2).sum()) for k in shared))

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with open(self.directory / name, "a") as file:
            file.write(json.dumps(record) + "\n")


def is_checkpoint(step: int, every: int, last: int) -> bool:
    return step == last or step % every == 0


# ------------------------------------------------------------------ grpo-lightning


class ParityProbe(Callback):
    """Our side's recorder: a row after every training step, a checkpoint every ``eval_every`` steps and at ``max_steps``."""

    def __init__(self, directory: str, settings_file: str, start_model: str, device: str, eval_every: int,
                 max_steps: int) -> None:  # fmt: skip
        self.recorder = Recorder(directory, settings_file, start_model, device)
        self.eval_every, self.max_steps = eval_every, max_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        self.recorder.row(step_row(step, pl_module.last_step_metrics, pl_module.last_rollout.lengths.tolist()))
        if is_checkpoint(step, self.eval_every, self.max_steps):
            self.recorder.checkpoint(step, pl_module.save_pretrained)


def keeping_zero_gradients(variant: type) -> type:
    """``variant`` whose optimizer also steps on a gradient of exactly zero (as before the library dropped
    such steps): only a non-finite norm drops the gradient."""
    from grpo_lightning.runtime.strategies import clip_policy_gradients

    class KeepingZeroGradients(variant):
        def clip_and_log_gradient_norm(self, optimizer, prompts=()) -> None:
            norm = clip_policy_gradients(self, optimizer, self.optim_options.max_grad_norm)
            if norm is not None:
                self.step_metrics.update("grad_norm", norm)
                if not self.nonfinite.allows(norm, self.global_step, prompts):
                    optimizer.zero_grad(set_to_none=True)
                self.step_metrics.update("frac_zero_gradient", float(bool(norm == 0)))
                self.step_metrics.update("skipped_steps", float(self.nonfinite.skipped), reduce="max")

    KeepingZeroGradients.__name__ = KeepingZeroGradients.__qualname__ = f"{variant.__name__}KeepingZeroGradients"
    return KeepingZeroGradients


def variant_class(name: str) -> type:
    import variants

    return getattr(variants, VARIANT_CLASSES[name])


GRPOKeepingZeroGradients = keeping_zero_gradients(variant_class("grpo"))
DrGRPOKeepingZeroGradients = keeping_zero_gradients(variant_class("dr_grpo"))


def ours_config(settings: dict[str, Any], variant: str, keep_zero: bool, steps: int, probe: dict[str, Any],
                root: Path) -> dict[str, Any]:  # fmt: skip
    """Our fit's configuration: the recipe's model (as ``variant``), data and trainer, ``steps`` steps, the probe."""
    name = VARIANT_CLASSES[variant]
    model = {**settings["model"], "class_path": f"parity.{name}KeepingZeroGradients" if keep_zero else f"variants.{name}"}
    model["init_args"] = {**model["init_args"], "engine": NO_COMPILE}
    trainer = {**settings["trainer"], **RACE_TRAINER, "max_steps": steps, "default_root_dir": str(root),
               "callbacks": [{"class_path": "parity.ParityProbe", "init_args": probe}]}  # fmt: skip
    trainer.pop("val_check_interval", None)
    return {"model": model, "data": settings["data"], "trainer": trainer, "validate_before_fit": False}


def ours_command(config: Path, device: str, seed: int) -> list[str]:
    return [sys.executable, "-c", "from grpo_lightning.cli.app import main; main()", "fit", "--config", f"trainer/{device}",
            "--config", str(config), "--seed_everything", str(seed), "--data.seed", str(seed)]  # fmt: skip


# ------------------------------------------------------------------ TRL


def trl_worker(job: dict[str, Any]) -> None:
    """TRL's ``GRPOTrainer`` on the job's settings for its steps, recording as ours does."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo_lightning.models.sources import load_tokenizer
    from grpo_lightning.rewards import accuracy_reward
    from grpo_lightning.models.policy import load_causal_lm
    from smollm2 import problems, trl_config

    settings = json.loads(Path(job["settings_file"]).read_text())
    model_args = settings["model"]["init_args"]
    tokenizer = load_tokenizer(model_args["model"])
    chat = bool(tokenizer.chat_template)  # as our side formats prompts: the chat template where there is one
    train = problems(settings)["train"].map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}] if chat else row["prompt"]})
    config = trl_config(settings, Path(job["directory"]), job["seed"], job["device"], job["variant"], job["steps"])
    recorder = Recorder(job["directory"], job["settings_file"], job["start_model"], job["eval_device"])
    lengths: list[int] = []

    def accuracy(prompts, completions, answer, completion_ids, **kwargs):
        lengths.extend(len(ids) for ids in completion_ids)
        return accuracy_reward(prompts, completions, answer)

    class Probe(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs and lengths:
                recorder.row(step_row(state.global_step, logs, lengths))
                lengths.clear()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if is_checkpoint(state.global_step, job["eval_every"], job["steps"]):
                recorder.checkpoint(state.global_step, lambda path: (model.save_pretrained(path), tokenizer.save_pretrained(path)))

    policy = load_causal_lm(model_args["model"], model_args.get("policy", {}).get("dtype", "float32"), None)
    trainer = GRPOTrainer(model=policy, reward_funcs=[accuracy], args=config, train_dataset=train,
                          processing_class=tokenizer, callbacks=[Probe()])  # fmt: skip
    trainer.train()


# ------------------------------------------------------------------ driver


def choose_tasks(model: str | None, overrides: list[str], tiers: list[str], device: str) -> dict[str, Any]:
    """Per tier: every candidate tried (its start evaluation) and the one kept (the first in range, else the last)."""
    chosen: dict[str, Any] = {}
    for tier in tiers:
        candidates, (low, high) = TIERS[tier]
        tried = {}
        for task in candidates:
            settings = task_settings(model, overrides, task)
            tried[task] = evaluate(settings["model"]["init_args"]["model"], settings["model"]["init_args"]["model"], settings,
                                   keep=4, device=device)  # fmt: skip
            print(f"{tier}: {task} starts at {tried[task]['accuracy']:.3f}", flush=True)
            if low <= tried[task]["accuracy"] <= high:
                break
        chosen[tier] = {"task": task, "in_range": low <= tried[task]["accuracy"] <= high, "range": [low, high],
                        "data": CANDIDATES[task], "start": tried[task], "tried": {k: v["accuracy"] for k, v in tried.items()}}  # fmt: skip
    return chosen


def save_start_model(model: str, directory: Path) -> str:
    """The start model's weights as a Hugging Face directory (the reference of ``weight_change_norm``)."""
    from grpo_lightning.models.policy import load_causal_lm

    load_causal_lm(model, "float32", None).save_pretrained(str(directory))
    return str(directory)


def plan_jobs(args, chosen: dict[str, Any], work: Path, start_model: str, eval_device: str) -> list[dict[str, Any]]:
    """One job per tier, arm and seed; the settings of each tier in ``work/TIER.json``."""
    jobs = []
    for tier, choice in chosen.items():
        settings_file = work / f"{tier}.json"
        settings_file.write_text(json.dumps(task_settings(args.model, args.set, choice["task"])))
        arms = [*args.arms, *(["ours_keep_zero"] if tier in args.keep_zero_gradients else [])]
        for seed in args.seeds:
            for arm in arms:
                directory = work / f"{tier}-{arm}-s{seed}"
                jobs.append({"tier": tier, "task": choice["task"], "arm": arm, "seed": seed, "variant": args.variant,
                             "steps": args.steps, "eval_every": args.eval_every, "device": args.device,
                             "eval_device": eval_device, "settings_file": str(settings_file), "start_model": start_model,
                             "directory": str(directory)})  # fmt: skip
    return jobs


def job_command(job: dict[str, Any]) -> list[str]:
    directory = Path(job["directory"])
    directory.mkdir(parents=True, exist_ok=True)
    if job["arm"] == "trl":
        (directory / "job.json").write_text(json.dumps(job))
        return [sys.executable, __file__, "--trl-worker", str(directory / "job.json")]
    settings = json.loads(Path(job["settings_file"]).read_text())
    probe = {k: job[k] for k in ("directory", "settings_file", "start_model", "eval_every")}
    probe.update(device=job["eval_device"], max_steps=job["steps"])
    config = ours_config(settings, job["variant"], job["arm"] == "ours_keep_zero", job["steps"], probe, directory)
    (directory / "fit.yaml").write_text(yaml.safe_dump(config))
    return ours_command(directory / "fit.yaml", job["device"], job["seed"])


def run_all(jobs: list[dict[str, Any]], logs: Path, deadline: float) -> None:
    """Start every job at once (each its own process group, output in ``logs``); kill those still running at
    ``deadline`` (SIGKILL: Lightning turns SIGTERM into a stop at the end of the step, which can outlast it)."""
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # fmt: skip
    running = []
    for job in jobs:
        log = open(logs / f"{Path(job['directory']).name}.log", "w")
        running.append((job, subprocess.Popen(job_command(job), env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True)))  # fmt: skip
    while any(process.poll() is None for _, process in running) and time.time() < deadline:
        time.sleep(2)
    for job, process in running:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        job["returncode"] = process.wait()


def collect(job: dict[str, Any]) -> dict[str, Any]:
    """A job's identity, exit status (``None``: not known, the driver was stopped), step rows and checkpoints."""
    directory = Path(job["directory"])

    def records(name: str) -> list[dict[str, Any]]:
        path = directory / name
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    keep = ("tier", "task", "arm", "seed", "variant", "steps", "returncode")
    return {**{k: job.get(k) for k in keep}, "rows": records("rows.jsonl"), "checkpoints": records("checkpoints.jsonl")}


def assemble(out: Path) -> dict[str, Any]:
    """``out``'s results: the plan (``plan.json``), each run's records and the summary; a run cut short
    (deadline, or the driver stopped) keeps what it recorded."""
    plan = json.loads((out / "plan.json").read_text())
    for job in plan["jobs"]:  # the folders as they are now, wherever the plan was written
        job["directory"] = str(out / "runs" / Path(job["directory"]).name)
    results = {**plan["header"], "tasks": plan["tasks"], "runs": [collect(job) for job in plan["jobs"]]}
    results["summary"] = summarize(results)
    return results


# ------------------------------------------------------------------ report


def common_step(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """The last evaluated step that both runs reached."""
    steps = {c["step"] for c in a["checkpoints"]} & {c["step"] for c in b["checkpoints"]}
    return max(steps) if steps else None


def at_step(run: dict[str, Any], step: int) -> dict[str, Any]:
    return next(c for c in run["checkpoints"] if c["step"] == step)


def sampled_tail(run: dict[str, Any], step: int, window: int = 20) -> dict[str, float]:
    """Means over the ``window`` steps up to ``step`` of the sampled completions' length, shortest length and at-once share."""
    rows = [r for r in run["rows"] if step - window < r["step"] <= step]
    return {key: sum(r[key] for r in rows) / len(rows) for key in ("mean_length", "min_length", "at_once_share")} if rows else {}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per tier: start, each arm's greedy evaluation per seed at the step shared with TRL, ours minus TRL by seed
    (mean and 95% t-interval, paired t-test), and the sampled completions' lengths near that step."""
    from grpo_lightning.report.statistics import paired_test, seed_interval

    summary = {}
    for tier, choice in results["tasks"].items():
        runs = {(r["arm"], r["seed"]): r for r in results["runs"] if r["tier"] == tier}
        per_arm: dict[str, list[dict[str, Any]]] = {}
        differences = []
        for seed in results["seeds"]:
            trl = runs.get(("trl", seed))
            for arm in sorted({arm for arm, _ in runs}):
                run = runs.get((arm, seed))
                other = runs.get(("ours", seed)) if arm == "trl" else trl  # TRL against ours, every other arm against TRL
                step = common_step(run, other) if run and other else (run["checkpoints"][-1]["step"] if run and run["checkpoints"] else None)
                if step is None:
                    continue
                final = at_step(run, step)
                per_arm.setdefault(arm, []).append({
                    "seed": seed, "step": step, "accuracy": final["accuracy"], "mean_length": final["mean_length"],
                    "empty_share": final["empty_share"], "weight_change_norm": final.get("weight_change_norm"),
                    "sampled": sampled_tail(run, step)})  # fmt: skip
            if ("ours", seed) in runs and trl and common_step(runs[("ours", seed)], trl) is not None:
                step = common_step(runs[("ours", seed)], trl)
                differences.append(at_step(runs[("ours", seed)], step)["accuracy"] - at_step(trl, step)["accuracy"])
        mean, low, high = seed_interval(differences)
        summary[tier] = {"task": choice["task"], "start": {k: choice["start"].get(k) for k in ("accuracy", "mean_length", "empty_share")},
                         "arms": per_arm, "ours_minus_trl": {"by_seed": differences, "mean": mean, "ci95": [low, high],
                                                             "p": paired_test(differences)[1]}}  # fmt: skip
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    for tier, s in summary.items():
        start = s["start"]
        print(f"{tier} ({s['task']}): start accuracy {start['accuracy']:.3f}, greedy length {start['mean_length']}, "
              f"empty {start['empty_share']}")  # fmt: skip
        for arm, finals in s["arms"].items():
            cells = ", ".join(f"s{f['seed']}@{f['step']}: {f['accuracy']:.3f} (len {f['mean_length']:.2f}, empty "
                              f"{f['empty_share']:.2f}, sampled len {f['sampled'].get('mean_length', math.nan):.2f}, at once "
                              f"{f['sampled'].get('at_once_share', math.nan):.3f})" for f in finals)  # fmt: skip
            print(f"  {arm}: {cells}")
        d = s["ours_minus_trl"]
        print(f"  ours - TRL: {[round(x, 3) for x in d['by_seed']]}, mean {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], p {d['p']:.3f}")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps of every run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tiers", nargs="+", default=list(TIERS), choices=list(TIERS))
    parser.add_argument("--arms", nargs="+", default=["ours", "trl"], choices=["ours", "trl"])
    parser.add_argument("--keep-zero-gradients", nargs="*", default=[], choices=list(TIERS),
                        help="tiers that also get a run of ours that steps on zero gradients")
    parser.add_argument("--variant", default="grpo", choices=["grpo", "dr_grpo"], help="both sides' loss")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="configs/trainer/<device>.yaml; one device")
    parser.add_argument("--model", default=None, help="the recipe's model, replaced (both frameworks)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe setting, e.g. data.num_val=50")
    parser.add_argument("--deadline-min", type=float, default=None, help="stop the runs still going this long after the start")
    parser.add_argument("--out", type=Path, default=Path("parity-results"))
    parser.add_argument("--report", type=Path, default=None,
                        help="only summarise: a results.json, or an --out folder whose runs it assembles into results.json")
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)  # a TRL job's job.json
    args = parser.parse_args(argv)
    if args.trl_worker:
        return trl_worker(json.loads(Path(args.trl_worker).read_text()))
    if args.report:
        results = json.loads(args.report.read_text()) if args.report.is_file() else assemble(args.report)
        if args.report.is_dir():
            (args.report / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        print_summary(results["summary"])
        return results

    started = time.time()
    deadline = started + 60 * args.deadline_min if args.deadline_min else math.inf
    eval_device = "cuda" if args.device == "gpu" else "cpu"
    work = args.out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    header = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "seeds": args.seeds, "variant": args.variant,
              "command": " ".join(["python", "benchmarks/parity.py", *(sys.argv[1:] if argv is None else argv)])}  # fmt: skip
    try:
        tasks = choose_tasks(args.model, args.set, args.tiers, eval_device)
        model = task_settings(args.model, args.set, tasks[args.tiers[0]]["task"])["model"]["init_args"]["model"]
        start_model = save_start_model(model, work / "start")
        jobs = plan_jobs(args, tasks, work, start_model, eval_device)
        plan = {"header": header, "tasks": tasks, "jobs": jobs}
        (args.out / "plan.json").write_text(json.dumps(plan, indent=1))  # a stopped driver's runs can be assembled
        run_all(jobs, args.out / "logs", deadline)
        (args.out / "plan.json").write_text(json.dumps(plan, indent=1))  # with the exit statuses
    finally:
        shutil.rmtree(work / "start", ignore_errors=True)
    results = {**assemble(args.out), "wall_s": time.time() - started}
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print_summary(results["summary"])
    return results


if __name__ == "__main__":
    main()
