"""``grpo-lightning``: the Lightning CLI over every variant and data module.

    grpo-lightning fit --config configs/quickstart.yaml
    grpo-lightning fit --config configs/quickstart.yaml --model DAPO --model.kl.beta 0.0
    grpo-lightning fit --config configs/quickstart.yaml --print_config

    grpo-lightning generate --config ... --ckpt_path CKPT --prompts prompts.jsonl --output out.jsonl
    grpo-lightning export --ckpt_path CKPT --output_dir hf-model

A ``--config`` that is not a file names a shipped config (``grpo_lightning.cli.resources``), so
``--config configs/trainer/cpu.yaml`` or ``--config trainer/cpu`` also work outside a clone.

Subcommands: ``fit``, ``validate``, ``test`` (the data's test split), ``generate`` (completions
for a prompt file) and ``export`` (:mod:`grpo_lightning.checkpoints.export`). Evaluation writes nothing into the
run it reads (:mod:`grpo_lightning.cli.run_folders`); every fit saves ``last.ckpt`` however it ends
(:mod:`grpo_lightning.checkpoints.final`). Every fit
validates before its first step (``--validate_before_fit false`` turns it off), prints a summary
when it ends (:mod:`grpo_lightning.training.callbacks`), checks its health (``--health.*``,
:mod:`grpo_lightning.evaluation.diagnostics`), shows what the model writes (``--completions.*``,
:mod:`grpo_lightning.evaluation.completions`), logs to ``<save_dir>/<variant>/version_N`` unless
the logger is given a name, and when resumed (``--ckpt_path``) logs to its checkpoint's version
(from that folder's newest checkpoint only: an older one is refused, :mod:`grpo_lightning.cli.run_folders`).
``--seed_everything S`` seeds the data order too unless ``data.seed`` is given. A user's error is
one ``error: ...`` line (exit status 2); ``--verbose`` or ``GRPO_LIGHTNING_TRACEBACK=1`` shows the
traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI

from grpo_lightning.training.callbacks import FitSummary, ValidateBeforeTraining
from grpo_lightning.runtime.checkpoint_io import check_checkpoint, load_errors_named
from grpo_lightning.evaluation.completions import CompletionLog
from grpo_lightning.data import PromptDataModule
from grpo_lightning.evaluation.diagnostics import HealthChecks
from grpo_lightning.checkpoints.export import main as export_main
from grpo_lightning.checkpoints.final import FinalCheckpoint
from grpo_lightning.evaluation.loggers import log_dir
from grpo_lightning.training.module import GroupPolicyOptimization
from grpo_lightning.cli.resources import resolve_config_args
from grpo_lightning.cli.run_folders import (
    check_resume_folder,
    evaluation_version,
    last_checkpoint_of_run,
    purge_steps_after_checkpoint,
    share_version_folder,
)
from grpo_lightning.cli.user_errors import user_error_message
from grpo_lightning.cli import generate as cli_generate
from grpo_lightning.cli import notices as third_party_notices
from grpo_lightning.cli import parsing as cli_parsing
from grpo_lightning.cli import preflight
from grpo_lightning.cli import resume_settings
from grpo_lightning.cli import variants as cli_variants
from grpo_lightning.runtime.time_budget import TimeBudget

CONFIG_HELP = (
    "Path to a configuration file in json or yaml format, or the name of a shipped config when no such "
    "file exists: configs/trainer/cpu.yaml, trainer/cpu.yaml or trainer/cpu (the configs/ folder of the "
    "repository, installed with the package)."
)


#: Subcommands that evaluate, and the module settings they take from the command line over a checkpoint's.
EVALUATION_SUBCOMMANDS = ("validate", "test", "generate")
EVALUATION_SETTINGS = ("evaluation",)
#: The default ``--trainer.plugins``: :class:`~grpo_lightning.runtime.checkpoint_io.AtomicCheckpointIO`.
ATOMIC_CHECKPOINT_IO = "grpo_lightning.runtime.checkpoint_io.AtomicCheckpointIO"


class GRPOLightningCLI(LightningCLI):
    """LightningCLI in subclass mode: ``--model`` takes any variant's class path."""

    def __init__(
        self, args: Sequence[str] | None = None, run: bool = True, *, raise_parse_errors: bool = False, **kwargs
    ) -> None:
        self.raise_parse_errors = raise_parse_errors  # main(): parse errors are raised, reported in one line
        # max_time counts from the process start on the command line; called from Python (a notebook, a
        # test) the process may be old, so it counts from here.
        self.budget_start = None if args is None else time.time()
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("parser_class", cli_parsing.ArgumentParser)  # no abbreviations; help with docs and choices
        # Checkpoints written atomically, checked when read (a --trainer.plugins of the user's replaces it).
        plugins = [{"class_path": ATOMIC_CHECKPOINT_IO}]
        kwargs["trainer_defaults"] = {"plugins": plugins, **kwargs.get("trainer_defaults", {})}
        cli_variants.register_shipped_variants()  # --model DAPO, and the variants listed in --help
        if cli_parsing.help_requested(sys.argv[1:] if args is None else args):
            cli_parsing.show_field_docs()
        third_party_notices.silence_tips()  # Lightning's product tips, printed by every Trainer
        super().__init__(
            GroupPolicyOptimization,
            PromptDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            run=run,
            **kwargs,
        )

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit``, ``validate`` and ``test`` (the data's test split, ``test/*``); ``generate`` samples
        completions for a prompt file (:func:`generate`). The module has no predict step."""
        return {name: keys for name, keys in LightningCLI.subcommands().items() if name in ("fit", "validate", "test")}

    def _add_subcommands(self, parser, **kwargs) -> None:
        super()._add_subcommands(parser, **kwargs)
        # generate: the arguments of validate (configs, --ckpt_path) and a prompt file and output.
        subparser = self._prepare_subcommand_parser(self.trainer_class, "validate", description=cli_generate.GENERATE_HELP)
        subparser.add_argument("--prompts", type=str, required=True, help="JSONL file with a 'prompt' column.")
        subparser.add_argument("--output", type=str, required=True, help="JSONL file the completions are written to.")
        subparser.add_argument("--batch_size", type=int, default=32, help="Prompts per generate call.")
        cli_generate.make_optional(subparser)  # the model from --ckpt_path, no data
        self._subcommand_parsers["generate"] = subparser
        parser._subcommands_action.add_subcommand("generate", subparser, help=cli_generate.GENERATE_HELP)

    def generate(self) -> None:
        """``grpo-lightning generate``: :func:`cli_generate.generate_completions` with the parsed configuration."""
        config = self.config_init["generate"]
        device = self.trainer.strategy.root_device
        count = cli_generate.generate_completions(
            self.model, config["prompts"], config["output"], config.get("ckpt_path"), config["batch_size"], device
        )
        print(f"wrote {count} completions to {config['output']}", flush=True)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--validate_before_fit", type=bool, default=True,
            help="fit: run the validation loop before the first training step (val/* of the start model at step 0).",
        )  # fmt: skip
        # fit: tables of completions in TensorBoard, and every completion as JSONL (--completions.jsonl true)
        parser.add_lightning_class_args(CompletionLog, "completions")
        # fit: health checks after every step, a summary and health.json at the end (--health.enabled false: off)
        parser.add_lightning_class_args(HealthChecks, "health")
        cli_variants.describe_model_option(parser)

    def init_parser(self, **kwargs):
        if self.raise_parse_errors:
            kwargs.setdefault("exit_on_error", False)
        parser = super().init_parser(**kwargs)
        for action in parser._actions:
            if "--config" in action.option_strings:
                action.help = CONFIG_HELP
        return parser

    def parse_arguments(self, parser, args) -> None:
        if args is None:  # Lightning reads sys.argv, and warns when it is given both
            sys.argv[1:] = cli_variants.resolve_variant_args(resolve_config_args(sys.argv[1:]))
        elif isinstance(args, (list, tuple)):
            args = cli_variants.resolve_variant_args(resolve_config_args(args))
        self.raw_args = list(sys.argv[1:] if args is None else args) if not isinstance(args, dict) else []
        try:
            super().parse_arguments(parser, args)
        except Exception as error:
            error.option_names = _option_names(parser)  # main() suggests the nearest one
            raise
        subcommand = self.config.get("subcommand")
        if subcommand:
            config = self.config[subcommand]
            if config.get("ckpt_path") == "last":  # Lightning would look in a new version's empty folder
                variant = variant_log_name(((config.get("model") or {}).get("class_path") or "grpo").rpartition(".")[2])
                found, line = last_checkpoint_of_run(config.get("trainer") or {}, variant)
                config["ckpt_path"] = str(found)
                print(line, file=sys.stderr, flush=True)
            # Lightning reads --ckpt_path next: a missing or truncated file fails here, naming it (and,
            # when truncated, the newest complete checkpoint beside it).
            check_checkpoint(self.config[subcommand].get("ckpt_path"))

    def _parse_ckpt_path(self) -> None:
        """Apply the hyperparameters of ``--ckpt_path`` (Lightning's behaviour), except how to evaluate:
        ``validate``, ``test`` and ``generate`` take :data:`EVALUATION_SETTINGS` from the command line
        and configs, so a checkpoint can be evaluated with other settings than it was trained with.
        ``fit`` refuses a model setting given on the command line or in a config that differs from
        the checkpoint's, naming each, and takes the evaluation settings given
        (:mod:`grpo_lightning.cli.resume_settings`)."""
        subcommand = self.config.get("subcommand")
        model = self.config[subcommand].get("model") if subcommand in EVALUATION_SUBCOMMANDS else None
        init_args = model.get("init_args") if model is not None else None  # generate: the model may come from ckpt_path
        kept = {key: init_args[key] for key in EVALUATION_SETTINGS if key in init_args} if init_args else {}
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        resuming = subcommand == "fit" and ckpt_path and hasattr(self.config["fit"].get("model"), "clone")
        before = self.config["fit"]["model"].clone() if resuming else None
        with load_errors_named(ckpt_path) if ckpt_path else contextlib.nullcontext():
            super()._parse_ckpt_path()  # torch.load(weights_only=True): a refused global is one line too
        for key, value in kept.items():
            self.config[subcommand]["model"]["init_args"][key] = value
        if resuming:
            given = resume_settings.given_model_keys(self.parser, self.raw_args, "fit")
            resume_settings.check_resume_settings(before, self.config["fit"]["model"], given, self.raw_args, ckpt_path)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if self.subcommand == "generate":
            cli_generate.require_model(config)
        preflight.check_config(config, self.subcommand)  # what would fail only once the model has loaded
        cli_variants.apply_variant_defaults(config, self.parser, self.raw_args, self.subcommand)
        self._name_logs_by_variant(config)
        self._seed_data_order(config)
        self._drop_disabled_progress_bars(config)

    def _instantiate_trainer(self, config, callbacks):
        """The Trainer, with the callbacks every fit has: the final checkpoint, the summary at the
        end, (``fit``) validation before the first step, and ``max_time`` counted from the process
        start (:class:`TimeBudget`, in place of Lightning's timer; after the validation before the
        first step, which it counts; from the CLI's creation when it is given ``args``). A resumed fit
        that would write into its checkpoint's folder must resume from the folder's newest checkpoint
        (:func:`check_resume_folder`); its logs drop the steps after the checkpoint's and keep those before.
        Its TensorBoard and CSV loggers share one version folder."""
        callbacks = [*callbacks, FinalCheckpoint(), FitSummary()]
        if self.subcommand == "fit" and self.config["fit"].get("validate_before_fit", True):
            callbacks.append(ValidateBeforeTraining())
        callbacks.append(TimeBudget(config.pop("max_time", None), start=self.budget_start))
        trainer = super()._instantiate_trainer(config, callbacks)
        share_version_folder(trainer)
        ckpt_path = self.config["fit"].get("ckpt_path") if self.subcommand == "fit" else None
        if ckpt_path:  # one history per run folder; the logs drop what a killed fit logged after ckpt_path
            check_resume_folder(trainer, ckpt_path)
            purge_steps_after_checkpoint(trainer, ckpt_path)
        return trainer

    def _name_logs_by_variant(self, config) -> None:
        """A logger without a name of the user's (each of a list of loggers) is named after the
        variant (``grpo``, ``dr_grpo``, ...); resuming from ``<save_dir>/<name>/version_N/checkpoints/``
        a TensorBoard/CSV logger logs to that same ``version_N``."""
        loggers = config.get("trainer", {}).get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            self._name_log_by_variant(config, logger)

    def _name_log_by_variant(self, config, logger) -> None:
        init_args = logger.get("init_args") if hasattr(logger, "get") else None
        if init_args is None or "name" not in init_args:
            return
        if init_args.get("name") in (None, "lightning_logs"):
            class_path = config.get("model", {}).get("class_path") or "grpo"
            init_args["name"] = variant_log_name(class_path.rpartition(".")[2])
        versioned = str(logger.get("class_path", "")).endswith(("TensorBoardLogger", "CSVLogger"))
        if versioned and self.subcommand in EVALUATION_SUBCOMMANDS and init_args.get("save_dir"):
            # Read-only on the run it evaluates: logs and config.yaml go to a folder of their own.
            init_args["version"] = evaluation_version(init_args["save_dir"], init_args["name"], self.subcommand,
                                                      init_args.get("version"))  # fmt: skip
            return
        ckpt_path = config.get("ckpt_path")
        if versioned and ckpt_path and init_args.get("version") is None and init_args.get("save_dir"):
            version = checkpoint_version(ckpt_path, init_args["save_dir"], init_args["name"])
            if version is not None:
                init_args["version"] = version

    def _seed_data_order(self, config) -> None:
        """``--seed_everything S`` seeds the data order too unless ``data.seed`` is given."""
        seed = config.get("seed_everything")
        data = config.get("data")
        init_args = data.get("init_args") if hasattr(data, "get") else None
        if isinstance(seed, bool) or not isinstance(seed, int) or init_args is None or "seed" not in init_args:
            return
        if not self._data_seed_given(config):
            init_args["seed"] = seed

    def _data_seed_given(self, config) -> bool:
        args = getattr(self, "raw_args", [])
        options = [arg.split("=", 1)[0].replace(".init_args.", ".").replace(".dict_kwargs.", ".") for arg in args]
        if "--data.seed" in options:  # also spelt --data.init_args.seed
            return True
        if any(arg.startswith("--data=") or arg == "--data" for arg in args):
            return True  # a whole data config of the user's: its seed is meant
        for path in config.get("config") or []:
            try:
                loaded = yaml.safe_load(Path(str(path)).read_text()) or {}
            except (OSError, yaml.YAMLError):
                continue
            data = loaded.get("data") if isinstance(loaded, dict) else None
            if isinstance(data, dict) and ("seed" in data or "seed" in (data.get("init_args") or {})):
                return True
        return False

    @staticmethod
    def _drop_disabled_progress_bars(config) -> None:
        """``--trainer.enable_progress_bar false`` with a config that lists a progress bar: the bar goes."""
        trainer = config.get("trainer", {})
        if trainer.get("enable_progress_bar") is not False or not trainer.get("callbacks"):
            return
        trainer["callbacks"] = [c for c in trainer["callbacks"] if not _is_progress_bar(c)]

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            if subcommand == "generate":
                self.generate()
            else:
                if subcommand == "fit" and hasattr(self.model, "process_ends_with_fit"):
                    self.model.process_ends_with_fit = True  # main() drops the module: no copy to the CPU at teardown
                super()._run_subcommand(subcommand)
                if subcommand in EVALUATION_SUBCOMMANDS and self.trainer.is_global_zero and log_dir(self.trainer):
                    print(f"{subcommand}: logs and config.yaml in {log_dir(self.trainer)}", flush=True)
        except Exception as error:
            error._raised_by_subcommand = True  # main(): not a parse error
            raise


def variant_log_name(class_name: str) -> str:
    """``GRPO`` -> ``grpo``, ``DrGRPO`` -> ``dr_grpo``, ``MyGRPOVariant`` -> ``my_grpo_variant``;
    ``GRPO`` is a word of its own after other capitals too: ``OnlineDPOGRPO`` -> ``online_dpo_grpo``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Z])(?=GRPO)", "_", class_name).lower()


def checkpoint_version(ckpt_path: str, save_dir: str, name: str) -> int | None:
    """``N`` when ``ckpt_path`` is ``<save_dir>/<name>/version_N/checkpoints/*.ckpt``, else ``None``."""
    path = Path(ckpt_path).expanduser().resolve()
    match = re.fullmatch(r"version_(\d+)", path.parent.parent.name)
    if path.parent.name != "checkpoints" or match is None:
        return None
    if path.parent.parent.parent != (Path(save_dir).expanduser().resolve() / name):
        return None
    return int(match.group(1))


def _is_progress_bar(callback) -> bool:
    if isinstance(callback, ProgressBar):
        return True
    class_path = callback.get("class_path") if hasattr(callback, "get") else None
    if not class_path:
        return False
    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, ProgressBar)


