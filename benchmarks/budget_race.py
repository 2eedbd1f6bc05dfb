"""Train N minutes from process start, then evaluate: ``grpo-lightning fit`` against TRL's
``GRPOTrainer`` on the SmolLM2 recipe (``configs/recipes/smollm2.yaml``), for several budgets.

Each run is a new process whose budget counts from its start, imports, loading and compilation
included: ours through ``--trainer.max_time`` (which counts from the process start), TRL's through a
callback that stops after the optimizer step in which the budget ran out. Both train with the
recipe's settings (model, prompts, reward, group size, batch, completion length, learning rate,
clip range, ``beta``, precision), neither validates nor checkpoints on the way, and each saves its
final model when it stops. The JSON reports, per budget, seed and framework: optimizer steps, the
wall-clock from the process's start to its exit, and greedy accuracy on the recipe's held-out
problems, scored by one evaluator::

    python benchmarks/budget_race.py --budgets 1,3,10 --device gpu --out race.json
    python benchmarks/budget_race.py --budgets 0.5 --device cpu --model DIR --set model.sampling.max_new_tokens=4

``--parallel`` runs the two frameworks of each budget and seed at the same time, ours on the first
visible GPU and TRL on the second (same card model, same host): half the wall-clock, each process
alone on its card.

``--model`` and ``--set KEY=VALUE`` (``model.*``, ``data.*``, ``trainer.*`` of the recipe) change the
recipe for both frameworks alike (the tests run a tiny model this way). The last stdout line is the JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import Callback

BENCHMARKS = Path(__file__).resolve().parent
#: Our fit, besides the recipe: no validation, checkpoints or logger (TRL's side has none), one stop: the budget.
RACE_TRAINER = {"max_steps": 1_000_000, "limit_val_batches": 0, "enable_checkpointing": False, "logger": False,
                "enable_progress_bar": False}  # fmt: skip


class SaveFinalModel(Callback):
    """Save the policy (``save_pretrained``) and ``steps.json`` into ``directory`` when the fit ends."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_fit_end(self, trainer, pl_module) -> None:
        pl_module.save_pretrained(self.directory)
        if trainer.is_global_zero:
            (Path(self.directory) / "steps.json").write_text(json.dumps({"steps": trainer.global_step}))


# ------------------------------------------------------------------ the recipe


def recipe_settings(model: str | None, overrides: list[str]) -> dict[str, Any]:
    """The recipe's ``model``/``data``/``trainer`` sections with ``--model`` and ``--set KEY=VALUE`` applied."""
    sys.path.insert(0, str(BENCHMARKS))
    from smollm2 import recipe

    settings = recipe()
    if model is not None:
        settings["model"]["init_args"]["model"] = model
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        if section not in ("model", "data", "trainer") or not name or not _:
            raise SystemExit(f"--set {item!r}: write SECTION.NAME=VALUE with SECTION model, data or trainer")
        target = settings[section] if section == "trainer" else settings[section]["init_args"]
        *groups, name = name.split(".")  # model.sampling.max_new_tokens: a field of an option group
        for group in groups:
            target = target.setdefault(group, {})
        target[name] = yaml.safe_load(value)
    return settings


def evaluate(model: str, settings: dict[str, Any], device: str) -> float:
    """Greedy accuracy on the recipe's held-out problems (fp32): ``smollm2.py``'s evaluator."""
    from smollm2 import evaluate as greedy_evaluation

    return greedy_evaluation(model, model, settings, device=device)["accuracy"]


def _duration(minutes: float) -> str:
    seconds = int(round(minutes * 60))
    return f"00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds from starting ``command`` to its exit."""
    print("running:", " ".join(command), flush=True)
    started = time.time()
    subprocess.run(command, check=True, env=env)
    return time.time() - started


