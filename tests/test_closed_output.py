"""A closed stdout or stderr silences a process's output, never its work (``grpo_lightning.closed_output``): each
case is a new interpreter whose reader goes away, then it writes, through Python and through the file descriptor
as native code does, and leaves a file to say it went on. A fit through the command line:
``tests/checkpoints/test_final_checkpoint.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = """
import os, sys
from grpo_lightning import closed_output
if sys.argv[2] == "guarded":
    closed_output.guard_standard_streams()
stream = getattr(sys, sys.argv[3])
print("ready", file=stream, flush=True)
sys.stdin.readline()  # the reader has gone
for _ in range(1000):
    print("a line nobody reads", file=stream, flush=True)
os.write(stream.fileno(), b"native code writes too\\n")
open(sys.argv[1], "w").write("went on")
"""
AT_EXIT = """
import sys
from grpo_lightning import closed_output
if sys.argv[1] == "guarded":
    closed_output.guard_standard_streams()
print("ready", flush=True)
sys.stdin.readline()  # the reader has gone
print("left in the buffer for the interpreter's last flush", end="")
"""


def start(tmp_path, guarded: bool, stream: str, output) -> subprocess.Popen:
    args = [sys.executable, "-c", CHILD, str(tmp_path / "went_on"), "guarded" if guarded else "plain", stream]
    other = {"stderr": subprocess.PIPE} if stream == "stdout" else {"stdout": subprocess.DEVNULL}
    return subprocess.Popen(args, stdin=subprocess.PIPE, **{stream: output}, **other)


def close_stdout_reader(tmp_path, guarded: bool) -> tuple[int, str]:
    """The child writes to stdout, a pipe whose reader closes after the first line; its status and stderr."""
    child = start(tmp_path, guarded, "stdout", subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    child.stdout.close()
    _, errors = child.communicate(b"go\n", timeout=60)
    return child.returncode, errors.decode()


def test_writes_to_a_closed_pipe_go_nowhere_and_the_process_goes_on_to_exit_0(tmp_path):
    status, errors = close_stdout_reader(tmp_path, guarded=True)
    assert status == 0, errors
    assert (tmp_path / "went_on").exists()
    assert errors == "stdout is closed (Broken pipe): the rest of the output is dropped, the work goes on\n"


def test_without_the_guard_the_first_write_to_a_closed_pipe_ends_the_process(tmp_path):
    status, errors = close_stdout_reader(tmp_path, guarded=False)
    assert status == 1 and "BrokenPipeError" in errors
    assert not (tmp_path / "went_on").exists()


@pytest.mark.parametrize(("guarded", "status"), [(True, 0), (False, 1)], ids=["guarded", "plain"])
def test_a_terminal_that_hung_up_silences_stderr_too(tmp_path, guarded, status):
    # A pseudo-terminal whose other side closes: writes to it fail with EIO, as a closed ssh session's do.
    controller, terminal = os.openpty()
    child = start(tmp_path, guarded, "stderr", terminal)
    os.close(terminal)
    with os.fdopen(controller, "rb", buffering=0) as screen:
        assert screen.read(64).startswith(b"ready")
    child.communicate(b"go\n", timeout=60)
    assert child.returncode == status
    assert (tmp_path / "went_on").exists() == guarded


@pytest.mark.parametrize(("guarded", "status"), [(True, 0), (False, 120)], ids=["guarded", "plain"])
def test_the_interpreters_last_flush_to_a_closed_pipe_keeps_the_exit_status(guarded, status):
    # 120: the status CPython gives a process whose stdout fails to flush at exit (stdout buffered, as by default)
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    child = subprocess.Popen(
        [sys.executable, "-c", AT_EXIT, "guarded" if guarded else "plain"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=buffered,
    )  # fmt: skip
    assert child.stdout.readline() == b"ready\n"
    child.stdout.close()
    child.communicate(b"go\n", timeout=60)
    assert child.returncode == status


@pytest.mark.parametrize(
    "entry, argv",
    [("grpo_lightning.quickstart:main", ["--variant", "no_such_variant"]),
     ("grpo_lightning.ablation.run:main", ["--config-name", "no_such_spec"])],
)  # fmt: skip
def test_the_other_console_scripts_guard_their_streams_before_any_work(entry, argv, monkeypatch):
    """``grpo-lightning-quickstart`` and ``grpo-lightning-ablate`` put the guard on first, as the CLI does
    (here each stops at once on an argument it refuses)."""
    import importlib
    import logging

    from grpo_lightning import closed_output

    guarded = []
    monkeypatch.setattr(closed_output, "guard_standard_streams", lambda: guarded.append(True))
    # the sweep's main configures the root logger with this test's captured stderr: undone after the test
    monkeypatch.setattr(logging.root, "handlers", list(logging.root.handlers))
    monkeypatch.setattr(logging.root, "level", logging.root.level)
    module, name = entry.split(":")
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    with pytest.raises(SystemExit):
        getattr(importlib.import_module(module), name)()
    assert guarded == [True]
