"""What bf16 weights learn with AdamW's updates compensated, with plain ``torch.optim.AdamW``, and as
float32 weights: a recipe's validation before and after ``--steps`` steps, per seed, through the real CLI
(:func:`recipe_learning.measure`).

    python benchmarks/bf16_updates.py --arm bf16 --seeds 0 1 2        # one GPU; arms: bf16, bf16_plain, float32

``bf16``: ``--model.policy.dtype bfloat16`` as the library runs it (``CompensatedAdamW``); ``bf16_plain``: the
same with plain AdamW, as before it (and as ``torch.optim.AdamW`` on any bf16 model); ``float32``: float32 weights
and a bf16 rollout copy (``--model.sampling.dtype bfloat16``).
"""

from __future__ import annotations

import argparse
import json

import torch
from recipe_learning import measure

from grpo_lightning.training import module

ARMS = {
    "bf16": ["--model.policy.dtype", "bfloat16"],
    "bf16_plain": ["--model.policy.dtype", "bfloat16"],
    "float32": ["--model.policy.dtype", "float32", "--model.sampling.dtype", "bfloat16"],
}


def plain_adamw(parameters, learning_rate, weight_decay, trained=None):
    return torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=weight_decay, fused=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", choices=sorted(ARMS), required=True)
    parser.add_argument("--recipe", default="recipes/smollm2")
    parser.add_argument("--trainer", default="trainer/gpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    options, extra = parser.parse_known_args()
    if options.arm == "bf16_plain":
        module.adamw = plain_adamw
    extra = ARMS[options.arm] + [a for a in extra if a != "--"]
    for seed in options.seeds:
        result = measure([options.trainer, options.recipe], seed, options.steps, extra)
        print(json.dumps({"arm": options.arm, "recipe": options.recipe, **result}), flush=True)


if __name__ == "__main__":
    main()
