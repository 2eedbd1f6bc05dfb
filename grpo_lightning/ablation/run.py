"""``grpo-lightning-ablate``: sweeps of Lightning fit runs over variants, seeds and settings.

    grpo-lightning-ablate --config-name default
    grpo-lightning-ablate --config-name smoke hydra/launcher=joblib parallel=2
    grpo-lightning-ablate hydra/launcher=submitit_slurm hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=1
    grpo-lightning-ablate -m variant=grpo,dapo seed=0,1,2
    grpo-lightning-ablate ++overrides.model.kl.beta=[0.0,0.04] args.trainer.max_steps=50

A sweep spec (``configs/ablation/*.yaml``) names the shared YAML files and the axes::

    name: default
    output_dir: runs/ablation/${name}
    base_configs: [configs/trainer/cpu.yaml, configs/data/arithmetic.yaml, configs/model/tiny.yaml]
    model: warmstart                  # a path / hub id, "warmstart", or null (from base_configs)
    warmstart: {}                     # keyword arguments of grpo_lightning.quickstart.warmstart.warm_start
    variants: [grpo, dr_grpo, dapo, rloo, gspo]   # names of configs/variant/*.yaml (or YAML paths)
    seeds: [0, 1, 2, 3, 4]            # the default: five
    baseline: grpo                    # the arm the report compares the others with (default: the first)
    overrides:                        # extra axes: dotted CLI key -> list of values
      model.group_size: [4, 8]
    args:                             # fixed CLI overrides of every cell
      trainer.max_steps: 400
    parallel: 1                       # cells at once on this machine (more: hydra/launcher=joblib)
    gpus: auto                        # handed out round-robin (CUDA_VISIBLE_DEVICES); none on CPU
    timeout_s: null                   # stop a cell after this many seconds (then it counts as failed)
    threads: auto                     # torch CPU threads per cell (auto: cores / parallel for CPU cells)
    validate_before_training: true    # val/* of the start model, logged before the first step
    variant: null                     # a single variant / seed (Hydra multirun sets these)
    seed: null
    cell: null                        # the one cell of a launcher's job (set by the sweep)

Every cell (variant x seed x override values) is one ``python -m grpo_lightning.cli fit`` in a
subprocess, run as one job of a Hydra launcher (``launch``): the basic one runs the cells one
after another, ``hydra/launcher=joblib`` ``parallel`` at a time in local processes,
``hydra/launcher=submitit_slurm`` as SLURM jobs (``pip install 'grpo-lightning[launchers]'``).
The command is built from the same YAML files as a hand-run ``grpo-lightning fit``. Paths in
``base_configs`` and ``variants`` are relative to the working directory or name shipped configs
(``configs/trainer/cpu.yaml`` works from a clone and after ``pip install`` alike)::

    python -m grpo_lightning.cli fit --config configs/variant/<v>.yaml --config <base_configs...> \\
        --seed_everything <s> --trainer.logger.init_args.save_dir <cell dir> --model.model <path> \\
        --completions.jsonl true --<args...> --<override key> <value>

A cell directory (e.g. ``grpo-seed0-group_size4``) holds ``cell.json`` (its identity and
command), ``train.log``, the TensorBoard events, the resolved ``config.yaml`` saved by
LightningCLI, ``completions.jsonl`` (every trained completion: ``--completions.jsonl true``),
``metrics.json`` once the fit succeeded, and last a ``DONE`` marker. Running the sweep again
skips cells that have the marker and starts unfinished ones afresh; a finished cell whose
recorded settings (configs, args, overrides, model) differ from the spec's stops the sweep
before anything runs. Each run that starts cells adds a record to ``<output_dir>/provenance.json``
(commit, package versions, machine, load average, launcher, cells at once; ``provenance``).
``grpo-lightning-report <output_dir>`` then compares the variants in ``<output_dir>/report``.

Before any cell runs, the sweep checks that each runs what its name says (``labels``): a base
config that sets the model's class (or a variant file's model settings, or the data seed) is
refused, and each cell's command line is parsed as ``grpo-lightning fit`` parses it and compared
with its variant, seed and axis values; arms that differ in their clipping where every cell takes
one optimizer step per rollout, so that no clip bound can act, are warned of (``inert_clipping``).
Errors, Hydra's own included, are one ``error: ...`` line (exit status 2;
``GRPO_LIGHTNING_TRACEBACK=1`` raises them with the traceback).

This module is the Hydra entry point; ``spec`` validates the spec and lists its cells, ``labels``
checks them, ``launch`` hands them to the launcher, ``sweep`` runs each, ``provenance`` records what ran them and ``metrics``
summarises a finished cell.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from typing import Any

from grpo_lightning import bytecode, closed_output
from grpo_lightning.ablation.launch import HydraLaunch, check_launcher, is_local, launcher_target, run_cell_job
from grpo_lightning.ablation.spec import SweepError, SweepSpec
from grpo_lightning.ablation.sweep import CellResult, InProcess, Launch, run_sweep
from grpo_lightning.cli.resources import config_dir

#: The folder of the shipped sweep specs, the ``--config-name`` choices.
SPEC_DIR = config_dir() / "ablation"


def _user_errors() -> tuple[type[BaseException], ...]:
    """What ``main`` reports in one ``error: ...`` line: an invalid spec, a setting a fit would
    refuse, and Hydra's own errors (a misspelt key, an unknown config name)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from grpo_lightning.errors import ConfigError

    return (SweepError, ConfigError, HydraException, OmegaConfBaseException)


