"""Each cell in a new process, forked from one that has imported the CLI already.

A new Python process pays for importing torch, Lightning and transformers before a cell can start:
about 7 s on a 2-core CPU and 13-18 s on a GPU machine's image, where Lightning's imports of
torchmetrics and ``torch._dynamo`` are most of it. That is most of a short cell's time. So a sweep
starts one server process that imports the CLI once (:func:`serve`), and each cell is forked from
it: still a process of its own, which starts from the state the imports left, runs its command line
through :func:`grpo_lightning.cli.main` as ``python -m grpo_lightning.cli`` would, and takes its state
with it when it exits, so nothing passes from one cell to the next.

The server is a fresh interpreter with the sweep's environment, working directory and Python, never
the sweep's own process forked (its threads, Hydra and logging state stay out of the cells). A
command of another Python, or a platform without ``fork``, runs as a subprocess. Importing initialises
no CUDA, so each cell's GPU is chosen by its own ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from grpo_lightning import process_end
from grpo_lightning.import_pause import collection_paused
from grpo_lightning.variants import PRESETS

#: Imported once by the server that forks the cells: the command line and the presets' modules.
PRELOAD = ("grpo_lightning.cli.app", *(f"grpo_lightning.variants.{name}" for name in PRESETS))
#: What a cell's command runs after the interpreter; a forked cell runs it in the server's place.
CLI_MODULE = ("-m", "grpo_lightning.cli")
#: Variables a sweep sets per cell; any other difference from the server's environment starts a new
#: server, since a library may read it while it is imported.
#: The share of its card's memory a cell may allocate, set where several cells share a card and read
#: by the command line (``grpo_lightning.cli.app.cap_cuda_memory``, which names it without importing this).
MEMORY_FRACTION_ENV = "GRPO_LIGHTNING_CUDA_MEMORY_FRACTION"
PER_CELL_VARIABLES = frozenset({
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED", MEMORY_FRACTION_ENV,
})  # fmt: skip

_current: CellServer | None = None
_server_lock = threading.Lock()


def can_fork(command: Sequence[str]) -> bool:
    """Whether ``command`` is this interpreter running the CLI, on a platform that forks. The path must
    be this one's, not one resolving to the same file: another virtual environment's ``python`` is a
    link to the same interpreter, with other packages."""
    if not hasattr(os, "fork") or sys.platform == "darwin" or tuple(command[1:3]) != CLI_MODULE:
        return False
    return os.path.abspath(command[0]) == os.path.abspath(sys.executable)


def run_forked(command: Sequence[str], log_path: str | Path, env: Mapping[str, str], timeout_s: float | None) -> int:
    """Run ``command`` (see :func:`can_fork`) in a process forked from a server that imported the CLI,
    its output appended to ``log_path`` and its environment exactly ``env``; its exit status (negative:
    the signal that ended it), or 124 once ``timeout_s`` has passed (the process is killed)."""
    return _server(env).run(list(command[3:]), dict(env), os.getcwd(), str(log_path), timeout_s)


def start_server(env: Mapping[str, str]) -> None:
    """Start a server for ``env`` where none runs, without waiting for its imports: a sweep starts it
    before checking its cells, so that the server and the check import the CLI at the same time."""
    global _current
    with _server_lock:
        if _current is None:
            _current = CellServer(env)


def _server(env: Mapping[str, str]) -> CellServer:
    """The running server, if its imports ran under ``env`` in this working directory, or a new one."""
    global _current
    with _server_lock:
        if _current is not None and _current.refused:  # it would refuse again: every cell is a subprocess
            raise ServerUnavailable(_current.refused)
        if _current is None or not _current.serves(env):
            if _current is not None:
                _current.close()
            _current = CellServer(env)
        return _current


class ServerUnavailable(RuntimeError):
    """The server could not fork the cell (it refused, or it has exited): run it as a subprocess."""


class CellServer:
    """The client side: a :func:`serve` process and the exit statuses it reports."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.cwd = os.getcwd()
        self.environment = {k: v for k, v in env.items() if k not in PER_CELL_VARIABLES}
        self.set_by_imports: dict[str, str] = {}
        self.ready = threading.Event()
        self.process = subprocess.Popen(
            # the early end armed before any import registers an atexit handler (grpo_lightning.process_end)
            [sys.executable, "-c", "from grpo_lightning import bytecode, process_end; bytecode.use_own_bytecode_cache(); "
                                   "process_end.arm(); "
                                   "from grpo_lightning.ablation.cell_process import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.environment,
        )  # fmt: skip
        self.request_lock = threading.Lock()
        self.started: queue.Queue[int] = queue.Queue()
        self.exits: dict[int, queue.Queue[int]] = {}
        self.exits_lock = threading.Lock()
        self.refused: str | None = None
        self.reader = threading.Thread(target=self._read_reports, daemon=True)
        self.reader.start()
        atexit.register(self.close)

    def alive(self) -> bool:
        return self.process.poll() is None

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a new process in ``env`` would have imported what this one did: the same working
        directory and variables (per-cell ones aside), but for those its imports set themselves
        (Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK``, for one), which may be there or not."""
        self.ready.wait()
        if not self.alive() or os.getcwd() != self.cwd:
            return False
        wanted = {k: v for k, v in env.items() if k not in PER_CELL_VARIABLES}
        extra = {k: v for k, v in wanted.items() if k not in self.environment}
        return all(k in wanted and wanted[k] == v for k, v in self.environment.items()) and all(
            self.set_by_imports.get(k) == v for k, v in extra.items()
        )

    def _exit_queue(self, pid: int) -> queue.Queue[int]:
        with self.exits_lock:
            return self.exits.setdefault(pid, queue.Queue())

    def _read_reports(self) -> None:
        with self.process.stdout:  # closed once the server has exited
            self._dispatch(self.process.stdout)
        self.ready.set()
        self.started.put(-1)  # the server is gone: nothing it started will report again
        with self.exits_lock:
            for statuses in self.exits.values():
                statuses.put(1)

    def _dispatch(self, lines) -> None:
        for line in lines:
            report = json.loads(line)
            if "ready" in report:
                self.set_by_imports = report["ready"]
                self.ready.set()
            elif "refused" in report:
                self.refused = report["refused"]
                self.ready.set()
            elif "started" in report:
                self.started.put(report["started"])
            else:
                self._exit_queue(report["pid"]).put(report["status"])

    def run(self, arguments: list[str], env: dict[str, str], cwd: str, log_path: str, timeout_s: float | None) -> int:
        request = json.dumps({"arguments": arguments, "env": env, "cwd": cwd, "log": log_path}) + "\n"
        with self.request_lock:  # one request at a time, so each "started" answers the request before it
            try:
                self.process.stdin.write(request.encode())
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError):  # the server has exited, or was closed
                raise ServerUnavailable(f"the server exited with status {self.process.wait()}") from None
            pid = self.started.get()
        if pid < 0:
            raise ServerUnavailable(self.refused or f"the server exited with status {self.process.wait()}")
        statuses = self._exit_queue(pid)
        try:
            return statuses.get(timeout=timeout_s)
        except queue.Empty:
            _kill(pid)
            statuses.get()
            return 124
        except BaseException:
            _kill(pid)
            raise

    def close(self) -> None:
        if self.alive():
            self.process.stdin.close()  # the server exits once its cells have
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.reader.join(timeout=1)  # it closes the reports' pipe


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def serve() -> None:
    """The server: import :data:`PRELOAD`, then for each request line on stdin fork a cell
    (:func:`run_cli`), report ``{"started": pid}`` and later ``{"pid": pid, "status": code}`` on
    stdout. One thread, so forking is safe; it exits when stdin closes and its cells have exited."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the sweep and its cells; the server ends with its input
    reports = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not reach the reports
    requests = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
    before = dict(os.environ)
    with collection_paused():  # and what it imported is frozen before the cells are forked
        for module in PRELOAD:
            try:
                importlib.import_module(module)
            except Exception:  # the cells import it again and report why it fails
                pass
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        reports.write(json.dumps({"refused": "CUDA was initialised while importing"}) + "\n")
        return  # a forked process could not use it: the cells run as subprocesses
    set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
    reports.write(json.dumps({"ready": set_by_imports}) + "\n")
    running: set[int] = set()
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    pending, open_ = b"", True
    while open_ or running:
        if open_ and selector.select(timeout=0.05):
            chunk = requests.read(65536)
            open_ = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    requests.close()
                    reports.close()
                    # the interpreter's own exit, as a new process's: non-daemon threads are joined and atexit
                    # handlers (a W&B run's finish, say) run; then it ends without the teardown (process_end)
                    status = _run_cell(json.loads(line), set_by_imports)
                    process_end.finished(status)
                    sys.exit(status)
                running.add(pid)
                reports.write(json.dumps({"started": pid}) + "\n")
        elif not open_:
            time.sleep(0.05)
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                reports.write(json.dumps({"pid": pid, "status": os.waitstatus_to_exitcode(status)}) + "\n")


def _run_cell(request: dict, set_by_imports: dict[str, str]) -> int:
    """In the forked process: the cell's exit status. Its environment is the request's, with what the
    imports set where the request has nothing, as in a new process that imported them."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a new process
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's requests
    try:
        run_cli(request["arguments"], {**set_by_imports, **request["env"]}, request["cwd"], request["log"])
        code = 0
    except SystemExit as done:
        code = process_end.exit_status(done)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    return code


def run_cli(arguments: list[str], env: dict[str, str], cwd: str, log_path: str) -> None:
    """Become ``python -m grpo_lightning.cli ARGUMENTS`` run in ``cwd`` with environment ``env``
    and output appended to ``log_path``, and run it."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, cwd)  # as ``python -m`` puts the working directory first
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        os.dup2(log, stream.fileno())
        stream.reconfigure(line_buffering=True)
    os.close(log)
    threads = env.get("OMP_NUM_THREADS")
    if threads:  # read when the server started, not when the cell did: set it as a new process would have
        import torch

        torch.set_num_threads(int(threads))
    from grpo_lightning.cli import main

    # What ``python -m grpo_lightning.cli`` sets, and what launchers that start more processes of the
    # same command read (Lightning's DDP on a CPU runs ``python -m <__main__.__spec__.name>``).
    sys.modules["__main__"].__spec__ = importlib.util.find_spec("grpo_lightning.cli.__main__")
    sys.argv = [sys.modules["__main__"].__spec__.origin, *arguments]
    main()