def _on_gpu(env: dict[str, str], index: int) -> dict[str, str]:
    """``env`` with only the ``index``-th of the visible GPUs left visible."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(_gpu_count())]
    return {**env, "CUDA_VISIBLE_DEVICES": devices[index]}


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


# ------------------------------------------------------------------ the two frameworks


def run_ours(settings: dict[str, Any], device: str, minutes: float, seed: int, root: Path, env: dict[str, str]) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "race.yaml"
    trainer = {**settings["trainer"], **RACE_TRAINER, "max_time": _duration(minutes), "default_root_dir": str(root),
               "callbacks": [{"class_path": "budget_race.SaveFinalModel", "init_args": {"directory": str(root / "final")}}]}  # fmt: skip
    trainer.pop("val_check_interval", None)
    config.write_text(yaml.safe_dump({"model": settings["model"], "data": settings["data"], "trainer": trainer,
                                      "validate_before_fit": False}))  # fmt: skip
    command = [sys.executable, "-c", "from grpo_lightning.cli.app import main; main()", "fit", "--config", f"trainer/{device}",
               "--config", str(config), "--seed_everything", str(seed), "--data.seed", str(seed)]  # fmt: skip
    wall = _timed(command, env)
    steps = json.loads((root / "final" / "steps.json").read_text())["steps"]
    return {"framework": "grpo-lightning", "steps": steps, "wall_s": wall, "model_dir": str(root / "final")}


def run_trl(settings: dict[str, Any], device: str, minutes: float, seed: int, root: Path, env: dict[str, str],
            settings_file: Path) -> dict:  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--trl-worker", str(settings_file), "--device", device, "--budgets", str(minutes),
               "--seeds", str(seed), "--out", str(root)]  # fmt: skip
    wall = _timed(command, env)
    steps = json.loads((root / "final" / "steps.json").read_text())["steps"]
    return {"framework": "trl", "steps": steps, "wall_s": wall, "model_dir": str(root / "final")}


def trl_worker(settings: dict[str, Any], device: str, minutes: float, seed: int, root: Path) -> None:
    """TRL's GRPOTrainer on the recipe's settings (as ``smollm2.py``'s), stopped once ``minutes`` have
    passed since this process started."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo_lightning.models.policy import load_causal_lm
    from grpo_lightning.models.sources import load_tokenizer
    from grpo_lightning.rewards import accuracy_reward
    from grpo_lightning.runtime.time_budget import process_start_time
    from smollm2 import problems, trl_config

    started = process_start_time()
    model_args = settings["model"]["init_args"]
    tokenizer = load_tokenizer(model_args.get("policy", {}).get("tokenizer") or model_args["model"])
    chat = bool(tokenizer.chat_template)
    train = problems(settings)["train"].map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}] if chat else row["prompt"]})
    config = trl_config(settings, root, seed, device)

    class StopAtBudget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if time.time() - started >= minutes * 60:
                control.should_training_stop = True

    def accuracy(prompts, completions, answer, **kwargs):
        return accuracy_reward(prompts, completions, answer)

    policy = load_causal_lm(model_args["model"], model_args.get("policy", {}).get("dtype", "float32"), None)
    trainer = GRPOTrainer(model=policy, reward_funcs=[accuracy], args=config, train_dataset=train,
                          processing_class=tokenizer, callbacks=[StopAtBudget()])  # fmt: skip
    if time.time() - started < minutes * 60:
        trainer.train()
    trainer.save_model(str(root / "final"))
    tokenizer.save_pretrained(str(root / "final"))
    (root / "final" / "steps.json").write_text(json.dumps({"steps": trainer.state.global_step}))


# ------------------------------------------------------------------ driver


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="1,3,10", help="minutes from process start, comma-separated")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="configs/trainer/<device>.yaml; one device")
    parser.add_argument("--model", default=None, help="the recipe's model, replaced (both frameworks)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe setting, e.g. data.num_val=50")
    parser.add_argument("--no-trl", action="store_true", help="only grpo-lightning")
    parser.add_argument("--parallel", action="store_true", help="ours on the first GPU and TRL on the second, at once")
    parser.add_argument("--out", default=None, help="also write the JSON here (a --trl-worker's folder)")
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)  # the settings file of a TRL run
    args = parser.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    if args.trl_worker:
        sys.path.insert(0, str(BENCHMARKS))
        return trl_worker(json.loads(Path(args.trl_worker).read_text()), args.device, budgets[0], args.seeds[0], Path(args.out))

    settings = recipe_settings(args.model, args.set)
    eval_device = "cuda" if args.device == "gpu" else "cpu"
    work = Path(tempfile.mkdtemp(prefix="grpo-budget-race-"))
    settings_file = work / "settings.json"
    settings_file.write_text(json.dumps(settings))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), os.environ.get("PYTHONPATH", "")])}
    result: dict[str, Any] = {"budgets_min": budgets, "seeds": args.seeds, "device": args.device, "date": time.strftime("%Y-%m-%d"),
                              "command": " ".join(["python", "benchmarks/budget_race.py", *(sys.argv[1:] if argv is None else argv)]),
                              "model": settings["model"]["init_args"]["model"], "parallel": args.parallel, "runs": []}  # fmt: skip
    try:
        result["accuracy_before"] = evaluate(settings["model"]["init_args"]["model"], settings, eval_device)
        for minutes in budgets:
            for seed in args.seeds:
                ours = functools.partial(run_ours, settings, args.device, minutes, seed, work / f"ours-{minutes}-{seed}")
                trl = functools.partial(run_trl, settings, args.device, minutes, seed, work / f"trl-{minutes}-{seed}",
                                        settings_file=settings_file)  # fmt: skip
                if args.parallel and not args.no_trl:
                    with ThreadPoolExecutor(2) as pool:
                        started = [pool.submit(ours, env=_on_gpu(env, 0)), pool.submit(trl, env=_on_gpu(env, 1))]
                        runs = [future.result() for future in started]
                else:
                    runs = [ours(env=env)] + ([] if args.no_trl else [trl(env=env)])
                for run in runs:
                    run["accuracy"] = evaluate(run["model_dir"], settings, eval_device)
                    shutil.rmtree(run.pop("model_dir"))
                    result["runs"].append({"budget_min": minutes, "seed": seed, **run})
                    print(f"{run['framework']}, {minutes} min, seed {seed}: {run['steps']} steps, {run['wall_s']:.1f} s "
                          f"from start to exit, accuracy {result['accuracy_before']:.3f} -> {run['accuracy']:.3f}", flush=True)  # fmt: skip
                if args.out:
                    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
