"""``provenance.json`` of a sweep: the code, packages and machine that ran its cells, and how
loaded the machine was, recorded at run time so that the report need not be told.

The file holds a list: one record per run of ``grpo-lightning-ablate`` that started cells (a
resumed sweep adds one). Nothing here imports torch or Lightning.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Self

PROVENANCE_FILE = "provenance.json"
#: Distributions whose versions are recorded.
PACKAGES = ("grpo-lightning", "torch", "transformers", "lightning")
#: Seconds between two readings of the load average while cells run.
LOAD_INTERVAL_S = 5.0


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _output(command: list[str], cwd: Path | None = None) -> str | None:
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def git_commit(root: Path | None = None, with_diff: bool = True) -> dict[str, Any]:
    """The commit of the checkout grpo_lightning is imported from (none when installed from a wheel),
    whether files differed from it, and how, so a dirty run can be redone: ``diff``, ``git diff HEAD`` of
    tracked files changed or added; ``deleted``, the tracked files gone (their text is in the commit), a
    folder none of whose tracked files is left as ``folder/``; ``untracked``, the paths of files git does
    not track nor ignore (a new config or module).
    ``with_diff`` False: diff and deletions are left out (``""``, ``[]``), where only whether the tree is
    dirty matters."""
    root = Path(root).resolve() if root is not None else Path(__file__).resolve().parents[2]
    top = _output(["git", "rev-parse", "--show-toplevel"], root)
    commit = _output(["git", "rev-parse", "HEAD"], root)
    if not commit or not top or Path(top).resolve() != root:  # an installed copy inside some other checkout
        return {"commit": None, "dirty": None, "diff": None, "deleted": None, "untracked": None}
    status = _output(["git", "status", "--porcelain", "--untracked-files=no"], root)
    untracked = _output(["git", "ls-files", "--others", "--exclude-standard", "-z"], root)
    diff, deleted = "", []
    if status and with_diff:
        diff = _output(["git", "diff", "HEAD", "--no-color", "--no-ext-diff", "--diff-filter=d"], root)
        gone = _output(["git", "diff", "HEAD", "--name-only", "--diff-filter=D", "-z"], root)
        tracked = _output(["git", "ls-files", "-z"], root) if gone else ""
        deleted = None if gone is None or tracked is None else deleted_folders(_paths(gone), _paths(tracked))
    paths = None if untracked is None else _paths(untracked)
    dirty = None if status is None or paths is None else bool(status or paths)
    return {"commit": commit, "dirty": dirty, "diff": diff, "deleted": deleted, "untracked": paths}


def _paths(nul_separated: str) -> list[str]:
    return [path for path in nul_separated.split("\0") if path]


def deleted_folders(deleted: list[str], tracked: list[str]) -> list[str]:
    """``deleted`` (tracked paths gone from the checkout) with each folder none of whose ``tracked`` files
    is left written once, as ``folder/``, at the highest such folder: 3,000 result files removed from a
    copy are a line or two, and every path is still accounted for."""
    gone = set(deleted)
    left: set[str] = set()  # folders that still hold a tracked file
    for path in tracked:
        if path not in gone:
            parts = path.split("/")[:-1]
            left.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    summary = set()
    for path in gone:
        parts = path.split("/")
        whole = next(("/".join(parts[: i + 1]) for i in range(len(parts) - 1) if "/".join(parts[: i + 1]) not in left),
                     None)  # fmt: skip
        summary.add(path if whole is None else whole + "/")
    return sorted(summary)


def source_roots() -> list[Path]:
    """The folders of the library's Python source: the package, and in a checkout the top-level
    ``variants/`` folder it maps onto ``grpo_lightning.variants``."""
    package = Path(__file__).resolve().parents[1]
    variants = package.parent / "variants"
    init = variants / "__init__.py"
    shim = init.is_file() and "grpo_lightning.variants" in init.read_text(encoding="utf-8", errors="replace")
    return [package, variants] if shim else [package]


def source_digest(roots: list[Path] | None = None) -> str | None:
    """The first 16 hex digits of a SHA-256 over the library's ``.py`` files (their paths and bytes):
    the code a process runs, from a checkout, clean or not, or from an installed wheel. ``None``
    where a file cannot be read."""
    digest = hashlib.sha256()
    try:
        for number, root in enumerate(roots or source_roots()):
            for path in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts):
                digest.update(f"{number}/{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
                digest.update(b"\0")
    except OSError:
        return None
    return digest.hexdigest()[:16]


def code_state() -> dict[str, Any]:
    """What a cell's ``cell.json`` records of the code it started with: the commit, whether the checkout
    differed from it (its diff stays in the sweep's ``provenance.json``), and the source digest, which
    tells two cells' code apart where the commit alone cannot (an edit during the sweep, another checkout)."""
    state = git_commit(with_diff=False)
    return {"commit": state["commit"], "dirty": state["dirty"], "source_sha256": source_digest()}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    out = _output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return [line.strip() for line in (out or "").splitlines() if line.strip()]


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


class LoadMonitor:
    """The highest 1-minute load average seen while the cells run, read every ``interval_s``."""

    def __init__(self, interval_s: float = LOAD_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _read(self) -> None:
        load = load_average()
        if load is not None:
            self.peak = load[0] if self.peak is None else max(self.peak, load[0])

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> Self:
        self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read()


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "gpus": gpu_names(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def start_record(parallel: int, threads: int | None, devices: list[str]) -> dict[str, Any]:
    """What is known before the first cell starts."""
    return {
        "command": " ".join(sys.argv),
        "started": now(),
        **git_commit(),
        "source_sha256": source_digest(),
        "packages": package_versions(),
        "machine": machine(),
        "parallel": parallel,
        "threads_per_cell": threads,
        "devices": list(devices),
        "load_start": load_average(),
    }


def finish_record(record: dict[str, Any], monitor: LoadMonitor, cells: dict[str, str]) -> dict[str, Any]:
    """``record`` with the end time, the load at the end and its peak, and each cell's status."""
    return {**record, "finished": now(), "load_end": load_average(), "load_peak": monitor.peak, "cells": cells}


def append_record(output_dir: Path, record: dict[str, Any]) -> None:
    """Add ``record`` to the sweep's ``provenance.json`` (a list; written whole, then renamed; under
    a lock, for the jobs of a multirun that finish at once)."""
    from filelock import FileLock

    path = Path(output_dir) / PROVENANCE_FILE
    with FileLock(str(path.with_name(f".{path.name}.lock"))):
        records = read_records(path)
        records.append(record)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(records, indent=2, sort_keys=True) + "\n")
        temporary.replace(path)


def read_records(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    return [data] if isinstance(data, dict) else [r for r in data if isinstance(r, dict)]
