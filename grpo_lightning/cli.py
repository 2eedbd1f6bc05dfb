"""``grpo-lightning``: the Lightning CLI over every variant and data module.

    grpo-lightning fit --config configs/quickstart.yaml
    grpo-lightning fit --config configs/quickstart.yaml --model variants.DAPO --model.beta 0.0
    grpo-lightning fit --config configs/quickstart.yaml --print_config
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence

from lightning.pytorch.cli import LightningCLI

from grpo_lightning.data import PromptDataModule
from grpo_lightning.export import check_checkpoint
from grpo_lightning.module import GroupPolicyOptimization


class GRPOLightningCLI(LightningCLI):
    """LightningCLI in subclass mode: ``--model`` takes any variant's class path."""

    def __init__(self, args: Sequence[str] | None = None, run: bool = True, **kwargs) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(
            GroupPolicyOptimization,
            PromptDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            run=run,
            **kwargs,
        )

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand:
            # Lightning reads --ckpt_path next: a missing or truncated file fails here, naming it.
            check_checkpoint(self.config[subcommand].get("ckpt_path"))


#: Lightning's warnings at the start of every fit that describe this module as designed: the frozen
#: reference model is in eval mode, and checkpoints hold the state after each step's optimizer step
#: (what a resumed run continues from).
EXPECTED_WARNINGS = (
    r"Found \d+ module\(s\) in eval mode at the start of training",
    r"Using ModelCheckpoint with manual optimization and every_n_train_steps",
)


@contextlib.contextmanager
def expected_warnings_silenced() -> Iterator[None]:
    """Inside the ``with`` block, ``EXPECTED_WARNINGS`` are not shown; every other warning is."""
    with warnings.catch_warnings():
        for message in EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        yield


def main(args: Sequence[str] | None = None) -> None:
    with expected_warnings_silenced():
        GRPOLightningCLI(args=args)


if __name__ == "__main__":
    main()
