"""Equal optimizer steps: grpo-lightning against TRL's ``GRPOTrainer`` on SmolLM2-135M-Instruct, on three
arithmetic tasks that the model starts out good at, poor at, and almost never solves, for GRPO,
Dr. GRPO and DAPO (``--variants``), each against TRL's matching ``loss_type``.

Both libraries get the same model, prompts (the recipe's chat template), reward (the last number of
the answer; ``--set model.rewards.funcs=[module.function]`` gives both another), group size, prompts
per step, completion length, temperature, learning rate (constant), precision and seed, and run
``--steps`` optimizer steps each (``configs/recipes/smollm2.yaml``, 32 prompts a step; the TRL side
is ``smollm2.py``'s ``trl_config``). The algorithm is our preset's
(``configs/variant/<variant>.yaml``) as the recipe resolves it: ``parity_trl.py`` maps its loss,
advantage scaling, clip range, ``beta``, truncation mask and DAPO's overlong shaping to TRL's settings
and refuses a setting it cannot express. Each variant runs as the arms ``VARIANT-ours`` (matched to TRL)
and ``VARIANT-trl``; where the match turns off a part of the preset that TRL lacks (DAPO's dynamic
sampling), ``VARIANT-ours_full`` runs the preset as it is, and its results carry a note that it has no
TRL counterpart. Each run is a subprocess; all of them run at once. Every step logs the reward (the
task's, before length shaping), the sampled completions' mean and shortest length in tokens (end of
turn included), the share of them that end at once (one token or none), the policy's entropy and the
gradient norm before clipping. Every ``--eval-every`` steps and at the end, the run saves its model and
one evaluator (``smollm2.py``'s ``evaluate``, fp32 greedy, 16 tokens) scores it on the task's held-out
problems: accuracy, mean answer length, share of empty answers, and the weights' distance from the
start model.

The tasks come from the built-in arithmetic generator (``grpo_lightning.data.arithmetic``). Each tier
tries its candidates in turn and keeps the first whose greedy start accuracy is in the tier's range
(all the start accuracies measured are in the results)::

    python benchmarks/parity.py --steps 200 --seeds 0 1 2 --variants grpo dr_grpo dapo --out DIR
    python benchmarks/parity.py --report DIR    # (re)assemble DIR/results.json from the runs' records
    python benchmarks/parity.py --seeds 3 4 --tasks-from A/results.json --out B ...  # more seeds of grid A
    python benchmarks/parity.py --report A/results.json B/results.json --out C/results.json  # one grid, in parts

``--keep-zero-gradients TIER`` adds, on that tier, a run of ours whose optimizer also steps on a
gradient of exactly zero (the library drops such a step: see ``clip_and_log_gradient_norm``), to see
what that drop changes. Each run records into ``OUT/runs/``, so ``--report OUT`` assembles the
results of runs that were cut short too (``parity_report.py``: each variant's arms against its own TRL
run, at the last evaluated step both reached). Our side runs without ``torch.compile`` (which changes
speed, not results): many runs share the machine's CPU cores.

Across several calls (a machine with a time limit per command): the same command on the same ``--out``
continues every run from its checkpoint until all reach ``--steps``; a run that finished is not started
again, and the tasks chosen by the first call are kept::

    python benchmarks/parity.py --steps 200 --deadline-min 9 --out DIR   # again, until all runs finished

Each run saves its whole training state every ``--checkpoint-every`` steps into ``RUN/trainer/``, only
the newest kept (about 1.6 GB for SmolLM2 with AdamW, twice that while the next is written; removed
once the run finishes): ours ``last.ckpt`` (Lightning's ``--ckpt_path`` resume: model, optimizer,
scheduler, callbacks, counters, data order), TRL's ``checkpoint-N`` (``resume_from_checkpoint``: model,
optimizer, scheduler, RNG). ``--stop-margin-min`` before ``--deadline-min`` the runs get SIGTERM: each
ends its step, checkpoints and exits; those left at the deadline get SIGKILL and lose the steps since
their checkpoint. A resumed run drops the records of steps after its checkpoint (they are done again),
so each step is recorded once; on the tiny model of the tests both sides resume exactly (the rows of
an uninterrupted run). The results give each run's ``resumes`` and ``resumed_from`` steps. Keep
``--deadline-min`` inside the time limit: runs left by a driver killed before its deadline are ended
when the next call starts.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import shutil
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import Callback

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from budget_race import RACE_TRAINER, recipe_settings  # noqa: E402
from parity_report import assemble, join, print_summary, records, summarize  # noqa: E402
from parity_trl import VARIANTS, mapping, matched_arguments, preset_class  # noqa: E402
from smollm2 import evaluate  # noqa: E402

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
#: Where a run keeps its checkpoint to resume from: ours ``RUN/trainer/last.ckpt``, TRL's ``RUN/trainer/checkpoint-N``.
TRAINER_FOLDER = "trainer"
#: Per-step metrics: ours' logged name -> the row's name (TRL logs the same names).
STEP_METRICS = {"reward": "reward", "completions/mean_length": "mean_length", "completions/min_length": "min_length",
                "entropy": "entropy", "grad_norm": "grad_norm", "frac_zero_gradient": "zero_gradient",
                "sampling/behaviour_kl": "behaviour_kl", "sampling/masked_fraction": "masked_fraction",
                "rollout/staleness": "staleness"}  # fmt: skip


def task_settings(model: str | None, overrides: list[str], task: str) -> dict[str, Any]:
    """The recipe with the parity settings, ``overrides`` and ``task``'s problems."""
    items = CANDIDATES[task].items()
    return recipe_settings(model, [*PARITY_SETTINGS, *overrides, *(f"data.{key}={json.dumps(value)}" for key, value in items)])


