"""``grpo-lightning``: the Lightning CLI over every variant and data module.

    grpo-lightning fit --config configs/quickstart.yaml
    grpo-lightning fit --config configs/quickstart.yaml --model variants.DAPO --model.beta 0.0
    grpo-lightning fit --config configs/quickstart.yaml --print_config

A ``--config`` that is not a file names a shipped config (``grpo_lightning.resources``), so
``--config configs/trainer/cpu.yaml`` or ``--config trainer/cpu`` also work outside a clone.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator, Sequence

from lightning.pytorch.cli import LightningCLI

from grpo_lightning.data import PromptDataModule
from grpo_lightning.export import check_checkpoint
from grpo_lightning.module import GroupPolicyOptimization
from grpo_lightning.resources import resolve_config_args

CONFIG_HELP = (
    "Path to a configuration file in json or yaml format, or the name of a shipped config when no such "
    "file exists: configs/trainer/cpu.yaml, trainer/cpu.yaml or trainer/cpu (the configs/ folder of the "
    "repository, installed with the package)."
)


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

    def init_parser(self, **kwargs):
        parser = super().init_parser(**kwargs)
        for action in parser._actions:
            if "--config" in action.option_strings:
                action.help = CONFIG_HELP
        return parser

    def parse_arguments(self, parser, args) -> None:
        if args is None:  # Lightning reads sys.argv, and warns when it is given both
            sys.argv[1:] = resolve_config_args(sys.argv[1:])
        elif isinstance(args, (list, tuple)):
            args = resolve_config_args(args)
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
