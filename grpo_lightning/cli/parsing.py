"""The command line's parser: every option spelt in full, and a help that says what each field
means and which values it takes.

An abbreviation (``--trainer.max_step`` for ``--trainer.max_steps``) would change meaning the day an
option with that prefix is added, so none is accepted, in any parser jsonargparse makes from this
one (subcommands, a variant's options, ``--model.help``). The help shows the option groups'
attribute docstrings and, for an option that names a registered part or a fixed set of values, the
names it takes, read from the registries themselves.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from jsonargparse import DefaultHelpFormatter, set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser

from grpo_lightning.algorithms import ADVANTAGES, AGGREGATIONS, KL_PLACEMENTS, SURROGATES
from grpo_lightning.algorithms import functional
from grpo_lightning.algorithms.rollout_correction import CORRECTIONS, OLD_LOGPROBS
from grpo_lightning.rollout.types import ROLLOUT_MODES
from grpo_lightning.runtime.dtypes import DTYPES
from grpo_lightning.training.options import REWARD_AGGREGATIONS

#: The module's options (below ``--model.``) that take one of a set of names, and where those names live.
OPTION_CHOICES: dict[str, Callable[[], Iterable[str]]] = {
    "advantage": lambda: ADVANTAGES,
    "aggregation": lambda: AGGREGATIONS,
    "loss.surrogate": lambda: SURROGATES,
    "kl.placement": lambda: KL_PLACEMENTS,
    "kl.estimator": lambda: functional.KL_ESTIMATORS,
    "rewards.scale": lambda: functional.REWARD_SCALES,
    "rewards.aggregation": lambda: REWARD_AGGREGATIONS,
    "sampling.mode": lambda: ROLLOUT_MODES,
    "sampling.correction": lambda: CORRECTIONS,
    "sampling.old_logprobs": lambda: OLD_LOGPROBS,
    "sampling.dtype": lambda: DTYPES,
    "policy.dtype": lambda: ("auto", *DTYPES),
}


def option_choices(dest: str) -> list[str] | None:
    """The names ``--<dest>`` takes (``model.init_args.advantage`` -> the registered advantages), or
    ``None`` for an option without a fixed set."""
    parts = [part for part in dest.split(".") if part != "init_args"]
    if parts[:1] != ["model"]:
        return None
    names = OPTION_CHOICES.get(".".join(parts[1:]))
    return list(names()) if names is not None else None


def help_requested(args: Any) -> bool:
    """Whether ``args`` (a command line, or a dict the CLI is given) asks for a help page (``--help``,
    ``-h``, ``--model.help NAME``, ...)."""
    if not isinstance(args, (list, tuple)):
        return False
    return any(str(arg) in ("-h", "--help") or str(arg).partition("=")[0].endswith(".help") for arg in args)


def show_field_docs() -> None:
    """Make the help show each dataclass field's attribute docstring (read only for a help page:
    reading them costs every run's start-up otherwise)."""
    set_parsing_settings(docstring_parse_attribute_docstrings=True)


class HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, and the names an option takes where :func:`option_choices` knows them."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        choices = option_choices(action.dest)
        return f"{text} (choices: {', '.join(choices)})" if choices else text


class ArgumentParser(LightningArgumentParser):
    """Lightning's parser without abbreviations, with :class:`HelpFormatter`. jsonargparse makes the
    parsers of subcommands and of a class's options as ``type(parser)(...)``, so they inherit both."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
