"""Running a sweep's cells through a Hydra launcher: one job per unfinished cell.

``grpo-lightning-ablate`` checks the sweep, then starts a Hydra multirun over the ``cell`` key
(``++cell='grpo-seed0','grpo-seed1',...``) with whatever launcher the command line picked:
Hydra's basic launcher (one cell after another, in this process), ``hydra/launcher=joblib``
(``parallel`` local processes), ``hydra/launcher=submitit_local`` or ``submitit_slurm`` (a
submitit job per cell). Each job composes the same sweep spec with its ``cell`` and runs
:func:`run_cell_job`: the one command of :func:`grpo_lightning.ablation.sweep.run_cell`.

On a local launcher the cells of a sweep share this machine's ``parallel`` slots (lock files in
``<output_dir>/_slots``): each slot hands its cell a GPU (round-robin) and a share of the CPU
threads, whichever process runs the cell. A remote launcher's job takes the node it was given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_lightning.ablation.spec import Cell, SweepError, SweepSpec
from grpo_lightning.ablation.sweep import CellResult, check_sweep, is_done, resolve_model, run_local_cell

logger = logging.getLogger(__name__)

#: The launchers whose jobs run on this machine (their cells share its slots and GPUs).
LOCAL_LAUNCHERS = {
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher": "basic",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": "joblib",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "submitit_local",
}
BASIC = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


def launcher_target() -> str:
    """The ``_target_`` of the launcher the running Hydra app was given (the basic one outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return BASIC
    return str(HydraConfig.get().launcher.get("_target_", BASIC))


def launcher_name(target: str) -> str:
    return LOCAL_LAUNCHERS.get(target) or target.rsplit(".", 1)[-1]


def is_local(target: str) -> bool:
    return target in LOCAL_LAUNCHERS


def check_launcher(spec: SweepSpec, target: str) -> None:
    """``parallel`` cells at once need a launcher that runs several jobs at once."""
    if spec.parallel > 1 and target == BASIC:
        raise SweepError(
            f"parallel: {spec.parallel} cells at once need a launcher that runs several: add "
            "hydra/launcher=joblib (pip install 'grpo-lightning[launchers]'); Hydra's basic launcher runs one at a time."
        )


@dataclass
class HydraLaunch:
    """Runs a sweep's cells as the jobs of a Hydra multirun of the running app, through its
    launcher (``sweep.Launch``). ``task_function`` is the app's own, which runs each job's cell
    with :func:`run_cell_job`."""

    task_function: Callable[[Any], Any]
    target: str = field(default_factory=launcher_target)

    @property
    def name(self) -> str:
        return launcher_name(self.target)

    @property
    def local(self) -> bool:
        return is_local(self.target)

    @property
    def in_this_process(self) -> bool:
        return self.target == BASIC  # the basic launcher runs each job here, one after another

    def __call__(self, spec: SweepSpec, cells: Sequence[Cell]) -> list[CellResult]:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.hydra_config import HydraConfig

        resolve_model(spec)  # a warm start is trained here once; the jobs find it cached
        hydra_config = HydraConfig.get()
        hydra_overrides = [o for o in hydra_config.overrides.hydra if not o.startswith("hydra.mode=")]
        if self.target == JOBLIB and not any(o.startswith("hydra.launcher.n_jobs=") for o in hydra_overrides):
            hydra_overrides.append(f"hydra.launcher.n_jobs={spec.parallel}")
        names = ",".join(f"'{cell.name}'" for cell in cells)  # names are [A-Za-z0-9.+_-]: safe to quote
        overrides = [*hydra_overrides, "hydra.mode=MULTIRUN", *hydra_config.overrides.task, f"++cell={names}"]
        logger.info("launching %d cells with the %s launcher", len(cells), self.name)
        try:
            batches = GlobalHydra.instance().hydra.multirun(
                hydra_config.job.config_name, self.task_function, overrides, with_log_configuration=False
            )
        except Exception as error:  # a job that died (SLURM's time limit, a lost node): its cell has no DONE
            logger.error("the %s launcher's jobs did not all finish: %s", self.name, error)
            return [_result_on_disk(spec, cell, f"its job did not finish: {error}") for cell in cells]
        results = {job.return_value.cell.name: job.return_value for batch in batches for job in batch}
        return [results[cell.name] for cell in cells]


def _result_on_disk(spec: SweepSpec, cell: Cell, message: str) -> CellResult:
    """A cell's result read from its folder: done if it has its ``DONE`` marker, else failed."""
    cell_dir = spec.output_dir / cell.name
    if is_done(cell_dir):
        return CellResult(cell, cell_dir, "done")
    return CellResult(cell, cell_dir, "failed", message=" ".join(message.split()))


def run_cell_job(spec: SweepSpec) -> CellResult:
    """One launcher job: the cell named ``spec.cell``, checked again where it runs (the job may
    come from a hand-written ``cell=``), and skipped if another run finished it."""
    by_name = {cell.name: (index, cell) for index, cell in enumerate(spec.cells())}
    if spec.cell not in by_name:
        raise SweepError(f"cell: the sweep has no cell {spec.cell!r}; its cells: {sorted(by_name)}.")
    index, cell = by_name[spec.cell]
    check_sweep(spec, [cell], announce=False)  # the sweep's own check said its notes
    cell_dir = spec.output_dir / cell.name
    if is_done(cell_dir):
        return CellResult(cell, cell_dir, "skipped")
    return run_local_cell(spec, cell, resolve_model(spec, announce=False), index, local=is_local(launcher_target()))
