"""Every variant learns the built-in task: validation accuracy rises over the warm start.

Real parts only: the cached warm-started model (built by the project's own supervised pass on
first use), the shipped YAML configs through the CLI, a real Trainer, greedy validation.
"""

from __future__ import annotations

import pytest

from grpo_lightning.cli import GRPOLightningCLI
from grpo_lightning.quickstart import VARIANTS, quickstart_args
from grpo_lightning.quickstart.warmstart import warm_start

STEPS = 30
MARGIN = 0.10  # absolute validation-accuracy points over the warm start


@pytest.fixture(scope="module")
def warm_model_dir() -> str:
    return str(warm_start())


@pytest.fixture(scope="module")
def warm_start_accuracy(warm_model_dir, tmp_path_factory) -> float:
    cli = GRPOLightningCLI(args=fit_args(warm_model_dir, "grpo", tmp_path_factory.mktemp("before")), run=False)
    return cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]["val/accuracy"]


def fit_args(model_dir: str, variant: str, log_dir) -> list[str]:
    return quickstart_args(
        model_dir,
        variant,
        [
            f"--trainer.max_steps={STEPS}",
            f"--trainer.val_check_interval={STEPS}",
            f"--trainer.logger.init_args.save_dir={log_dir}",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]",
            "--trainer.enable_progress_bar=false",
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_raises_validation_accuracy_over_the_warm_start(variant, warm_model_dir, warm_start_accuracy, tmp_path):
    cli = GRPOLightningCLI(args=fit_args(warm_model_dir, variant, tmp_path), run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    after = cli.trainer.callback_metrics["val/accuracy"].item()
    print(f"{variant}: {warm_start_accuracy:.3f} -> {after:.3f}")
    assert after >= warm_start_accuracy + MARGIN, (variant, warm_start_accuracy, after)
