"""The file lock of a cached build, which says who holds it.

Its holder records its pid, host, what it builds and since when in a file beside the lock
(``<lock>.holder``); a process that finds the lock held prints one line naming the lock, its holder
and what it builds (or that the recorded holder is gone), then waits.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from grpo_lightning.progress import say

HOLDER_SUFFIX = ".holder"


@contextmanager
def build_lock(lock_path: Path, what: str) -> Iterator[None]:
    """Hold the file lock ``lock_path`` while building ``what`` (a phrase: "the quickstart's tiny model");
    if another process holds it, say who and what it builds, then wait for it."""
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say(waiting_line(lock_path))
        lock.acquire()
    holder = holder_path(lock_path)
    try:
        _write_holder(holder, what)
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


def holder_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + HOLDER_SUFFIX)


def _write_holder(holder: Path, what: str) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "what": what, "started": time.time()}
    partial = holder.with_name(f"{holder.name}.{os.getpid()}")
    partial.write_text(json.dumps(record) + "\n")
    os.replace(partial, holder)  # a waiter reads a whole record or none


def read_holder(lock_path: Path) -> dict[str, Any] | None:
    """The holder's record, or None where there is none (yet) or it cannot be read."""
    try:
        record = json.loads(holder_path(lock_path).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and {"pid", "what", "started"} <= record.keys() else None


def waiting_line(lock_path: Path) -> str:
    """What a process that finds ``lock_path`` held is waiting for."""
    record = read_holder(lock_path)
    if record is None:
        return f"waiting for {lock_path}: held by a process that has not said what it builds"
    started = time.strftime("%H:%M:%S", time.localtime(record["started"]))
    host = record.get("host", socket.gethostname())
    if host != socket.gethostname():
        return f"waiting for {lock_path}: pid {record['pid']} on {host} is building {record['what']} (started {started})"
    if not _alive(int(record["pid"])):
        return (
            f"waiting for {lock_path}: its recorded holder, pid {record['pid']} (building {record['what']}, "
            f"started {started}), is gone; a process it left running may hold the lock"
        )
    return f"waiting for {lock_path}: pid {record['pid']} is building {record['what']} (started {started})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
