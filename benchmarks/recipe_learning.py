"""Does a shipped recipe learn? Its validation metrics before the first step and after ``--steps`` steps,
per seed, through the real CLI (``Trainer.validate`` on the start model, then ``fit``, whose last step validates).

    python benchmarks/recipe_learning.py --recipe recipes/guess_number_smollm2 --steps 60 --seeds 0 1 2   # one GPU

``--trainer trainer/cpu`` runs it on a CPU; arguments after ``--`` go to the CLI (e.g. ``--model.model PATH``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from calculator_learning import quiet_cli

from grpo_lightning.cli.app import expected_warnings_silenced

SHOWN = ("val/accuracy", "val/reward")


def measure(configs: list[str], seed: int, steps: int, extra: list[str]) -> dict:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as log_dir:
        cli = quiet_cli(configs, seed, steps, log_dir, extra)
        with expected_warnings_silenced():
            before = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        after = {name: float(value) for name, value in cli.trainer.callback_metrics.items() if name.startswith("val/")}
    pick = lambda metrics: {name: round(float(metrics[name]), 4) for name in SHOWN if name in metrics}  # noqa: E731
    return {"seed": seed, "steps": cli.trainer.global_step, "before": pick(before), "after": pick(after),
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, help="a shipped config name or a path")
    parser.add_argument("--trainer", default="trainer/gpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    options, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    for seed in options.seeds:
        result = measure([options.trainer, options.recipe], seed, options.steps, extra)
        print(json.dumps({"recipe": options.recipe, **result}), flush=True)


if __name__ == "__main__":
    main()
