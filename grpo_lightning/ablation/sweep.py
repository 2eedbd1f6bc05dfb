"""Running a sweep: one ``grpo-lightning fit`` process per unfinished cell (:mod:`.cell_process`), each in its own
folder that ends with a ``DONE`` marker. The cells run one after another here, or as the jobs of
a Hydra launcher (``launch``); either way each runs :func:`run_cell`."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from grpo_lightning.ablation import cell_process, inert_clipping, labels, provenance
from grpo_lightning.ablation.metrics import summarize_cell
from grpo_lightning.ablation.runs import DONE_FILE, is_done
from grpo_lightning.ablation.join import comparable
from grpo_lightning.ablation.spec import CONFIG_AXIS, WARMSTART, Cell, SweepError, SweepSpec, cli_value
from grpo_lightning.ablation.spec import portable_path, resolve_path, variant_config

logger = logging.getLogger(__name__)

CELL_FILE = "cell.json"
METRICS_FILE = "metrics.json"
LOG_FILE = "train.log"
#: The lock files of this machine's ``parallel`` slots, inside the sweep's folder.
SLOTS_DIR = "_slots"
#: Seconds between two looks for a free slot.
SLOT_POLL_S = 1.0


def resolve_model(spec: SweepSpec, announce: bool = True) -> str | None:
    """The ``--model.model`` value of every cell; ``warmstart`` trains (or reuses) the tiny model once.
    ``announce``: say so (a launcher job, which resolves it again, does not)."""
    if spec.model != WARMSTART:
        return spec.model
    from grpo_lightning.quickstart.warmstart import warm_start

    logger.log(logging.INFO if announce else logging.DEBUG, "Resolving model: warmstart %s", spec.warmstart or "(defaults)")
    return str(warm_start(**spec.warmstart))


def cell_command(spec: SweepSpec, cell: Cell, cell_dir: Path, model: str | None) -> list[str]:
    """The fit command line of one cell."""
    command = [spec.python, "-m", "grpo_lightning.cli", "fit"]
    # The variant's class_path comes first: settings given before it would be bound to the base
    # class, whose defaults would then replace the variant's own (DAPO's beta, clip_eps_high).
    configs = [resolve_path(f, f"overrides.{CONFIG_AXIS}") for f in cell.config_files()]
    for path in [variant_config(cell.variant), *spec.base_configs, *configs]:
        command += ["--config", str(path)]
    command += [
        "--seed_everything", str(cell.seed),
        "--trainer.default_root_dir", str(cell_dir),
        "--trainer.logger.init_args.save_dir", str(cell_dir),
        "--trainer.logger.init_args.name", "",
        "--trainer.logger.init_args.version", "",
    ]  # fmt: skip
    if model is not None:
        command += ["--model.model", model]
    if not spec.validate_before_training:  # every fit validates before its first step otherwise
        command += ["--validate_before_fit", "false"]
    # every trained completion in <cell>/completions.jsonl, for the report; `args` may turn it off
    command += ["--completions.jsonl", "true"]
    for key, value in [*spec.args.items(), *cell.overrides]:
        if key != CONFIG_AXIS:
            command += [f"--{key}", cli_value(value)]
    return command


@dataclass
class CellResult:
    cell: Cell
    directory: Path
    status: str  # "skipped", "done" or "failed"
    seconds: float = 0.0
    message: str = ""


def _settings_changed(spec: SweepSpec, cell: Cell) -> bool:
    try:
        recorded = json.loads((spec.output_dir / cell.name / CELL_FILE).read_text()).get("settings")
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict):
        return recorded is not None
    if isinstance(recorded.get("base_configs"), list):
        # records of earlier versions hold absolute paths
        recorded = {**recorded, "variant_config": portable_path(str(recorded.get("variant_config"))),
                    "base_configs": [portable_path(str(p)) for p in recorded["base_configs"]]}  # fmt: skip
    ours, theirs = comparable(recorded, spec.settings(cell))
    return ours != theirs


def _devices(gpus: Any) -> list[str]:
    """Device ids to hand out round-robin; none on a CPU machine."""
    if gpus in (None, False, "none", 0):
        return []
    if isinstance(gpus, (list, tuple)):
        return [str(g) for g in gpus]
    if isinstance(gpus, int):
        return [str(i) for i in range(gpus)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU")]


#: Each cell's share of its card goes in ``cell_process.MEMORY_FRACTION_ENV`` where cells share one, so
#: that one cell's growth fails that cell, not its neighbours.
MEMORY_FRACTION_ENV = cell_process.MEMORY_FRACTION_ENV
#: Of each card, what the cells' caps leave to CUDA contexts and the allocator's slack.
CARD_RESERVE = 0.05


def memory_fraction(parallel: int, devices: int) -> float:
    """Each cell's share of its card when ``parallel`` cells run on ``devices`` cards round-robin."""
    return (1.0 - CARD_RESERVE) / -(-parallel // devices)


def _threads_per_cell(threads: Any, parallel: int, on_gpus: bool) -> int | None:
    """CPU threads of each cell's torch: ``auto`` shares the cores among parallel CPU cells
    (oversubscribed torch threads spin and slow every cell down); ``None`` leaves torch's default."""
    if threads is None or threads == "none":
        return None
    if threads != "auto":
        if int(threads) < 1:
            raise SweepError(f"threads: must be at least 1, auto or null (got {threads}).")
        return int(threads)
    if "OMP_NUM_THREADS" in os.environ or on_gpus or parallel == 1:
        return None
    return max(1, (os.cpu_count() or 1) // parallel)


def run_cell(spec: SweepSpec, cell: Cell, model: str | None, env: Mapping[str, str] | None = None) -> CellResult:
    """Run one cell from scratch in a subprocess; ``metrics.json`` then ``DONE`` on success."""
    cell_dir = spec.output_dir / cell.name
    if cell_dir.exists():
        shutil.rmtree(cell_dir)
    cell_dir.mkdir(parents=True)
    command = cell_command(spec, cell, cell_dir, model)
    record = {**cell.identity(), "name": cell.name, "arm": cell.arm, "baseline": spec.baseline_arm(), "command": command,
              "settings": spec.settings(cell), "code": provenance.code_state()}  # fmt: skip
    (cell_dir / CELL_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    number, total = cell_number(spec, cell)
    logger.info("cell %d/%d: %s, seed %d, starting; its log: %s", number, total, cell.arm, cell.seed, cell_dir / LOG_FILE)
    started = time.perf_counter()
    with open(cell_dir / LOG_FILE, "w") as log:
        returncode = launch(command, log, env, spec.timeout_s)
    seconds = time.perf_counter() - started
    if returncode != 0:
        tail = (cell_dir / LOG_FILE).read_text(errors="replace").strip().splitlines()[-5:]
        message = f"exit status {returncode}; see {cell_dir / LOG_FILE}: " + " | ".join(tail)
        logger.error("cell %s failed: %s", cell.name, message)
        return CellResult(cell, cell_dir, "failed", seconds, message)
    metrics = summarize_cell(cell_dir, wall_time_s=seconds)
    (cell_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    (cell_dir / DONE_FILE).write_text("")
    logger.info("cell %s: done in %.1f s", cell.name, seconds)
    return CellResult(cell, cell_dir, "done", seconds)


def cell_number(spec: SweepSpec, cell: Cell) -> tuple[int, int]:
    """The cell's place among the sweep's cells (from 1), and their count: the same in every launcher's job."""
    cells = spec.cells()
    return cells.index(cell) + 1, len(cells)


def launch(command: Sequence[str], log, env: Mapping[str, str] | None, timeout_s: float | None = None) -> int:
    """Run the fit command with its output in ``log``; its exit status (124 after a timeout). The
    CLI run by this interpreter is forked from a process that imported it once (:mod:`.cell_process`);
    another command is a subprocess."""
    full_env = cell_environment(env)
    returncode = None
    if cell_process.can_fork(command):
        log.flush()
        try:
            returncode = cell_process.run_forked(command, log.name, full_env, timeout_s)
        except cell_process.ServerUnavailable as reason:
            logger.warning("cells run as subprocesses: %s", reason)
        log.seek(0, os.SEEK_END)  # the forked cell appended to the file
    if returncode is None:
        returncode = _run_subprocess(command, log, full_env, timeout_s)
    if returncode == 124:
        log.write(f"\n[grpo-lightning-ablate] stopped after the cell timeout of {timeout_s} s\n")
    return returncode


def cell_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A cell's environment: this process's, with its slot's variables (``env``), unbuffered output,
    and one hash seed for every cell (unless set): data whose order follows it (some of reasoning-gym's
    tasks) is then the same in every cell and every sweep, so their prompts pair."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.setdefault("PYTHONHASHSEED", "0")
    return full_env


def _run_subprocess(command: Sequence[str], log, env: Mapping[str, str], timeout_s: float | None) -> int:
    process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=dict(env))
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return 124
    except BaseException:
        process.kill()
        process.wait()
        raise


@contextmanager
def local_slot(spec: SweepSpec, index: int) -> Iterator[dict[str, str]]:
    """Hold one of this machine's ``spec.parallel`` slots while a cell runs; yield its environment
    (the slot's GPU, round-robin, and CPU threads). Lock files make the slots shared by every
    process of the sweep (a launcher's jobs), and trying from slot ``index`` on spreads
    consecutive cells over the GPUs."""
    from filelock import FileLock, Timeout

    devices = _devices(spec.gpus)
    threads = _threads_per_cell(spec.threads, spec.parallel, bool(devices))
    folder = spec.output_dir / SLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        for k in range(spec.parallel):
            slot = (index + k) % spec.parallel
            lock = FileLock(str(folder / f"slot{slot}.lock"))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            try:
                env = {"CUDA_VISIBLE_DEVICES": devices[slot % len(devices)]} if devices else {}
                if devices and spec.parallel > len(devices):  # cells share a card: each gets its part
                    env[MEMORY_FRACTION_ENV] = f"{memory_fraction(spec.parallel, len(devices)):.4f}"
                if threads is not None:
                    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
                yield env
            finally:
                lock.release()
            return
        time.sleep(SLOT_POLL_S)


def run_local_cell(spec: SweepSpec, cell: Cell, model: str | None, index: int, local: bool = True) -> CellResult:
    """:func:`run_cell` in one of this machine's slots (``local``), or on the devices a remote
    launcher's job was given (its ``CUDA_VISIBLE_DEVICES`` and threads left as they are)."""
    if not local:
        return run_cell(spec, cell, model)
    with local_slot(spec, index) as env:
        return run_cell(spec, cell, model, env)


class Launch(Protocol):
    """Runs a sweep's unfinished cells and returns their results in order (``launch.HydraLaunch``)."""

    name: str  # recorded in provenance.json
    local: bool  # whether the cells run on this machine
    in_this_process: bool  # whether this process starts the cells' processes (one after another)

    def __call__(self, spec: SweepSpec, cells: Sequence[Cell]) -> Iterable[CellResult]: ...


@dataclass
class InProcess:
    """One cell after another, in this process (outside Hydra, and in a job of a user's ``-m``
    multirun); ``local=False`` where that job runs on a node a remote launcher gave it."""

    local: bool = True
    name: str = "in-process"
    in_this_process: bool = True

    def __call__(self, spec: SweepSpec, cells: Sequence[Cell]) -> Iterator[CellResult]:
        model = resolve_model(spec)
        for index, cell in enumerate(cells):
            yield run_local_cell(spec, cell, model, index, self.local)


def _run_cells(spec: SweepSpec, todo: Sequence[Cell], results: dict[Cell, CellResult], launch: Launch) -> None:
    """Run ``todo`` into ``results`` through ``launch``; add a record to ``provenance.json``."""
    devices = _devices(spec.gpus) if launch.local else []
    threads = _threads_per_cell(spec.threads, spec.parallel, bool(devices)) if launch.local else None
    record = provenance.start_record(spec.parallel, threads, devices)
    record["launcher"] = launch.name
    with provenance.LoadMonitor() as monitor:
        try:
            for result in launch(spec, todo):
                results[result.cell] = result
        finally:  # a launcher that returns its results at once (joblib) and is stopped has returned none: markers say
            statuses = {cell.name: results[cell].status if cell in results else
                        "done" if is_done(spec.output_dir / cell.name) else "not finished" for cell in todo}  # fmt: skip
            provenance.append_record(spec.output_dir, provenance.finish_record(record, monitor, statuses))


def check_sweep(spec: SweepSpec, cells: Sequence[Cell], start_cell_server: bool = False, announce: bool = True) -> None:
    """Refuse to run ``cells`` unless each runs what its name says (``labels``) and each finished
    one was run with the spec's settings, and warn of arms that differ only where no clip bound can
    act (``inert_clipping``); before any cell runs, and again in each launcher job (``announce``
    False: the notes and warnings the first check logged are not logged again).
    ``start_cell_server``: the cells will be started from this process, so the server they are
    forked from (:mod:`.cell_process`) starts importing before the check of their configs, which
    imports the CLI here."""
    for cell in cells:
        variant_config(cell.variant)  # fail on a misspelt variant before any work
    for note in labels.check_shared_files(spec):  # a base config that sets an arm's class is refused
        logger.log(logging.INFO if announce else logging.DEBUG, "%s", note)
    unfinished = [cell for cell in cells if not is_done(spec.output_dir / cell.name)]
    commands = [cell_command(spec, cell, spec.output_dir / cell.name, spec.model) for cell in unfinished]
    if start_cell_server and commands and cell_process.can_fork(commands[0]):
        cell_process.start_server(cell_environment())
    configs = labels.check_cells(spec, unfinished, commands)  # each cell's resolved config against its name
    changed = [cell.name for cell in cells if is_done(spec.output_dir / cell.name) and _settings_changed(spec, cell)]
    if changed:
        raise SweepError(
            f"finished cells in {spec.output_dir} were run with other settings: {changed}. Give the sweep "
            "another output_dir, or delete these folders to run them again."
        )
    if announce:
        inert_clipping.warn_of_inert_clipping(unfinished, configs)  # clip settings compared where none can act


def warn_of_code_versions(results: Sequence[CellResult]) -> None:
    """Warn where the sweep's cells started from other versions of the library's code (an edit or a
    checkout while the sweep ran, a resume from another checkout): arms may then differ by code. The
    report says so too (``report.sections.provenance.code_warnings``)."""
    versions: dict[str, list[str]] = {}
    for result in results:
        try:
            code = json.loads((result.directory / CELL_FILE).read_text()).get("code") or {}
        except (OSError, ValueError):
            continue
        if code.get("source_sha256"):
            versions.setdefault(str(code["source_sha256"]), []).append(result.cell.name)
    if len(versions) > 1:
        logger.warning(
            "the cells ran %d versions of the library's code (source digests: %s): arms may differ by code as well "
            "as by setting; rerun the cells of the versions you did not mean to run",
            len(versions), "; ".join(f"{digest}: {', '.join(names)}" for digest, names in versions.items()),
        )  # fmt: skip


def run_sweep(spec: SweepSpec | Mapping[str, Any], launch: Launch | None = None) -> list[CellResult]:
    """Check ``spec``, then run every unfinished cell: one after another in this process, or
    through ``launch`` (a Hydra launcher: ``launch.HydraLaunch``)."""
    if not isinstance(spec, SweepSpec):
        spec = SweepSpec.from_dict(spec)
    cells = spec.cells()
    launch = launch or InProcess()
    unfinished = sum(not is_done(spec.output_dir / cell.name) for cell in cells)
    logger.info(
        "sweep %s: %d cell%s, %d to run, in %s; first each cell's settings are checked (the trainer is imported "
        "for that: up to a minute or two)", spec.name, len(cells), "" if len(cells) == 1 else "s", unfinished,
        spec.output_dir,
    )  # fmt: skip
    check_sweep(spec, cells, start_cell_server=launch.in_this_process)
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    results: dict[Cell, CellResult] = {}
    todo = []
    for cell in cells:
        if is_done(spec.output_dir / cell.name):
            logger.info("cell %s: done before, skipped", cell.name)
            results[cell] = CellResult(cell, spec.output_dir / cell.name, "skipped")
        else:
            todo.append(cell)
    if todo:
        _run_cells(spec, todo, results, launch)
    ordered = [results[c] for c in cells]
    warn_of_code_versions(ordered)
    counts = {s: sum(r.status == s for r in ordered) for s in ("done", "skipped", "failed")}
    logger.info(
        "sweep %s: %d done, %d skipped, %d failed -> %s",
        spec.name,
        counts["done"],
        counts["skipped"],
        counts["failed"],
        spec.output_dir,
    )
    return ordered