def _option_names(parser) -> list[str]:
    """Every ``--option`` of ``parser`` and of its subcommands' parsers."""
    names: list[str] = []
    for action in parser._actions:
        names += [name for name in action.option_strings if name.startswith("--")]
        for subparser in (getattr(action, "_name_parser_map", None) or {}).values():
            names += _option_names(subparser)
    return list(dict.fromkeys(names))


#: Lightning's warnings at the start of every fit that describe this module as designed: the frozen
#: reference model is in eval mode, and checkpoints hold the state after each step's optimizer step
#: (what a resumed run continues from).
EXPECTED_WARNINGS = (
    r"Found \d+ module\(s\) in eval mode at the start of training",
    r"Using ModelCheckpoint with manual optimization and every_n_train_steps",
    r"`loftq_config` specified but will be ignored",  # the CLI fills every LoraConfig field with its default
)


@contextlib.contextmanager
def expected_warnings_silenced() -> Iterator[None]:
    """Inside the ``with`` block, ``EXPECTED_WARNINGS`` and ``THIRD_PARTY_WARNINGS`` are not shown; every other is."""
    with warnings.catch_warnings():
        for message in (*EXPECTED_WARNINGS, *third_party_notices.THIRD_PARTY_WARNINGS):
            warnings.filterwarnings("ignore", message=message)
        yield


