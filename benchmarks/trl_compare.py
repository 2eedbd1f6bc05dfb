"""TRL's ``GRPOTrainer`` on a workload written by ``benchmarks/run.py`` (same model directory,
tokenizer and prompts): median seconds per optimizer step, peak GPU memory and, where TRL's methods
can be wrapped, the split between generation, rewards, reference log-probs and the update.

``benchmarks/run.py --compare trl`` starts this in a subprocess; it can also be run by hand::

    python benchmarks/trl_compare.py --model DIR/model --prompts DIR/prompts --num-prompts 8 \
        --group-size 4 --max-new-tokens 32 --micro-batch-size 32 --steps 5 --cpu

One optimizer step consumes exactly one rollout of ``P x G`` completions:
``per_device_train_batch_size`` is the micro-batch, ``gradient_accumulation_steps`` the number of
micro-batches in the rollout and ``generation_batch_size = P x G``, with ``num_iterations = 1`` (so
TRL reuses the policy's own log-probs as the old ones, as run.py's module does). TRL's gradient
checkpointing default is turned off to match. ``--stop-lengths lognormal``: each completion stops at
the length run.py's side draws for it (``stop_lengths.py``, a logits processor passed to the model's
``generate``) instead of running to ``--max-new-tokens``. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import _sync, benchmark_reward  # noqa: E402  (also sets the offline environment)

import torch  # noqa: E402


def install_phase_timers(trainer, phases: dict[str, float]) -> list[str]:
    """Wrap TRL's rollout methods on this trainer instance to time them (synchronised). Methods a
    TRL version lacks are skipped; returns the names of the wrapped ones."""
    inside = {"rollout": False}

    def wrap(attr: str, phase: str, only_inside_rollout: bool = False, marks_rollout: bool = False):
        method = getattr(trainer, attr, None)
        if method is None:
            return None

        def timed(*args, **kwargs):
            if only_inside_rollout and not inside["rollout"]:
                return method(*args, **kwargs)
            _sync()
            start = time.perf_counter()
            if marks_rollout:
                inside["rollout"] = True
            try:
                return method(*args, **kwargs)
            finally:
                if marks_rollout:
                    inside["rollout"] = False
                _sync()
                phases[phase] += time.perf_counter() - start

        setattr(trainer, attr, timed)
        return attr

    wrapped = [
        wrap("_generate_and_score_completions", "generate_and_score_s", marks_rollout=True),
        wrap("_generate", "rollout_s"),
        wrap("_calculate_rewards", "score_s"),
        # Inside the rollout these are the reference (and, with num_iterations > 1, old) log-probs.
        wrap("_get_per_token_logps_and_entropies", "logprob_s", only_inside_rollout=True),
    ]
    return [w for w in wrapped if w]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model + tokenizer directory (save_pretrained)")
    parser.add_argument("--prompts", required=True, help="datasets save_to_disk directory with a prompt column")
    parser.add_argument("--num-prompts", type=int, required=True, help="P, prompts per rollout")
    parser.add_argument("--group-size", type=int, required=True, help="G, completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--micro-batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--lora-rank", type=int, default=None, help="LoRA adapters of this rank on every linear layer")
    parser.add_argument("--stop-lengths", choices=["lognormal"], default=None,
                        help="completions stop at drawn lengths (stop_lengths.py; the same draws as run.py's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import trl
    from datasets import load_from_disk
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    completions = args.num_prompts * args.group_size
    micro = min(args.micro_batch_size, completions)
    if completions % micro:
        raise SystemExit(f"micro-batch {micro} does not divide the rollout of {completions} completions")

    phases: dict[str, float] = defaultdict(float)
    steps: list[dict[str, float]] = []

    class StepTimer(TrainerCallback):
        """Synchronised wall time of each optimizer step (rollout included: TRL generates in the
        first micro-batch of the step), with the phase times accumulated during it."""

        def on_train_begin(self, args, state, control, **kwargs):
            self.threads = torch.get_num_threads()
            self.first_step_peak = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            _sync()
            phases.clear()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync()
            step = {"wall_s": time.perf_counter() - self.start, **phases}
            if "generate_and_score_s" in phases:
                step["update_s"] = step["wall_s"] - phases["generate_and_score_s"]
            steps.append(step)
            if len(steps) == 1:
                self.first_step_end_time = time.time()  # run.py: the first step from the process's start
            if len(steps) == 1 and torch.cuda.is_available():  # as run.py: the later steps' peak too
                self.first_step_peak = torch.cuda.max_memory_allocated() / 2**30
                torch.cuda.reset_peak_memory_stats()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    dataset = load_from_disk(args.prompts)
    output_dir = tempfile.mkdtemp(prefix="grpo-bench-trl-")
    config = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro,
        generation_batch_size=completions,
        num_generations=args.group_size,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        generation_kwargs=None if args.stop_lengths else {"min_new_tokens": args.max_new_tokens},
        temperature=1.0,
        beta=args.beta,
        loss_type="grpo",
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        gradient_checkpointing=False,
        model_init_kwargs={"dtype": args.dtype},
        bf16=args.dtype == "bfloat16",
        use_cpu=args.cpu,
        use_vllm=False,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=args.seed,
    )
    timer = StepTimer()
    peft_config = None
    if args.lora_rank is not None:  # as run.py's lora_settings
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")  # fmt: skip
    trainer = GRPOTrainer(
        peft_config=peft_config,
        model=args.model,
        reward_funcs=[benchmark_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    wrapped = install_phase_timers(trainer, phases)
    forced = None
    if args.stop_lengths:
        from stop_lengths import install_trl_forced_stops, length_summary

        forced = install_trl_forced_stops(trainer.model, args.max_new_tokens, args.seed)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()

    later_peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    timed = steps[1:] if len(steps) > 1 else steps
    median_step = statistics.median(s["wall_s"] for s in timed)
    phase_names = sorted({k for s in timed for k in s} - {"wall_s"})
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    tokens_per_step = completions * args.max_new_tokens
    if forced is not None:
        if len(forced.lengths) != len(steps):
            raise SystemExit(f"stop lengths: {len(forced.lengths)} generate calls for {len(steps)} steps")
        timed_lengths = forced.lengths[1:] or forced.lengths
        tokens_per_step = length_summary(timed_lengths, args.max_new_tokens)["tokens_per_rollout"]
    result = {
        "version": trl.__version__,
        "median_step_s": median_step,
        "step_s": [s["wall_s"] for s in steps],
        "optimizer_steps": len(steps),
        "first_step_end_time": timer.first_step_end_time,
        "tokens_per_s": tokens_per_step / median_step,
        "peak_mem_gib": max(timer.first_step_peak, later_peak),
        "steady_peak_mem_gib": later_peak if len(steps) > 1 else None,
        "phases": {name: statistics.median(s.get(name, 0.0) for s in timed) for name in phase_names},
        "timed_methods": wrapped,
        "torch_threads": timer.threads,
        "mean_completion_length": statistics.mean(lengths) if lengths else None,
        "config": {
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "generation_batch_size": config.generation_batch_size,
            "steps_per_generation": config.steps_per_generation,
            "num_iterations": config.num_iterations,
            "bf16": config.bf16,
            "optim": str(config.optim),
        },
    }
    if forced is not None:
        result["stop_lengths"] = {"mean_completion_length": result["mean_completion_length"], **forced.summary()}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