# ------------------------------------------------------------------ what both sides record


def at_once_share(lengths: list[int]) -> float:
    """The share of completions that end at once: one token (the end of turn) or none."""
    return sum(length <= 1 for length in lengths) / len(lengths) if lengths else math.nan


def step_row(step: int, logged: dict[str, float], lengths: list[int]) -> dict[str, float]:
    """One step's row: the metrics of ``STEP_METRICS`` that ``logged`` has, and the at-once share."""
    row = {"step": step, **{name: float(logged[key]) for key, name in STEP_METRICS.items() if key in logged}}
    return {**row, "at_once_share": at_once_share(lengths)}


class Recorder:
    """Appends step rows and checkpoint evaluations to ``DIRECTORY/rows.jsonl`` and ``checkpoints.jsonl``;
    a checkpoint is saved by ``save(directory)``, scored by ``smollm2.evaluate`` and removed. A row's
    ``time_s`` counts the run's recorded steps across resumes (steps lost to a kill not counted)."""

    def __init__(self, directory: str, settings_file: str, start_model: str, device: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.settings = json.loads(Path(settings_file).read_text())
        self.start_model, self.device = start_model, device
        self._start_weights = None
        self.started = time.time()

    def resume_at(self, step: int) -> None:
        """Record from ``step`` on (0: a fresh start): the records of later steps, which a stop lost with the
        state that made them, are dropped, and the start is noted in ``starts.jsonl``."""
        rows = self._keep_up_to("rows.jsonl", step)
        self._keep_up_to("checkpoints.jsonl", step)
        self.started = time.time() - (rows[-1]["time_s"] if rows else 0.0)
        self._append("starts.jsonl", {"step": step, "date": time.strftime("%Y-%m-%d %H:%M:%S")})

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

    def _keep_up_to(self, name: str, step: int) -> list[dict[str, Any]]:
        """Rewrite ``name`` with its records of steps up to ``step`` (atomically); those records."""
        kept = [record for record in records(self.directory / name) if record["step"] <= step]
        temporary = self.directory / f".{name}.tmp"
        temporary.write_text("".join(json.dumps(record) + "\n" for record in kept))
        os.replace(temporary, self.directory / name)
        return kept


def is_checkpoint(step: int, every: int, last: int) -> bool:
    return step == last or step % every == 0


# ------------------------------------------------------------------ grpo-lightning


class ParityProbe(Callback):
    """Our side's recorder: a row after every optimizer step (the lengths of every completion sampled since
    the last one: DAPO's dynamic sampling may sample several batches for one step), a checkpoint every
    ``eval_every`` steps and at ``max_steps``; resumed, it drops what was recorded after the step resumed from."""

    def __init__(self, directory: str, settings_file: str, start_model: str, device: str, eval_every: int,
                 max_steps: int) -> None:  # fmt: skip
        self.recorder = Recorder(directory, settings_file, start_model, device)
        self.eval_every, self.max_steps = eval_every, max_steps
        self.step, self.lengths = 0, []

    def on_train_start(self, trainer, pl_module) -> None:
        self.step, self.lengths = trainer.global_step, []  # the step resumed from (``--ckpt_path``), or 0
        self.recorder.resume_at(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if isinstance(outputs, dict) and outputs.get("rollout") is not None:  # every group sampled
            self.lengths += outputs["rollout"].lengths.tolist()
        step = trainer.global_step
        if step == self.step:  # sampled only, no update
            return
        self.recorder.row(step_row(step, pl_module.last_step_metrics, self.lengths))
        self.step, self.lengths = step, []
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


GRPOKeepingZeroGradients = keeping_zero_gradients(preset_class("grpo"))
DrGRPOKeepingZeroGradients = keeping_zero_gradients(preset_class("dr_grpo"))
DAPOKeepingZeroGradients = keeping_zero_gradients(preset_class("dapo"))
#: The ``ours_keep_zero`` arms' classes (``parity.<Preset>KeepingZeroGradients``).
KEEPING_ZERO_GRADIENTS = {"grpo": GRPOKeepingZeroGradients, "dr_grpo": DrGRPOKeepingZeroGradients,
                          "dapo": DAPOKeepingZeroGradients}  # fmt: skip


def ours_config(settings: dict[str, Any], variant: str, role: str, steps: int, probe: dict[str, Any],
                root: Path, checkpoint_every: int) -> dict[str, Any]:  # fmt: skip
    """Our fit's configuration: the recipe's model as the preset ``variant`` (matched to TRL, or as it is
    for ``role`` ``ours_full``), data and trainer, ``steps`` steps, the probe, and ``root/trainer/last.ckpt``
    (the whole training state) every ``checkpoint_every`` steps and when a SIGTERM stops the fit."""
    cls = KEEPING_ZERO_GRADIENTS[variant] if role == "ours_keep_zero" else preset_class(variant)
    class_path = f"parity.{cls.__name__}" if role == "ours_keep_zero" else f"{cls.__module__}.{cls.__name__}"
    arguments = {} if role == "ours_full" else matched_arguments(variant)
    model = {**settings["model"], "class_path": class_path}
    engine = {**NO_COMPILE, **model["init_args"].get("engine", {})}  # --set model.engine.X wins over NO_COMPILE
    model["init_args"] = {**model["init_args"], **arguments, "engine": engine}
    checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                  "init_args": {"dirpath": str(root / TRAINER_FOLDER), "every_n_train_steps": checkpoint_every,
                                "save_top_k": 0, "save_last": True}}  # last.ckpt only, replaced atomically  # fmt: skip
    trainer = {**settings["trainer"], **RACE_TRAINER, "max_steps": steps, "default_root_dir": str(root),
               "enable_checkpointing": True,
               "callbacks": [{"class_path": "parity.ParityProbe", "init_args": probe}, checkpoint]}  # fmt: skip
    trainer.pop("val_check_interval", None)
    return {"model": model, "data": settings["data"], "trainer": trainer, "validate_before_fit": False}


def ours_command(config: Path, device: str, seed: int, resume_from: Path | None = None) -> list[str]:
    resume = ["--ckpt_path", str(resume_from)] if resume_from else []
    return [sys.executable, "-c", "from grpo_lightning.cli.app import main; main()", "fit", "--config", f"trainer/{device}",
            "--config", str(config), "--seed_everything", str(seed), "--data.seed", str(seed), *resume]  # fmt: skip


# ------------------------------------------------------------------ TRL


def trl_worker(job: dict[str, Any]) -> None:
    """TRL's ``GRPOTrainer`` on the job's settings and variant (``parity_trl``) for its steps, recording
    as ours does: its ``reward`` is the task's (the accuracy function's mean), before any length shaping.
    It saves a checkpoint every ``checkpoint_every`` steps (the newest kept) and resumes from the newest;
    a SIGTERM stops it after the step in progress, with a checkpoint (exit status 143, as ours)."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo_lightning.models.sources import load_tokenizer
    from grpo_lightning.models.policy import load_causal_lm
    from parity_trl import resolve, trl_reward_functions
    from smollm2 import problems, trl_config

    stop = stop_requested_by_sigterm()
    settings = json.loads(Path(job["settings_file"]).read_text())
    model_args = settings["model"]["init_args"]
    tokenizer = load_tokenizer(model_args["model"])
    chat = bool(tokenizer.chat_template)  # as our side formats prompts: the chat template where there is one
    train = problems(settings)["train"].map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}] if chat else row["prompt"]})
    config = trl_config(settings, Path(job["directory"]), job["seed"], job["device"], job["variant"], job["steps"],
                        save_steps=job["checkpoint_every"])  # fmt: skip
    recorder = Recorder(job["directory"], job["settings_file"], job["start_model"], job["eval_device"])
    task_reward = recipe_reward(settings)
    lengths: list[int] = []

    def accuracy(prompts, completions, answer, completion_ids, **kwargs):
        lengths.extend(len(ids) for ids in completion_ids)
        return task_reward(prompts, completions, answer=answer)

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            recorder.resume_at(state.global_step)  # the checkpoint's step, or 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs and lengths:
                recorder.row(step_row(state.global_step, {**logs, "reward": logs["rewards/accuracy/mean"]}, lengths))
                lengths.clear()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if is_checkpoint(state.global_step, job["eval_every"], job["steps"]):
                recorder.checkpoint(state.global_step, lambda path: (model.save_pretrained(path), tokenizer.save_pretrained(path)))
            if stop.is_set():
                control.should_save = control.should_training_stop = True

    policy = load_causal_lm(model_args["model"], model_args.get("policy", {}).get("dtype", "float32"), None)
    rewards = trl_reward_functions(resolve(job["variant"], settings), [accuracy])  # DAPO: and its overlong shaping
    trainer = GRPOTrainer(model=policy, reward_funcs=rewards, args=config, train_dataset=train,
                          processing_class=tokenizer, callbacks=[Probe()])  # fmt: skip
    resume_from = newest_trl_checkpoint(Path(job["directory"]))
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if stop.is_set():
        sys.exit(128 + signal.SIGTERM)


def stop_requested_by_sigterm() -> threading.Event:
    """An event that a SIGTERM sets (in place of ending the process)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    return stop


def recipe_reward(settings: dict[str, Any]):
    """The task's reward: the recipe's one reward function where it names one (``--set
    model.rewards.funcs=[module.function]``, as ours gets it), else the answer's accuracy."""
    from grpo_lightning.rewards import accuracy_reward

    names = (settings["model"]["init_args"].get("rewards") or {}).get("funcs") or []
    if len(names) > 1:
        raise SystemExit(f"parity.py: TRL's side takes one reward function, not {names}")
    if not names:
        return accuracy_reward
    module, _, name = names[0].rpartition(".")
    return getattr(importlib.import_module(module), name)


def newest_trl_checkpoint(directory: Path) -> Path | None:
    """The newest complete ``checkpoint-N`` folder of a TRL run (``trainer_state.json`` is written last)."""
    complete = [path for path in (directory / TRAINER_FOLDER).glob("checkpoint-*") if (path / "trainer_state.json").is_file()]
    return max(complete, key=lambda path: int(path.name.rpartition("-")[2]), default=None)


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


def arm_roles(variant: str, roles: list[str], keep_zero: bool) -> list[str]:
    """``variant``'s arms on a tier: ``roles`` (``ours_full`` only where the matched arm turns a part of the
    preset off), and ``ours_keep_zero`` where asked."""
    kept = [role for role in roles if role != "ours_full" or matched_arguments(variant)]
    return [*kept, *(["ours_keep_zero"] if keep_zero else [])]


def arm_note(role: str, pair: dict[str, Any]) -> str | None:
    """What ``role``'s run of a variant's ``pair`` (``parity_trl.mapping``) leaves out of the comparison with TRL."""
    if role == "ours_full" and pair["ours_only"]:
        return "ours only, no TRL counterpart: " + "; ".join(pair["ours_only"])
    if role in ("ours", "ours_keep_zero") and pair["ours_arguments"]:
        return f"the preset with {pair['ours_arguments']}: what TRL lacks turned off"
    return None


def plan_jobs(args, chosen: dict[str, Any], work: Path, start_model: str, eval_device: str,
              pairs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    """One job per tier, variant, arm and seed (the arm ``VARIANT-ROLE``); the settings of each tier in ``work/TIER.json``."""
    jobs = []
    for tier, choice in chosen.items():
        settings_file = work / f"{tier}.json"
        settings_file.write_text(json.dumps(task_settings(args.model, args.set, choice["task"])))
        for seed in args.seeds:
            for variant in args.variants:
                for role in arm_roles(variant, args.arms, tier in args.keep_zero_gradients):
                    arm = f"{variant}-{role}"
                    jobs.append({"tier": tier, "task": choice["task"], "variant": variant, "role": role, "arm": arm,
                                 "seed": seed, "note": arm_note(role, pairs[variant]), "steps": args.steps,
                                 "eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every,
                                 "device": args.device, "eval_device": eval_device,
                                 "settings_file": str(settings_file), "start_model": start_model,
                                 "directory": str(work / f"{tier}-{arm}-s{seed}")})  # fmt: skip
    return jobs


def job_command(job: dict[str, Any]) -> list[str]:
    """The job's process: ours resumes from ``RUN/trainer/last.ckpt`` where it exists, TRL's worker from
    its newest checkpoint (it looks itself)."""
    directory = Path(job["directory"])
    directory.mkdir(parents=True, exist_ok=True)
    if job["role"] == "trl":
        (directory / "job.json").write_text(json.dumps(job))
        return [sys.executable, __file__, "--trl-worker", str(directory / "job.json")]
    settings = json.loads(Path(job["settings_file"]).read_text())
    probe = {k: job[k] for k in ("directory", "settings_file", "start_model", "eval_every")}
    probe.update(device=job["eval_device"], max_steps=job["steps"])
    config = ours_config(settings, job["variant"], job["role"], job["steps"], probe, directory, job["checkpoint_every"])
    # A job's own callbacks (staleness_learning.py: StaleRollouts) go first: the CLI merges a list as long as
    # trainer/DEVICE's item by item, and the checkpoint must stay in the place of that file's step checkpoint.
    config["trainer"]["callbacks"][:0] = job.get("callbacks", [])
    (directory / "fit.yaml").write_text(yaml.safe_dump(config))
    return ours_command(directory / "fit.yaml", job["device"], job["seed"], newest_checkpoint(job))


def newest_checkpoint(job: dict[str, Any]) -> Path | None:
    """The checkpoint the job's run would resume from, if any."""
    directory = Path(job["directory"])
    if job["role"] == "trl":
        return newest_trl_checkpoint(directory)
    last = directory / TRAINER_FOLDER / "last.ckpt"
    return last if last.is_file() else None


def finished(job: dict[str, Any]) -> bool:
    """Whether the job's run reached its last step and recorded that step's evaluation."""
    return any(record["step"] == job["steps"] for record in records(Path(job["directory"]) / "checkpoints.jsonl"))


def drop_checkpoints(job: dict[str, Any]) -> None:
    """Remove a finished run's checkpoints: nothing resumes it any more."""
    shutil.rmtree(Path(job["directory"]) / TRAINER_FOLDER, ignore_errors=True)


def keep_exit_statuses(jobs: list[dict[str, Any]], previous: dict[str, Any] | None) -> None:
    """Give each job the exit status its run had in the ``previous`` plan (a finished run is not started again)."""
    statuses = {job["directory"]: job.get("returncode") for job in (previous or {}).get("jobs", [])}
    for job in jobs:
        if job["directory"] in statuses:
            job["returncode"] = statuses[job["directory"]]


def run_all(jobs: list[dict[str, Any]], out: Path, deadline: float, stop_margin_s: float) -> None:
    """Start every job at once (each its own process group, output appended to ``out/logs``). ``stop_margin_s``
    before ``deadline``, ask those still running to stop (SIGTERM: each ends the step in progress, saves
    its checkpoint and exits); at ``deadline``, or when the driver itself is stopped, kill those left
    (SIGKILL: they resume from their last checkpoint). A run that finished gives its checkpoints back."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # fmt: skip
    running = [(job, start_job(job, out / "logs", env)) for job in jobs]
    (out / "pids.json").write_text(json.dumps({job["directory"]: process.pid for job, process in running}))
    try:
        wait_for(running, deadline, stop_margin_s)
    finally:
        for job, process in running:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            job["returncode"] = process.wait()
            if finished(job):
                drop_checkpoints(job)


def run_plan(out: Path, plan: dict[str, Any], previous: dict[str, Any] | None, deadline: float, stop_margin_s: float,
             max_runs: int | None = None) -> None:  # fmt: skip
    """Run ``plan``'s unfinished jobs (the first ``max_runs`` of them, all by default) into ``out``: their exit
    statuses in the ``previous`` plan kept, ``out/plan.json`` written before (a stopped driver's runs can be
    assembled) and after (with the exit statuses), runs an earlier call left going killed first, and
    finished runs' checkpoints dropped."""
    jobs = plan["jobs"]
    keep_exit_statuses(jobs, previous)
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    end_leftover_runs(out)
    for job in filter(finished, jobs):
        drop_checkpoints(job)
    run_all([job for job in jobs if not finished(job)][:max_runs], out, deadline, stop_margin_s)
    (out / "plan.json").write_text(json.dumps(plan, indent=1))


def wait_for(running: list[tuple[dict[str, Any], subprocess.Popen]], deadline: float, stop_margin_s: float) -> None:
    """Until every process has ended or ``deadline``; SIGTERM to each still running ``stop_margin_s`` before it."""
    asked_to_stop = False
    while any(process.poll() is None for _, process in running) and time.time() < deadline:
        if not asked_to_stop and time.time() >= deadline - stop_margin_s:
            asked_to_stop = True
            for _, process in running:
                if process.poll() is None:
                    os.kill(process.pid, signal.SIGTERM)  # the run's main process alone: its helpers stop with it
        time.sleep(1)


def end_leftover_runs(out: Path) -> None:
    """SIGKILL the runs that an earlier call on ``out`` left running (its driver killed before its deadline):
    two processes of one run would write its records and checkpoint at once."""
    path = out / "pids.json"
    for directory, pid in (json.loads(path.read_text()) if path.exists() else {}).items():
        if directory in command_line(pid):  # that run's process, not another that got its number since
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # no such process (or no /proc)
        return ""


def start_job(job: dict[str, Any], logs: Path, env: dict[str, str]) -> subprocess.Popen:
    command = job_command(job)
    resume_from = newest_checkpoint(job)
    with open(logs / f"{Path(job['directory']).name}.log", "a") as log:  # the process writes to its own copy
        started = f"resuming from {resume_from}" if resume_from else "start"
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')}: {started}\n")
        log.flush()
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def print_progress(jobs: list[dict[str, Any]]) -> None:
    """Each run's last recorded step, and how many runs finished."""
    for job in jobs:
        steps = [row["step"] for row in records(Path(job["directory"]) / "rows.jsonl")]
        print(f"{Path(job['directory']).name}: step {max(steps, default=0)}/{job['steps']}"
              f"{' (finished)' if finished(job) else ''}", flush=True)  # fmt: skip
    print(f"{sum(map(finished, jobs))} of {len(jobs)} runs finished", flush=True)


def provenance() -> dict[str, Any]:
    """The commit the runs ran at (``GRPO_BENCH_COMMIT`` where the checkout has no usable ``.git``), whether the
    tracked tree differed from it (``None``: not known), and the device: what a figure in RESULTS names."""
    import torch
    from run import git_commit

    commit, dirty = git_commit()
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return {"commit": commit, "dirty": dirty, "card": card}


def tasks_from(results_file: Path, tiers: list[str]) -> dict[str, Any]:
    """``tiers``' tasks with their start evaluations from an earlier grid's ``results.json``; every tier must be there."""
    try:
        tasks = json.loads(results_file.read_text())["tasks"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"--tasks-from {results_file}: not the results.json of a parity grid ({error!r})") from None
    missing = [tier for tier in tiers if tier not in tasks]
    if missing:
        raise SystemExit(f"--tasks-from {results_file} has no task for {', '.join(missing)} (it has {', '.join(tasks)}); "
                         "leave those tiers out of --tiers or let them be chosen")  # fmt: skip
    return {tier: tasks[tier] for tier in tiers}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps of every run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tiers", nargs="+", default=list(TIERS), choices=list(TIERS))
    parser.add_argument("--variants", nargs="+", default=["grpo"], choices=VARIANTS,
                        help="presets compared, each with TRL's matching loss_type (parity_trl.py)")
    parser.add_argument("--arms", nargs="+", default=["ours", "trl", "ours_full"], choices=["ours", "trl", "ours_full"],
                        help="each variant's runs: ours matched to TRL, TRL, and (DAPO) our preset as it is")
    parser.add_argument("--keep-zero-gradients", nargs="*", default=[], choices=list(TIERS),
                        help="tiers that also get a run of ours that steps on zero gradients")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="configs/trainer/<device>.yaml; one device")
    parser.add_argument("--model", default=None, help="the recipe's model, replaced (both frameworks)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe setting, e.g. data.num_val=50")
    parser.add_argument("--checkpoint-every", type=int, default=25,
                        help="optimizer steps between a run's checkpoints to resume from (the newest kept; SmolLM2 with "
                        "AdamW's state: 1.6 GB a run, twice that on TRL's side while it replaces one)")
    parser.add_argument("--deadline-min", type=float, default=None,
                        help="stop the runs still going this long after the start (the same command again continues them)")
    parser.add_argument("--stop-margin-min", type=float, default=1.5,
                        help="with --deadline-min: ask the runs this long before it to checkpoint and stop")
    parser.add_argument("--out", type=Path, default=Path("parity-results"))
    parser.add_argument("--tasks-from", type=Path, default=None, metavar="RESULTS_JSON",
                        help="the tiers' tasks and start evaluations of an earlier grid's results, not chosen again: "
                        "more seeds of that grid, to join with it (--report A B --out C)")
    parser.add_argument("--report", type=Path, nargs="+", default=None,
                        help="only summarise: a results.json, or an --out folder whose runs it assembles into results.json; "
                        "several results.json (or --out folders that have one) of one grid's settings run with other seeds or tiers: "
                        "joined into --out (a .json)")
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)  # a TRL job's job.json
    return parser