TRACEBACK_ENV = "GRPO_LIGHTNING_TRACEBACK"


def _wants_traceback(argv: list[str]) -> bool:
    return "--verbose" in argv or os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0", "false")


def main(args: Sequence[str] | None = None, *, report_errors: bool | None = None) -> None:
    """Run the CLI. On the command line (``args`` None, or ``report_errors``) a user's error is one
    ``error: ...`` line on stderr and exit status 2; ``--verbose`` (or ``GRPO_LIGHTNING_TRACEBACK=1``)
    shows its traceback instead. Called from Python with ``args``, errors are raised as they are."""
    argv = list(sys.argv[1:] if args is None else args)
    if argv[:1] == ["export"]:  # not a Trainer method: its own parser
        return export_main(argv[1:], prog="grpo-lightning export")
    verbose = _wants_traceback(argv) or not (args is None if report_errors is None else report_errors)
    argv = [arg for arg in argv if arg != "--verbose"]
    if args is None:
        sys.argv[1:] = argv
    else:
        args = argv
    cap_cuda_memory()
    try:
        with expected_warnings_silenced():
            GRPOLightningCLI(args=args, raise_parse_errors=not verbose)
    except Exception as error:
        _report(error, verbose, parsing=not getattr(error, "_raised_by_subcommand", False))
        raise
    leave_process_group()


MEMORY_FRACTION_ENV = "GRPO_LIGHTNING_CUDA_MEMORY_FRACTION"


def cap_cuda_memory() -> None:
    """Hold this process to the share of its card in ``GRPO_LIGHTNING_CUDA_MEMORY_FRACTION`` (an
    ablation sweep sets it where cells share a card): past it an allocation fails in this process."""
    share = os.environ.get(MEMORY_FRACTION_ENV, "").strip()
    if not share:
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(float(share))


def leave_process_group() -> None:
    """After a run of several processes, all of them leave the process group together: a process
    that exits with it alive can abort in gloo's teardown (``terminate called without an active
    exception``), failing a run that finished."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _report(error: BaseException, verbose: bool, parsing: bool) -> None:
    """Print ``error: <message>`` and exit with status 2 for a user's error; return otherwise."""
    if verbose:
        return
    message = user_error_message(error, parsing)
    if message is None:
        return
    sys.stderr.write(f"error: {message} (run again with --verbose for the traceback)\n")
    sys.stderr.flush()
    raise SystemExit(2) from None


if __name__ == "__main__":
    main()
