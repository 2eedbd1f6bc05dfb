"""``grpo-lightning-quickstart``: the embedded default, offline on a CPU in minutes.

1. Warm-start a tiny model on the built-in arithmetic task by a short supervised pass (cached).
2. Measure its validation accuracy.
3. Train it with a GRPO-family variant through the same CLI and YAML configs as
   ``grpo-lightning fit``, logging to TensorBoard.
4. Measure again and print both numbers, and pass@k of the trained model from
   :data:`PASS_AT_K_SAMPLES` completions per problem sampled at temperature 1.

Extra arguments go to the CLI: ``grpo-lightning-quickstart --variant dapo --trainer.max_steps 50``.
A quick check that an installation works (a weaker start model, cached separately):
``grpo-lightning-quickstart --warmstart-steps 10 --trainer.max_steps 2``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning import bytecode, closed_output
from grpo_lightning.cli.resources import config_path
from grpo_lightning.import_pause import import_module
from grpo_lightning.runtime.cache import cache_dir
from grpo_lightning.progress import say

#: Completions per validation problem behind the quickstart's pass@k line (sampled at T = 1).
PASS_AT_K_SAMPLES = 8

VARIANTS = ("grpo", "dr_grpo", "dapo", "rloo", "gspo", "cispo", "sapo", "gmpo", "reinforce_plus_plus", "clip_cov", "kl_cov")


def quickstart_args(model_dir: str | Path, variant: str = "grpo", extra: Sequence[str] = ()) -> list[str]:
    """CLI arguments of the quickstart fit: the shared configs, the variant, the warm-started model."""
    configs = ["trainer/cpu.yaml", "data/arithmetic.yaml", f"variant/{variant}.yaml", "model/tiny.yaml", "quickstart.yaml"]
    args = [arg for name in configs for arg in ("--config", str(config_path(name)))]
    return [*args, "--model.model", str(model_dir), *extra]


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: run the quickstart (its exit status is 0 on success); a closed stdout or
    stderr silences its output, never its work (:mod:`grpo_lightning.closed_output`); Python's bytecode goes
    to the package's cache where it may not write its own (:mod:`grpo_lightning.bytecode`)."""
    bytecode.use_own_bytecode_cache()  # before torch is imported
    closed_output.guard_standard_streams()
    run_quickstart(argv)


def run_quickstart(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Warm start, measure, train, measure; returns the summary written to ``quickstart.json``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--variant", choices=VARIANTS, default="grpo")
    parser.add_argument(
        "--warmstart-steps", type=int, default=None, metavar="N",
        help="at most N supervised steps for the start model (default: the warm start's own budget)",
    )  # fmt: skip
    options, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)

    say(
        f"grpo-lightning-quickstart: importing the trainer, then warm-starting a tiny model (minutes the first "
        f"time, then cached in {cache_dir()}), training it with {options.variant} and measuring it."
    )
    import_module("grpo_lightning.cli.app")  # the first import with the collector paused
    from grpo_lightning.cli.app import GRPOLightningCLI, expected_warnings_silenced
    from grpo_lightning.quickstart.warmstart import warm_start

    start = time.perf_counter()
    model_dir = warm_start() if options.warmstart_steps is None else warm_start(steps=options.warmstart_steps)
    print(f"warm-started model: {model_dir} ({time.perf_counter() - start:.0f} s)")

    cli = GRPOLightningCLI(args=quickstart_args(model_dir, options.variant, extra), run=False)
    trainer, module, data = cli.trainer, cli.model, cli.datamodule
    with expected_warnings_silenced():
        before = trainer.validate(module, datamodule=data, verbose=False)[0]["val/accuracy"]
        trainer.fit(module, datamodule=data)
        after = trainer.validate(module, datamodule=data, verbose=False)[0]["val/accuracy"]
        with module.evaluation_sampling(PASS_AT_K_SAMPLES, temperature=1.0, prefix="sampled"):
            sampled = trainer.validate(module, datamodule=data, verbose=False)[0]

    summary = {
        "variant": options.variant,
        "val_accuracy_before": before,
        "val_accuracy_after": after,
        **{name.removeprefix("sampled/"): value for name, value in sampled.items()},
        "optimizer_steps": trainer.global_step,
        "seconds": round(time.perf_counter() - start, 1),
    }
    log_dir = Path(trainer.log_dir or ".")
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "quickstart.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"\nvalidation accuracy ({options.variant}): warm start {before:.1%} -> after RL {after:.1%} "
        f"({after - before:+.1%}) in {summary['seconds']:.0f} s; logs in {log_dir}"
    )
    print(pass_at_k_line(sampled, PASS_AT_K_SAMPLES))
    return summary


def pass_at_k_line(metrics: dict[str, float], samples: int) -> str:
    """``pass@1 0.52 [0.48, 0.56], ...``: the sampled metrics with their 95% intervals over the problems
    (exact binomial: :mod:`grpo_lightning.evaluation.sample_metrics`)."""
    from grpo_lightning.evaluation.sample_metrics import pass_k_values

    names = [f"pass@{k}" for k in pass_k_values(samples)]
    names.append(f"maj@{samples}")
    shown = [
        f"{name} {metrics[f'sampled/{name}']:.1%} [{metrics[f'sampled/{name}_ci_low']:.1%}, {metrics[f'sampled/{name}_ci_high']:.1%}]"
        for name in names
    ]
    return f"after RL, {samples} samples per problem at T=1 (95% intervals over the problems): " + ", ".join(shown)


if __name__ == "__main__":
    main()
