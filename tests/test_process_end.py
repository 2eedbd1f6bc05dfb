"""A command's process ending without the interpreter's teardown (``grpo_lightning.process_end``): each
case is a new interpreter, since the end is its exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grpo_lightning import process_end

CHILD = """
import atexit, sys, threading, time
{before}
from grpo_lightning import process_end
print("armed", process_end.arm(), flush=True)
log = open(sys.argv[1], "w")  # left open: its buffer is written out when it is collected, or by the early end
log.write("written before the end\\n")

class Teardown:
    def __del__(self):
        print("teardown ran", flush=True)

kept = Teardown()  # a module's global: its __del__ runs in the interpreter's teardown
atexit.register(lambda: print("atexit ran", flush=True))

def late():
    time.sleep(0.3)
    print("thread joined", flush=True)

threading.Thread(target=late).start()  # not a daemon: joined before the atexit handlers
{end}
"""


def run(tmp_path, end: str, before: str = "") -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "log.txt"
    code = CHILD.format(before=before, end=end)
    # -S: no site hook registers an exit handler before the child's code (a .pth file that calls
    # certifi.where() does, and the early end then rightly stays off); this process's path finds the package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run([sys.executable, "-S", "-c", code, str(log)], capture_output=True, text=True, timeout=60, env=env)
    return child, log.read_text()


def test_a_finished_process_joins_its_threads_runs_its_handlers_and_flushes_its_files_then_skips_the_teardown(tmp_path):
    child, written = run(tmp_path, "process_end.finished(3)")
    assert child.returncode == 3, child.stderr
    assert child.stdout.split("\n")[:3] == ["armed True", "thread joined", "atexit ran"]
    assert "teardown ran" not in child.stdout and written == "written before the end\n"


def test_without_finished_the_process_ends_as_usual(tmp_path):
    child, written = run(tmp_path, "")
    assert child.returncode == 0, child.stderr
    assert "teardown ran" in child.stdout and written == "written before the end\n"


def test_a_handler_registered_before_it_keeps_the_usual_end(tmp_path):
    # the end would run before that handler, which would then never run
    child, _ = run(tmp_path, "process_end.finished(3)", before="atexit.register(print, 'first handler ran')")
    assert child.returncode == 0 and "armed False" in child.stdout
    assert "first handler ran" in child.stdout and "teardown ran" in child.stdout


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (2, 2), ("a message", 1)])
def test_the_exit_status_of_a_system_exit_is_the_interpreters(code, status):
    assert process_end.exit_status(SystemExit(code)) == status


def test_a_python_caller_of_the_cli_keeps_its_own_exit():
    # main() is the library's call (tests, notebooks, the quickstart): only console_main ends the process early
    from grpo_lightning.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert process_end._status is None
