"""A cached build's lock says who holds it: a second process that has to wait names the holder's pid and what it builds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock

from grpo_lightning.quickstart.build_lock import build_lock, holder_path, read_holder
from grpo_lightning.quickstart.cached_build import build_once

#: A second process that takes the lock, then says so on stdout.
WAITER = """
import sys
from pathlib import Path
from grpo_lightning.quickstart.build_lock import build_lock
with build_lock(Path(sys.argv[1]), "the same model"):
    print("acquired", flush=True)
"""


def waiter_line(lock: Path, tmp_path: Path) -> tuple[str, subprocess.Popen]:
    """Start a second process on ``lock`` (held by the caller) and return the first line it writes to stderr."""
    err = tmp_path / "waiter.err"
    with open(err, "w") as stream:
        waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(lock)], stdout=subprocess.PIPE, stderr=stream, text=True)
    deadline = time.monotonic() + 60
    while not err.read_text() and waiter.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return err.read_text(), waiter


def test_a_process_waiting_on_a_held_lock_names_the_lock_the_holders_pid_and_what_it_builds(tmp_path):
    lock = tmp_path / ".model.lock"
    with build_lock(lock, "the tiny test model"):
        line, waiter = waiter_line(lock, tmp_path)
        assert waiter.poll() is None, "the second process did not wait for the lock"
    assert waiter.communicate(timeout=60)[0] == "acquired\n"  # and took it once released
    pattern = rf"waiting for {re.escape(str(lock))}: pid {os.getpid()} is building the tiny test model \(started \d\d:\d\d:\d\d\)\n"
    assert re.fullmatch(pattern, line)


def test_a_waiter_says_when_the_recorded_holder_is_gone(tmp_path):
    lock = tmp_path / ".model.lock"
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with FileLock(str(lock)):  # held by a process the record does not name
        holder_path(lock).write_text(f'{{"pid": {finished.stdout.strip()}, "what": "the old model", "started": 0}}')
        line, waiter = waiter_line(lock, tmp_path)
    waiter.communicate(timeout=60)
    assert f"pid {finished.stdout.strip()} (building the old model, started " in line and "is gone" in line


def test_a_build_records_its_holder_while_it_runs_and_removes_the_record_after(tmp_path):
    seen = []
    build_once(tmp_path / "m", lambda marker: False, lambda out: seen.append(read_holder(tmp_path / ".m.lock")),
               what="the tiny test model", takes="no steps")  # fmt: skip
    assert seen[0]["pid"] == os.getpid() and seen[0]["what"] == "the tiny test model"
    assert read_holder(tmp_path / ".m.lock") is None