#: The options that may differ between the grids one results file joins: which runs, where, and how long a call.
PER_CALL_OPTIONS = ("seeds", "tiers", "arms", "keep_zero_gradients", "out", "report", "deadline_min", "stop_margin_min",
                    "checkpoint_every", "tasks_from")  # fmt: skip


def grid_settings(command: str) -> dict[str, Any]:
    """The settings of the grid ``command`` ran (``python benchmarks/parity.py ...``) that decide its runs' results."""
    options = vars(build_parser().parse_args(shlex.split(command)[2:]))
    return {key: value for key, value in options.items() if key not in PER_CALL_OPTIONS}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = build_parser().parse_args(argv)
    if args.trl_worker:
        return trl_worker(json.loads(Path(args.trl_worker).read_text()))
    if args.report and len(args.report) > 1:
        if args.out.suffix != ".json":
            raise SystemExit(f"--report with {len(args.report)} results joins them into --out, a .json file (got {args.out})")
        files = [path / "results.json" if path.is_dir() else path for path in args.report]  # an --out folder: its results
        missing = [str(path) for path in files if not path.is_file()]
        if missing:
            raise SystemExit(f"--report: no results at {', '.join(missing)} (run --report FOLDER on a grid's --out first)")
        results = join([json.loads(path.read_text()) for path in files], grid_settings)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        for commit, names in results["commits"].items():
            print(f"{len(names)} runs at {commit}")
        if len(results["commits"]) > 1:  # the join cannot tell whether the code between them changes results
            print(f"these runs come from {len(results['commits'])} commits: what changed between them is not checked "
                  f"here (git diff {' '.join(c[:12] for c in results['commits'] if c)} -- grpo_lightning benchmarks)")  # fmt: skip
        print_summary(results["summary"])
        return results
    if args.report:
        args.report = args.report[0]
        if args.report.is_file():
            results = json.loads(args.report.read_text())
            results["summary"] = summarize(results)  # from the runs: a file of an earlier summary's form too
        else:
            results = assemble(args.report)
            (args.report / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        print_summary(results["summary"])
        return results

    started = time.time()
    deadline = started + 60 * args.deadline_min if args.deadline_min else math.inf
    eval_device = "cuda" if args.device == "gpu" else "cpu"
    work = args.out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    settings = task_settings(args.model, args.set, TIERS[args.tiers[0]][0][0])
    pairs = {variant: mapping(variant, settings) for variant in args.variants}  # the data does not enter it
    previous = json.loads((args.out / "plan.json").read_text()) if (args.out / "plan.json").exists() else None
    header = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "seeds": args.seeds, "variants": args.variants,
              "pairs": pairs, "command": " ".join(["python", "benchmarks/parity.py", *(sys.argv[1:] if argv is None else argv)]),
              "calls": previous["header"].get("calls", 1) + 1 if previous else 1, **provenance()}  # fmt: skip
    try:
        known = {tier: choice for tier, choice in (previous or {}).get("tasks", {}).items() if tier in args.tiers}
        known = {**tasks_from(args.tasks_from, args.tiers), **known} if args.tasks_from else known
        chosen = choose_tasks(args.model, args.set, [tier for tier in args.tiers if tier not in known], eval_device)
        tasks = {tier: known.get(tier) or chosen[tier] for tier in args.tiers}
        start_model = save_start_model(settings["model"]["init_args"]["model"], work / "start")
        jobs = plan_jobs(args, tasks, work, start_model, eval_device, pairs)
        run_plan(args.out, {"header": header, "tasks": tasks, "jobs": jobs}, previous, deadline, 60 * args.stop_margin_min)
    finally:
        shutil.rmtree(work / "start", ignore_errors=True)
    print_progress(jobs)
    results = {**assemble(args.out), "wall_s": time.time() - started}
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print_summary(results["summary"])
    return results


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the driver stopped: its runs killed
    main()