def sweep_from_config(cfg: Any, launch: Launch | None = None) -> list[CellResult]:
    """Run the sweep described by a Hydra/OmegaConf config (or a plain mapping): its cells one
    after another in this process, or through ``launch``."""
    results = run_sweep(SweepSpec.from_dict(cfg), launch)
    failed = [r for r in results if r.status == "failed"]
    for result in failed:
        print(f"FAILED {result.cell.name}: {result.message}", file=sys.stderr)
    if failed:
        raise SystemExit(1)
    return results


def sweep_job(cfg: Any) -> Any:
    """Hydra's task function, for the whole sweep and for each of its launcher's jobs:

    - the app's own run checks the sweep and starts a multirun of this function over its
      unfinished cells, through the launcher of the command line (``launch``);
    - such a job (``cell`` set) runs its one cell;
    - a job of the user's own multirun (``-m variant=grpo,dapo``) runs its cells one after another.

    A user's error is one line (Hydra would print its own line and a traceback around the message).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        spec = SweepSpec.from_dict(cfg)
        if spec.cell is not None:
            return run_cell_job(spec)
        target = launcher_target()
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            return sweep_from_config(cfg, InProcess(local=is_local(target)))
        check_launcher(spec, target)
        return sweep_from_config(cfg, HydraLaunch(sweep_job, target))
    except _user_errors() as error:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"error: {one_line(error)}", file=sys.stderr)
        raise SystemExit(2) from None


def main() -> None:
    """Hydra entry point: ``grpo-lightning-ablate [--config-name NAME] [-m] [key=value ...]``.

    ``--config-name`` picks a shipped spec (``configs/ablation/<NAME>.yaml``); ``--config-dir DIR``
    adds a folder of your own specs. A closed stdout or stderr silences the sweep's output, never its
    cells (:mod:`grpo_lightning.closed_output`). Python's bytecode goes to the package's cache where it may
    not write its own (:mod:`grpo_lightning.bytecode`).
    """
    bytecode.use_own_bytecode_cache()  # before Hydra, and the cells in this process, import anything
    import hydra

    closed_output.guard_standard_streams()

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    app = hydra.main(version_base="1.3", config_path=str(SPEC_DIR), config_name="default")(sweep_job)
    refuse_abbreviations(sys.argv[1:])
    full_error = os.environ.get(HYDRA_FULL_ERROR)  # the user's: Hydra's own report with the traceback
    os.environ[HYDRA_FULL_ERROR] = "1"  # Hydra raises its errors, reported here in one line
    try:
        app()
    except _user_errors() as error:
        if full_error == "1" or os.environ.get(TRACEBACK_ENV):
            raise
        message = one_line(error)
        if "Could not find 'hydra/launcher/" in message:
            message += f" ({LAUNCHERS_HINT})"
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        if full_error is None:
            os.environ.pop(HYDRA_FULL_ERROR, None)


def refuse_abbreviations(argv: list[str]) -> None:
    """Exit with one ``error:`` line (status 2) for a ``--option`` Hydra's parser does not have by its full
    name: argparse would take ``--config-n`` as ``--config-name``, a meaning a new option could change."""
    from hydra._internal.utils import get_args_parser  # the parser hydra.main parses the command line with

    names = [name for action in get_args_parser()._actions for name in action.option_strings]
    for arg in argv:
        name = arg.partition("=")[0]
        if name.startswith("--") and name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else "; see --help."
            print(f"error: {name}: no such option{hint}", file=sys.stderr)
            raise SystemExit(2)


HYDRA_FULL_ERROR = "HYDRA_FULL_ERROR"
LAUNCHERS_HINT = "the joblib and submitit launchers: pip install 'grpo-lightning[launchers]'"
#: Set (as for ``grpo-lightning``), a user's error is raised with its traceback.
TRACEBACK_ENV = "GRPO_LIGHTNING_TRACEBACK"


def one_line(error: BaseException) -> str:
    """The error's message on one line; Hydra's composition errors add their OmegaConf cause's first line."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    cause = error.__cause__
    if cause is not None and type(cause).__module__.startswith("omegaconf") and str(cause).strip():
        text += f" ({str(cause).strip().splitlines()[0]})"
    return text or type(error).__name__


if __name__ == "__main__":
    main()
