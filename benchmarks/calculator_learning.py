"""Does GRPO teach the tiny model to call its calculator? Greedy accuracy and tool-call rate on the
calculator recipe's 200 validation products, before and after a fit, for several fit seeds.

    python benchmarks/calculator_learning.py --seeds 0 1 2 --steps 40

Before the fit it also reports the probability of opening with a call (mean and largest over the
products): greedy decoding calls where it passes one half. ``--seeds`` with no value measures only that.

The start model is ``calculator_warm_start()`` (docs/agents.md); the fit is
``--config trainer/cpu --config recipes/calculator`` through the real CLI.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.agents import EnvironmentOptions
from grpo_lightning.quickstart.calculator_warmstart import CalculatorWarmStartSettings, calculator_warm_start, call_probability
from grpo_lightning.agents.multi_turn import sample_episodes
from grpo_lightning.cli.app import GRPOLightningCLI, expected_warnings_silenced
from grpo_lightning.data.arithmetic import make_arithmetic_dataset
from grpo_lightning.cli.resources import resolve_config
from grpo_lightning.rollout.types import SamplingParams

OPTIONS = EnvironmentOptions(
    "grpo_lightning.agents.CalculatorEnvironment",
    {"tool_call_format": "grpo_lightning.agents.think_expression_calls"}, max_turns=3, max_tokens=40,
)  # fmt: skip


def greedy_episodes(model, tokenizer, rows) -> dict[str, float]:
    """Greedy accuracy (the environment's reward) and the share of episodes with a tool call."""
    rollout = sample_episodes(model, tokenizer, rows, 1, SamplingParams(16, temperature=0.0), OPTIONS)
    columns = rollout.columns
    return {
        "accuracy": sum(columns["environment_reward"]) / len(rollout),
        "tool_call_rate": sum(c > 0 for c in columns["tool_calls"]) / len(rollout),
    }


def quiet_cli(configs: list[str], seed: int, steps: int, log_dir: str, extra: Sequence[str] = ()) -> GRPOLightningCLI:
    """The real CLI, not run, for ``steps`` steps with ``configs`` (shipped names or paths) and the
    arguments ``extra``, validating at the end; quiet: no checkpoints, callbacks or progress bar."""
    args = [
        *(a for config in configs for a in ("--config", str(resolve_config(config)))), f"--seed_everything={seed}",
        f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}", f"--trainer.logger.init_args.save_dir={log_dir}",
        "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false", *extra,
    ]  # fmt: skip
    return GRPOLightningCLI(args=args, run=False)


def fit(configs: list[str], seed: int, steps: int, log_dir: str, extra: Sequence[str] = ()):
    """The policy after ``fit`` through :func:`quiet_cli`."""
    cli = quiet_cli(configs, seed, steps, log_dir, extra)
    with expected_warnings_silenced():
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model.policy.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warm-start-seed", type=int, default=0)
    parser.add_argument("--call-fraction", type=float, default=None, help="the warm start's (default: its own)")
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    chosen = {"seed": options.warm_start_seed}
    if options.call_fraction is not None:
        chosen["call_fraction"] = options.call_fraction
    model_dir = str(calculator_warm_start(**chosen))
    rows = make_arithmetic_dataset(2000, 200, 3, "*", 0)["validation"].to_dict()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    start = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    before = greedy_episodes(start, tokenizer, rows)
    opens_with_call = call_probability(start, tokenizer, rows["prompt"])
    before |= {"call_probability_mean": opens_with_call.mean().item(), "call_probability_max": opens_with_call.max().item()}
    print(json.dumps({"model": model_dir, "before": before}))
    for seed in options.seeds:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as log_dir:
            trained = fit(["trainer/cpu.yaml", "recipes/calculator.yaml"], seed, options.steps, log_dir, ["--model.model", model_dir])
            after = greedy_episodes(trained, tokenizer, rows)
        seconds = round(time.perf_counter() - started, 1)
        call_fraction = CalculatorWarmStartSettings(**chosen).call_fraction
        run = {"warm_start_seed": options.warm_start_seed, "call_fraction": call_fraction, "seed": seed, "steps": options.steps}
        print(json.dumps({**run, "after": after, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
