"""Does GRPO teach SmolLM2-135M-Instruct to call a calculator? Greedy accuracy and tool-call rate on 200
validation products (three-digit multiplication) before and after a fit, per seed.

    python benchmarks/calculator_smollm2.py --steps 80 --seeds 0 1 2            # on one GPU
    python benchmarks/calculator_smollm2.py --probe 'What is {a} {op} {b}?' ...  # call rates of prompts only

The fit is ``--config trainer/gpu --config benchmarks/calculator_smollm2.yaml`` through the real CLI
(``--device cpu``: ``trainer/cpu``). ``--probe`` samples 8 episodes of 32 products at temperature 1 for each
prompt template and prints how often each calls and is right: a prompt a model never calls from gives GRPO
nothing to reinforce. Measured so far (JOURNAL): it never calls, and GRPO alone does not change that.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import yaml
from calculator_learning import fit

from grpo_lightning.agents import EnvironmentOptions
from grpo_lightning.agents.multi_turn import sample_episodes
from grpo_lightning.data.arithmetic import make_arithmetic_dataset
from grpo_lightning.models.sources import load_tokenizer
from grpo_lightning.rollout.generation.weights import load_causal_lm
from grpo_lightning.rollout.types import SamplingParams

RECIPE = Path(__file__).with_suffix(".yaml")


@functools.cache
def recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def episodes(model, tokenizer, rows, group_size: int, temperature: float) -> dict[str, float]:
    """Accuracy (the environment's reward) and the share of episodes with a tool call."""
    init = recipe()["model"]["init_args"]
    options = EnvironmentOptions.of(init["environment"])
    sampling = SamplingParams(init["sampling"]["max_new_tokens"], temperature=temperature)
    columns = sample_episodes(model, tokenizer, rows, group_size, sampling, options).columns
    n = len(columns["environment_reward"])
    return {
        "accuracy": round(sum(columns["environment_reward"]) / n, 4),
        "tool_call_rate": round(sum(c > 0 for c in columns["tool_calls"]) / n, 4),
    }


def validation_rows(template: str, count: int) -> dict[str, list]:
    data = recipe()["data"]["init_args"]
    split = make_arithmetic_dataset(data["num_train"], data["num_val"], data["digits"], data["operations"],
                                    data["task_seed"], template=template)["validation"]  # fmt: skip
    return split.select(range(min(count, len(split)))).to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--template", default=None, help="the prompt template (default: the recipe's)")
    parser.add_argument("--probe", nargs="*", default=None, help="prompt templates whose call rates to print, then stop")
    options = parser.parse_args()
    template = options.template or recipe()["data"]["init_args"]["template"]
    device = "cuda" if options.device == "gpu" else "cpu"
    name = recipe()["model"]["init_args"]["model"]
    model = load_causal_lm(name, "bfloat16" if device == "cuda" else "float32", None).to(device).eval()
    tokenizer = load_tokenizer(name)
    for probe in options.probe or []:
        started = time.perf_counter()
        result = episodes(model, tokenizer, validation_rows(probe, 32), 8, 1.0)
        print(json.dumps({"probe": probe, **result, "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    if options.probe is not None:
        return
    rows = validation_rows(template, 200)
    print(json.dumps({"template": template, "before": episodes(model, tokenizer, rows, 1, 0.0)}), flush=True)
    for seed in options.seeds:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as log_dir:
            configs = [f"trainer/{options.device}.yaml", str(RECIPE)]
            trained = fit(configs, seed, options.steps, log_dir, ["--data.init_args.template", template]).to(device)
            after = episodes(trained, tokenizer, rows, 1, 0.0)
        print(json.dumps({"seed": seed, "steps": options.steps, "after": after,
                          "seconds": round(time.perf_counter() - started, 1)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
