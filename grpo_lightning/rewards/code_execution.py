"""Code execution reward: the fraction of a dataset row's test cases that the completion's Python program passes.

The program is the completion's last fenced ```` ```python ```` block (else its last fenced block). Test
cases come from a dataset column, as a list of assert statements (each runs after the program, and
passes when it raises nothing) or a list of ``{"input": stdin, "output": expected stdout}`` (stdout is
compared with trailing whitespace stripped, line by line), or either as a JSON string.

Assert tests are split (:mod:`grpo_lightning.rewards.sandbox.assert_tests`): the sandbox returns the value of
each call, and this process compares it with the expected one, which never enters the sandbox.

Every run is a fresh interpreter confined by :mod:`grpo_lightning.rewards.sandbox.code_sandbox`, under
bubblewrap where it runs (:mod:`grpo_lightning.rewards.sandbox.command`), in a new
temporary directory (removed afterwards) with an empty environment, its own process group, a
wall-clock deadline and caps on its output and on the files it holds (``disk_mb``); runs go
through a bounded pool of worker threads. What a completion does to itself (loops, crashes, forks,
floods) scores 0 and never raises. The limits of that confinement: docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grpo_lightning.rewards.sandbox import assert_tests, code_sandbox
from grpo_lightning.rewards.sandbox.disk_use import DISK_POLL_S, disk_use
from grpo_lightning.rewards.sandbox import command as sandbox_command
from grpo_lightning.rewards.scoring import completion_text

FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_TAGS = {"python", "python3", "py"}
EXPECTED_FORMAT = (
    'a list of assert statements such as ["assert add(1, 2) == 3"], or a list of '
    '{"input": stdin text, "output": expected stdout}, or either as a JSON string'
)
READ_CHUNK = 1 << 16


def extract_code(text: str) -> str | None:
    """The last fenced ```` ```python ```` (or ``py``, ``python3``) block of ``text``, else its last fenced
    block of any language; ``None`` when it has none."""
    blocks = FENCE.findall(text)
    python = [code for tag, code in blocks if tag.lower() in PYTHON_TAGS]
    chosen = python or [code for _, code in blocks]
    return chosen[-1] if chosen else None


@dataclass(frozen=True)
class TestCases:
    """One row's tests: ``asserts`` (statements) or ``stdio`` (``(input, expected output)`` pairs)."""

    __test__ = False  # not a pytest test class
    mode: str
    cases: tuple


def parse_test_cases(value: Any, column: str, row: int) -> TestCases | None:
    """The tests in one row of ``column``; ``None`` when the row has none. Raises ``ValueError`` naming
    the column, the row and the expected format when the value is none of them."""

    def malformed(problem: str) -> ValueError:
        return ValueError(f"column {column!r}, row {row}: {problem}; expected {EXPECTED_FORMAT}.")

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise malformed(f"the string is not JSON ({error})") from error
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise malformed(f"got {type(value).__name__} {value!r:.80}")
    if not value:
        return None
    if all(isinstance(case, str) for case in value):
        for index, statement in enumerate(value):
            try:
                compile(statement, f"<test {index}>", "exec")
            except (SyntaxError, ValueError) as error:
                raise malformed(f"test {index} {statement!r:.80} is not valid Python ({error})") from error
        return TestCases("asserts", tuple(value))
    pairs = []
    for index, case in enumerate(value):
        if not (isinstance(case, dict) and isinstance(case.get("input"), str) and isinstance(case.get("output"), str)):
            raise malformed(f"test {index} is {case!r:.80}, not a string or a dict of string 'input' and 'output'")
        pairs.append((case["input"], case["output"]))
    return TestCases("stdio", tuple(pairs))


def same_output(actual: str, expected: str) -> bool:
    """Equal after stripping trailing whitespace from each line and trailing blank lines."""

    def normalized(text: str) -> list[str]:
        return [line.rstrip() for line in text.replace("\r\n", "\n").rstrip().split("\n")]

    return normalized(actual) == normalized(expected)


@dataclass
class Run:
    """How one sandboxed run ended: ``status`` is the exit status, ``None`` when it was stopped
    (deadline or output cap); ``output`` is at most ``max_output_bytes`` of its stdout; ``passed``
    counts the assert tests it passed (passes reported before it was stopped count)."""

    status: int | None
    output: bytes
    passed: int = 0
    nonce: str = ""  # what a whole assert test's run prints when it passes


@dataclass(frozen=True)
class _Job:
    """One run: ``mode`` ``stdio`` (``stdin``, judged against ``expected``), ``calls`` (the split
    tests ``split``) or ``statement`` (one whole test)."""

    row: int
    mode: str
    program: str
    stdin: bytes = b""
    expected: str | None = None
    split: tuple[tuple[assert_tests.SplitTest, ...], ...] = ()  # each test's parts
    statement: str | None = None


class CodeExecutionReward:
    """Reward function ``(prompts, completions, **columns) -> list[float | None]``: the fraction of the
    row's test cases in ``column`` that the completion's program passes; 0.0 without a code block,
    ``None`` for a row without tests.

    Configure it as ``{"class_path": "grpo_lightning.rewards.CodeExecutionReward", "init_args":
    {"column": "tests"}}``; ``grpo_lightning.rewards.code_execution_reward`` is the default instance.

    Args:
        column: Dataset column holding the test cases.
        timeout_s: Wall-clock limit of one run: the program and all its split assert tests, one whole
            assert test, or one stdin test.
        memory_mb: Address-space limit of a run (``RLIMIT_AS``).
        max_output_bytes: Output a run may print before it is stopped.
        file_size_mb: Largest file a run may write (``RLIMIT_FSIZE``).
        disk_mb: Most a run's files may hold together: the size of the tmpfs that is its directory
            (bubblewrap 0.8+, or the ``python`` backend where user namespaces are allowed); elsewhere
            its directory is polled, and a run found holding more is stopped
            (:mod:`~grpo_lightning.rewards.sandbox.disk_use`).
        workers: Runs at once; ``None``: ``min(4, os.cpu_count())``.
        name: Name under which the rewards are logged.
        sandbox: ``auto`` (bubblewrap where it runs, else the interpreter's own layers, warned once),
            ``bubblewrap`` (an error where it cannot run) or ``python`` (see
            :mod:`~grpo_lightning.rewards.sandbox.command`).
    """

    def __init__(
        self,
        column: str = "test_cases",
        timeout_s: float = 5.0,
        memory_mb: int = 1024,
        max_output_bytes: int = 1 << 20,
        file_size_mb: int = 16,
        disk_mb: int = 64,
        workers: int | None = None,
        name: str = "code_execution_reward",
        sandbox: str = "auto",
    ) -> None:
        positive = (("timeout_s", timeout_s), ("memory_mb", memory_mb), ("file_size_mb", file_size_mb),
                    ("disk_mb", disk_mb))  # fmt: skip
        for field, value in positive:
            if not value > 0:
                raise ValueError(f"CodeExecutionReward {field}={value} must be positive.")
        if max_output_bytes < 1 or (workers is not None and workers < 1):
            raise ValueError(
                f"CodeExecutionReward max_output_bytes={max_output_bytes} and workers={workers} must be at least 1."
            )
        if sandbox not in sandbox_command.BACKENDS:
            choices = ", ".join(sandbox_command.BACKENDS)
            raise ValueError(f"CodeExecutionReward sandbox={sandbox!r} must be one of {choices}.")
        self.column = column
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_output_bytes = max_output_bytes
        self.file_size_mb = file_size_mb
        self.disk_mb = disk_mb
        self.workers = workers or min(4, os.cpu_count() or 1)
        self.sandbox = sandbox
        self.__name__ = name
        self._checked = False
        self._warned_whole = False
        self._check_lock = threading.Lock()

    @property
    def backend(self) -> str:
        """The backend runs use: ``bubblewrap`` or ``python`` (decided once per process for ``auto``)."""
        return sandbox_command.resolve(self.sandbox)

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        tests = self._test_cases(columns, len(completions))
        programs = [extract_code(completion_text(completion)) for completion in completions]
        self._check_sandbox()
        jobs: list[_Job] = []
        for row, (program, cases) in enumerate(zip(programs, tests)):
            if program is None or cases is None:
                continue
            if cases.mode == "stdio":
                jobs.extend(_Job(row, "stdio", program, stdin.encode(), output) for stdin, output in cases.cases)
            else:
                jobs.extend(_assert_jobs(row, program, cases.cases))
        whole = next((job.statement for job in jobs if job.mode == "statement"), None)
        if whole is not None and not self._warned_whole:
            self._warned_whole = True
            warnings.warn(
                f"{self.__name__}: the assert test {whole!r:.120} does not split into a call and an expected value, "
                "so it runs whole in the sandbox, where a program set on it can fake its pass; write tests as "
                "`assert f(args) == expected` (the forms that split: grpo_lightning.rewards.sandbox.assert_tests).",
                stacklevel=2,
            )
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="code-execution") as pool:
            passed_by_job = list(pool.map(self._passed, jobs))
        passed = [0] * len(completions)
        for job, count in zip(jobs, passed_by_job):
            passed[job.row] += count
        return [
            None if cases is None else (0.0 if program is None else passed[row] / len(cases.cases))
            for row, (program, cases) in enumerate(zip(programs, tests))
        ]

    def _test_cases(self, columns: dict[str, Any], count: int) -> list[TestCases | None]:
        if self.column not in columns:
            raise ValueError(
                f"{self.__name__} needs the test-case column {self.column!r}, but the dataset's columns are "
                f"{sorted(columns)}; name the column with CodeExecutionReward(column=...)."
            )
        values = columns[self.column]
        if len(values) != count:
            raise ValueError(f"column {self.column!r} has {len(values)} values for {count} completions.")
        return [parse_test_cases(value, self.column, row) for row, value in enumerate(values)]

    def _check_sandbox(self) -> None:
        """Run ``print('ok')`` once: a sandbox that can run nothing would score every completion 0. The
        same run looks for a host file outside its directory, and warns where it finds one."""
        with self._check_lock:
            if self._checked:
                return
            with tempfile.NamedTemporaryFile(prefix="grpo-code-host-") as host_file:
                check = f"import os\nprint('ok')\nprint(os.path.exists({host_file.name!r}))\n"
                run = self.run("stdio", check, (), b"")
            lines = run.output.split()
            if run.status != 0 or lines[:1] != [b"ok"]:
                seccomp = run.status == code_sandbox.SECCOMP_FAILED
                failed = " (its seccomp filter could not be loaded)" if seccomp else ""
                raise RuntimeError(
                    f"{self.__name__}: the sandbox ({self.backend}) could not run print('ok') (exit status "
                    f"{run.status}{failed}, output {run.output[:200]!r}); raise memory_mb={self.memory_mb} or "
                    f"timeout_s={self.timeout_s}, and check that {sys.executable} -I -S runs on this machine."
                )
            if lines[1:] != [b"False"]:
                warnings.warn(
                    f"{self.__name__}: the sandbox ({self.backend}) shows the host's files to a program here (which "
                    "paths exist, and their sizes, through os.stat) and caps its disk use only by polling, as this "
                    "machine refuses user namespaces; allow them (sysctl user.max_user_namespaces, "
                    "kernel.unprivileged_userns_clone) or run the trainer in a container.",
                    stacklevel=3,
                )
            self._checked = True

    def run(self, mode: str, source: str, tests: tuple = (), stdin: bytes = b"") -> Run:
        """Run ``source`` in the sandbox: ``mode`` ``"stdio"`` once with ``stdin``, or ``"asserts"`` with
        ``tests`` (the split ones in one run, each other one in a run of its own; ``passed`` is their sum)."""
        if mode == "stdio":
            return self._execute({"mode": "stdio"}, source, stdin)
        runs = [(job, self._execute(*self._request(job))) for job in _assert_jobs(0, source, tests)]
        last = runs[-1][1] if runs else Run(0, b"")
        return Run(last.status, last.output, sum(_judge(job, run) for job, run in runs))

    def _passed(self, job: _Job) -> int:
        return _judge(job, self._execute(*self._request(job)))

    @staticmethod
    def _request(job: _Job) -> tuple[dict, str, bytes]:
        if job.mode == "calls":
            return {"mode": "calls", "calls": list(enumerate(_calls(job)))}, job.program, b""
        if job.mode == "statement":
            return {"mode": "statement", "statement": job.statement}, job.program, b""
        return {"mode": "stdio"}, job.program, job.stdin

    def _execute(self, request: dict, source: str, stdin: bytes) -> Run:
        """One run of ``source`` in a new temporary directory, removed afterwards."""
        nonce = secrets.token_hex(16)
        header = {
            **request,
            **({"nonce": nonce} if request["mode"] == "statement" else {}),
            "source": source,
            "memory_bytes": int(self.memory_mb * 2**20),
            "cpu_seconds": math.ceil(self.timeout_s) + 1,
            "file_bytes": int(self.file_size_mb * 2**20),
            "disk_bytes": self._disk_bytes,
            "seccomp": (sandbox_command.seccomp_filter() or b"").hex(),
        }
        encoded = json.dumps(header).encode()
        workdir = tempfile.mkdtemp(prefix="grpo-code-")
        try:
            with tempfile.TemporaryFile() as stdin_file:
                stdin_file.write(b"%0*d" % (code_sandbox.HEADER_DIGITS, len(encoded)) + encoded + stdin)
                stdin_file.seek(0)
                run = self._supervise(stdin_file, workdir)
        finally:
            _remove_tree(workdir)
        run.nonce = nonce
        return run

    @property
    def _disk_bytes(self) -> int:
        return int(self.disk_mb * 2**20)

    def _supervise(self, stdin_file: Any, workdir: str) -> Run:
        """Start the child, read its stdout until it ends, the deadline passes, the output cap is
        reached or its directory holds more than ``disk_mb``; then end its whole process group."""
        process = subprocess.Popen(
            sandbox_command.command(self.backend, workdir, self._disk_bytes),
            stdin=stdin_file,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env={},
            start_new_session=True,
        )
        deadline = time.monotonic() + self.timeout_s
        output, stopped, reading, next_poll = bytearray(), False, True, 0.0
        with process.stdout, selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while reading or process.poll() is None:  # a run may close its stdout and go on writing files
                now = time.monotonic()
                if now >= next_poll:
                    next_poll = now + DISK_POLL_S
                    if disk_use(workdir, self._disk_bytes) > self._disk_bytes:
                        stopped = True
                        break
                if now >= deadline:
                    stopped = True
                    break
                wait = min(deadline - now, DISK_POLL_S)
                if not reading:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(wait)
                    continue
                if not selector.select(wait):
                    continue
                chunk = os.read(process.stdout.fileno(), READ_CHUNK)
                if not chunk:
                    reading = False
                    continue
                output += chunk
                if len(output) > self.max_output_bytes:
                    stopped = True
                    break
            _kill_group(process.pid)  # before reaping, so the group id still names this group
            process.wait()
        return Run(None if stopped else process.returncode, bytes(output[: self.max_output_bytes]))


def _assert_jobs(row: int, program: str, statements: tuple) -> list[_Job]:
    """The split tests of a row in one run; each test that does not split in a run of its own."""
    split = [assert_tests.split(statement) for statement in statements]
    jobs = [_Job(row, "calls", program, split=tuple(parts for parts in split if parts is not None))]
    jobs = jobs if jobs[0].split else []
    jobs += [_Job(row, "statement", program, statement=s) for s, parts in zip(statements, split) if parts is None]
    return jobs


def _calls(job: _Job) -> list[str]:
    """The calls a ``calls`` job sends, in order: every part of every test."""
    return [part.call for parts in job.split for part in parts]


def _judge(job: _Job, run: Run) -> int:
    """How many of ``job``'s tests passed, judged here from what the run printed: at most one per test.
    A call reported more than once, or with anything but a plain value, fails."""
    if job.mode == "stdio":
        return int(run.status == 0 and same_output(run.output.decode("utf-8", "replace"), job.expected))
    if job.mode == "statement":
        return int(run.status == 0 and run.output == run.nonce.encode() + b"\n")
    reports: dict[int, list[Any]] = {}
    calls = _calls(job)
    for line in run.output.split(b"\n"):
        try:
            index, value = json.loads(line)
        except (ValueError, TypeError, RecursionError):
            continue  # a malformed line reports nothing
        if type(index) is int and 0 <= index < len(calls):  # no other key: ints chosen to collide are slow
            reports.setdefault(index, []).append(value)
    passed, index = 0, 0
    for parts in job.split:
        results = []
        for part in parts:
            values = reports.get(index, [])
            index += 1
            try:
                reported = len(values) == 1 and values[0] is not None
                results.append(reported and part.check(assert_tests.decode(values[0])))
            except assert_tests.Undecodable:
                results.append(False)
        passed += all(results)
    return passed


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _remove_tree(path: str) -> None:
    """Remove a run's directory, even where the program took away its own permissions."""
    with contextlib.suppress(OSError):
        os.chmod(path, stat.S_IRWXU)
    for root, directories, _ in os.walk(path):
        for name in directories:
            directory = os.path.join(root, name)
            if not os.path.islink(directory):  # a link may lead out of the directory
                with contextlib.suppress(OSError):
                    os.chmod(directory, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


code_execution_reward = CodeExecutionReward()
"""The default instance: test cases in the ``test_cases`` column, 5 s and 1 GiB a run."""
