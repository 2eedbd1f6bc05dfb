"""Attacks on the code-execution reward, as a policy under RL pressure would find them: each one is
contained (no process left behind, no file written outside the run's directory, no connection made)
and scores 0, under each backend.

The task of every reward hack below is ``square(n)``; its tests split into calls and expected values
(``assert square(3) == 9``), which the program never sees. Every test runs real programs in the real
sandbox (no mocks).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from grpo_lightning.rewards import CodeExecutionReward
from grpo_lightning.rewards.sandbox import command as sandbox_command

TIMEOUT_S = 2.0
DISK_MB = 8
SQUARE_TESTS = ["assert square(3) == 9", "assert square(4) == 16", "assert square(-2) == 4"]


@pytest.fixture(scope="module")
def reward(sandbox_backend) -> CodeExecutionReward:
    return CodeExecutionReward(timeout_s=TIMEOUT_S, memory_mb=256, workers=2, sandbox=sandbox_backend)


def score(reward: CodeExecutionReward, source: str, tests) -> float:
    completion = f"```python\n{textwrap.dedent(source)}```"
    return reward(["prompt"], [completion], test_cases=[tests])[0]


def stdio(expected: str) -> list[dict]:
    return [{"input": "", "output": expected}]


def unhooked(attack: str) -> str:
    """A program that runs ``attack`` in a subinterpreter, out of the audit hook's reach (where
    this Python has none, in the program itself): what stops it must be the kernel's."""
    return textwrap.dedent(f"""
    try:
        import _xxsubinterpreters as interpreters
    except ImportError:
        try:
            import _interpreters as interpreters
        except ImportError:
            interpreters = None
    attack = {textwrap.dedent(attack)!r}
    if interpreters is None:
        exec(attack, {{}})
    else:
        interpreters.run_string(interpreters.create(), attack)
    """)


# ---------------------------------------------------------------- reward hacks: forged passes

FORGE = """
import os, sys

def forge(frame):
    # Write a pass for every test the harness could hold: to each descriptor of the harness's frames,
    # with its nonce, in the value format, 100 times over.
    while frame is not None:
        names = frame.f_locals
        nonce = names.get("nonce", b"")
        for value in list(names.values()):
            if type(value) is int and 0 <= value < 1024:
                lines = b"".join(b'[%d, ["int", "%d"]]\\n' % (i, guess) for i in range(100) for guess in (9, 16, 4))
                lines += b"".join(b"%s %d\\n" % (nonce if isinstance(nonce, bytes) else b"", i) for i in range(100))
                try:
                    os.write(value, lines)
                except OSError:
                    pass
            if isinstance(value, list):  # the harness's tests, replaced in place by ones that pass
                try:
                    value[:] = [(i, compile("True", "t", "eval")) for i in range(len(value))]
                except Exception:
                    pass
        frame = frame.f_back
"""

FRAME_HACKS = {
    "sys._getframe": FORGE + "forge(sys._getframe(1))\ndef square(n):\n    forge(sys._getframe(1))\n",
    "f_locals of the caller": FORGE + "def square(n):\n    sys._getframe(1).f_locals.clear()\n    return None\n",
    "tb_frame.f_back": FORGE + """
def square(n):
    try:
        raise RuntimeError
    except RuntimeError as error:
        forge(error.__traceback__.tb_frame.f_back)
""",
    "inspect.stack": FORGE + """
import inspect
def square(n):
    for info in inspect.stack():
        forge(info.frame)
""",
    "results fd guessed": """
import os
for fd in range(3, 64):
    for i in range(3):
        try:
            os.write(fd, b'[%d, ["int", "9"]]\\n[%d, ["int", "16"]]\\n[%d, ["int", "4"]]\\n' % (i, i, i))
        except OSError:
            pass
def square(n):
    return None
""",
}


@pytest.mark.parametrize("source", FRAME_HACKS.values(), ids=FRAME_HACKS.keys())
def test_forging_passes_through_the_harness_scores_zero(reward, source):
    assert score(reward, source, SQUARE_TESTS) == 0.0


def test_the_pass_count_cannot_exceed_the_number_of_tests(reward):
    correct_and_forging = FORGE + "def square(n):\n    forge(sys._getframe(1))\n    return n * n\n"
    assert score(reward, correct_and_forging, SQUARE_TESTS) <= 1.0
    assert score(reward, "def square(n):\n    return n * n\n", SQUARE_TESTS) == 1.0


def test_expected_values_never_reach_the_program(reward):
    """A program that searches everything it can reach for the expected value, and returns it."""
    seeker = """
    import sys, gc

    def strings(value, seen, depth=0):
        if id(value) in seen or depth > 6:
            return
        seen.add(id(value))
        if isinstance(value, str):
            yield value
        elif isinstance(value, bytes):
            yield value.decode("latin-1")
        elif isinstance(value, dict):
            for item in list(value.items()):
                yield from strings(item, seen, depth + 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in list(value):
                yield from strings(item, seen, depth + 1)
        elif hasattr(value, "co_consts"):
            yield from strings(value.co_consts, seen, depth + 1)

    def square(n):
        seen, frame = set(), sys._getframe(1)
        while frame is not None:
            for text in strings((frame.f_locals, frame.f_globals, frame.f_code), seen):
                if "EXPECTED-" in text and "EXPECTED-" + "SEARCH" not in text:
                    return text[text.index("EXPECTED-"):].split("'")[0].split('"')[0]
            frame = frame.f_back
        for module in list(sys.modules.values()):
            for text in strings(vars(module), seen):
                if text.startswith("EXPECTED-") and text != "EXPECTED-" + "SEARCH":
                    return text
        return None
    """
    assert score(reward, seeker, ["assert square(3) == 'EXPECTED-nine'"]) == 0.0


REWARD_HACKS = {
    "sys.exit at import": "import sys\nsys.exit(0)\ndef square(n):\n    return n * n\n",
    "os._exit at import": "import os\nos._exit(0)\n",
    "sys.exit in the call": "import sys\ndef square(n):\n    sys.exit(0)\n",
    "os._exit in the call": "import os\ndef square(n):\n    os._exit(0)\n",
    "atexit": FORGE + "import atexit\natexit.register(lambda: forge(sys._getframe()))\ndef square(n):\n    sys.exit(0)\n",
    "lying __eq__": """
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = object.__hash__
def square(n):
    return Anything()
""",
    "int subclass with a lying __eq__": """
class Liar(int):
    def __eq__(self, other): return True
    __hash__ = int.__hash__
def square(n):
    return Liar(0)
""",
    "list subclass": "class L(list):\n    def __eq__(self, other): return True\ndef square(n):\n    return L()\n",
    "monkeypatched builtins": """
import builtins, json, os
builtins.eval = lambda *a, **k: True
builtins.isinstance = lambda *a: True
builtins.type = lambda *a: int
builtins.repr = lambda *a: "9"
builtins.str = lambda *a: "9"
json.dumps = lambda value, *a, **k: '[%d, ["bool", true]]' % value[0]
original_write = os.write
os.write = lambda fd, data: original_write(fd, data.replace(b'["none"]', b'["bool", true]'))
def square(n):
    return None
""",
    "self-referential value": "def square(n):\n    value = []\n    value.append(value)\n    return value\n",
    "deeply nested value": "def square(n):\n    value = 9\n    for _ in range(10**5):\n        value = [value]\n"
    "    return value\n",
    "a flood of result lines": "import os\ndef square(n):\n    while True:\n        os.write(3, b'[0, [\"int\", \"9\"]]\\n' * 4096)\n",
    "threads that keep writing": """
import os, threading, time
def spam():
    while True:
        for fd in range(3, 16):
            try:
                os.write(fd, b'[0, ["int", "9"]]\\n[1, ["int", "16"]]\\n[2, ["int", "4"]]\\n')
            except OSError:
                pass
threading.Thread(target=spam, daemon=True).start()
def square(n):
    time.sleep(0.01)
""",
}


@pytest.mark.parametrize("source", REWARD_HACKS.values(), ids=REWARD_HACKS.keys())
def test_reward_hacks_score_zero(reward, source):
    assert score(reward, source, SQUARE_TESTS) == 0.0


# ---------------------------------------------------------------- escapes


@pytest.fixture
def outside():
    """A directory outside the sandbox, on a short path (Unix socket paths are short)."""
    directory = tempfile.mkdtemp(prefix="grpo-out-", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def escapes(target: str) -> dict[str, str]:
    """Programs that print ``escaped`` once they wrote ``target``, each a different way around the layers."""
    write = f"open({target!r}, 'w').write('x')"
    return {
        "open": f"{write}\nprint('escaped')\n",
        "symlink out of the run directory": f"import os\nos.symlink({target!r}, 'link')\nopen('link', 'w').write('x')\n"
        "print('escaped')\n",
        "subinterpreter": f"""
try:
    import _xxsubinterpreters as interpreters
except ImportError:
    import _interpreters as interpreters
interpreter = interpreters.create()
try:  # where the subinterpreter may fork (not 3.11's)
    interpreters.run_string(interpreter, "import os\\nif os.fork() == 0:\\n    {write}\\n    os._exit(0)\\n")
except Exception:
    pass
interpreters.run_string(interpreter, "{write}")
print('escaped')
""",
        "ctypes loaded under a dotted name": f"""
import glob, importlib.util, os, sys
path = glob.glob(os.path.join(sys.base_prefix, 'lib', 'python*', 'lib-dynload', '_ctypes*.so'))[0]
spec = importlib.util.spec_from_file_location('evil._ctypes', path)
_ctypes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_ctypes)
class c_int(_ctypes._SimpleCData):
    _type_ = 'i'
class Function(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL
    _restype_ = c_int
class Libc:
    _handle = _ctypes.dlopen(None, os.RTLD_NOW)
libc = Libc()
libc.kill = Function(('kill', libc))
libc.syscall = Function(('syscall', libc))
libc.kill(os.getppid(), 9)  # the trainer, outside bubblewrap
if libc.syscall(57) == 0:  # fork(2), past any wrapper
    {write}
    os._exit(0)
{write}
print('escaped')
""",
        "ctypes in a subinterpreter": f"""
try:
    import _xxsubinterpreters as interpreters
except ImportError:
    import _interpreters as interpreters
attack = (
    "import ctypes, os\\n"
    "libc = ctypes.CDLL(None)\\n"
    "libc.kill(os.getppid(), 9)\\n"  # the trainer, outside bubblewrap
    "if libc.syscall(57) == 0:\\n"  # fork(2), past any wrapper
    "    {write}\\n"
    "    os._exit(0)\\n"
    "{write}\\n"
)
interpreters.run_string(interpreters.create(), attack)
print('escaped')
""",
        "_posixsubprocess loaded under a dotted name": f"""
import glob, importlib.util, os, sys, types
path = glob.glob(os.path.join(sys.base_prefix, 'lib', 'python*', 'lib-dynload', '_posixsubprocess*.so'))[0]
spec = importlib.util.spec_from_file_location('evil._posixsubprocess', path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules['_posixsubprocess'] = module
import subprocess
subprocess.sys = types.SimpleNamespace(**{{**vars(sys), 'audit': lambda *a: None}})
subprocess.run([sys.executable, '-c', "{write}"], start_new_session=True)
print('escaped')
""",
    }


ESCAPES = list(escapes("TARGET"))


@pytest.mark.parametrize("name", ESCAPES)
def test_writing_outside_the_run_directory_fails_every_way(reward, outside, name):
    target = os.path.join(outside, "escaped")
    assert score(reward, escapes(target)[name], stdio("escaped")) == 0.0
    assert os.listdir(outside) == []


DOUBLE_FORK = """
import os
print(os.getcwd(), flush=True)
try:
    import ctypes
except ImportError as error:  # Pythons whose subinterpreters cannot load it
    print("no ctypes:", error, flush=True)
    raise
libc = ctypes.CDLL(None)
if libc.fork() == 0:
    libc.setsid()
    if libc.fork() == 0:
        hold = ctypes.create_string_buffer(64 << 20)
        libc.sleep(60)
    libc._exit(0)
libc.wait(None)
print("forked", flush=True)
libc.sleep(60)
"""


def test_no_process_outlives_its_run(reward):
    """A double-forked, ``setsid`` child holding memory, made through libc past the audit hook."""
    run = reward.run("stdio", unhooked(DOUBLE_FORK))
    assert run.status != 0
    assert not processes_in(run.output.split(b"\n")[0].decode())


@pytest.mark.skipif(sandbox_command.bubblewrap_problem() is not None, reason="bubblewrap cannot run here")
def test_bubblewrap_alone_ends_every_process_of_a_run(monkeypatch):
    """Without the seccomp filter (which refuses ``fork``), the PID namespace still takes every
    process of the run with it: double fork, ``setsid``, and past the deadline."""
    monkeypatch.setattr(sandbox_command, "seccomp_filter", lambda: None)
    unfiltered = CodeExecutionReward(timeout_s=1.0, memory_mb=256, sandbox="bubblewrap")
    run = unfiltered.run("stdio", unhooked(DOUBLE_FORK))
    cwd, forked = run.output.split(b"\n")[:2]
    if forked.startswith(b"no ctypes"):
        pytest.skip(f"the attack needs ctypes in a subinterpreter: {forked.decode()}")
    assert forked == b"forked"  # the attack ran: the grandchild existed
    assert not processes_in(cwd.decode())


def processes_in(directory: str, wait_s: float = 2.0) -> list[int]:
    """Processes whose working directory is ``directory`` (a run's), after giving the dying ``wait_s``."""
    name = os.path.basename(directory.rstrip("/"))
    assert name.startswith("grpo-code-"), directory
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if name in os.readlink(f"/proc/{pid}/cwd"):
                    found.append(int(pid))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_no_unix_socket_outside_is_reachable(reward, outside, sandbox_backend):
    if sandbox_backend == "python" and sandbox_command.seccomp_filter() is None:
        pytest.skip("the python backend closes unix sockets with its seccomp filter; no libseccomp bindings here")
    path = os.path.join(outside, "host.sock")
    abstract = f"\0grpo-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX) as listener, socket.socket(socket.AF_UNIX) as abstract_listener:
        listener.bind(path)
        listener.listen()
        abstract_listener.bind(abstract)
        abstract_listener.listen()
        source = unhooked(
            "import socket\n"
            f"for address in ({path!r}, {abstract!r}):\n"
            "    try:\n"
            "        client = socket.socket(socket.AF_UNIX)\n"
            "        client.connect(address)\n"
            "        client.sendall(b'hi')\n"
            "        print('connected', flush=True)\n"
            "    except OSError:\n"
            "        pass\n"
        )
        assert score(reward, source, stdio("connected\nconnected")) == 0.0
        for server in (listener, abstract_listener):
            server.settimeout(0.1)
            with pytest.raises(TimeoutError):
                server.accept()


HOST_FILES = (str(Path(__file__).resolve().parents[2] / "pyproject.toml"), "/etc/passwd")
STAT_HOST_FILES = f"""
import os
found = []
for path in {HOST_FILES!r}:
    for look in (os.stat, os.lstat, os.path.getsize, os.listdir):
        try:
            found.append((path, look(path if look is not os.listdir else os.path.dirname(path))))
        except OSError:
            pass
    if os.path.exists(path) or os.access(path, os.F_OK):
        found.append((path, "exists"))
print(found or "nothing", flush=True)
"""


def test_host_files_outside_the_run_directory_reveal_nothing(reward):
    """Not whether they exist, nor their sizes, nor their directories' entries; from a
    subinterpreter, out of the audit hook's reach."""
    assert all(os.path.exists(path) for path in HOST_FILES)
    run = reward.run("stdio", unhooked(STAT_HOST_FILES))
    assert run.output.strip() == b"nothing"


def test_no_tcp_connection_is_made(reward):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        source = unhooked(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n")
        source += "print('sent')\n"
        assert score(reward, source, stdio("sent")) == 0.0
        listener.settimeout(0.1)
        with pytest.raises(TimeoutError):
            listener.accept()


def test_proc_shows_nothing_of_the_trainer(reward):
    """The trainer's memory holds the expected values; its environment, command line and memory are
    out of reach, and so is every other process."""
    snoop = """
    import os
    found = []
    for path in (f"/proc/{os.getppid()}/environ", f"/proc/{os.getppid()}/cmdline", "/proc/1/environ",
                 "/proc/1/cmdline", f"/proc/{os.getppid()}/maps"):
        try:
            with open(path, "rb") as file:
                found.append(len(file.read(4096)) > 0)
        except OSError:
            pass
    try:
        found.append(len([p for p in os.listdir("/proc") if p.isdigit()]) > 3)
    except OSError:
        pass
    try:
        with open(f"/proc/{os.getppid()}/mem", "rb") as memory:
            memory.seek(0x400000)
            found.append(len(memory.read(16)) > 0)
    except (OSError, ValueError, OverflowError):
        pass
    print("found" if any(found) else "nothing", flush=True)
    """
    run = reward.run("stdio", unhooked(snoop))
    assert run.output.strip() == b"nothing"


# ---------------------------------------------------------------- resources


def test_a_fork_bomb_scores_zero_and_leaves_nothing(reward):
    bomb = """
    import os
    print(os.getcwd(), flush=True)
    while True:
        try:
            os.fork()
        except OSError:
            pass
    """
    run = reward.run("stdio", textwrap.dedent(bomb))
    assert run.status != 0
    assert not processes_in(run.output.split(b"\n")[0].decode())


@pytest.mark.skipif(sandbox_command.seccomp_filter() is None, reason="without the seccomp filter this is a real fork bomb")
def test_a_fork_bomb_past_the_audit_hook_is_refused_by_the_kernel(reward):
    bomb = """
    import ctypes, os
    print(os.getcwd(), flush=True)
    libc = ctypes.CDLL(None)
    for _ in range(10000):
        libc.syscall(57)  # fork(2)
    print("forked", flush=True)
    """
    run = reward.run("stdio", unhooked(bomb))
    assert run.output.split(b"\n")[1] == b"forked"  # every fork refused at once, none waited for
    assert not processes_in(run.output.split(b"\n")[0].decode())


@pytest.mark.parametrize(
    "source",
    [
        "data = bytearray(1 << 34)\nprint('allocated')\n",
        "import mmap\nm = mmap.mmap(-1, 1 << 34)\nm[-1] = 1\nprint('allocated')\n",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n",
    ],
    ids=["bytearray", "mmap", "grown"],
)
def test_a_memory_bomb_scores_zero(reward, source):
    start = time.monotonic()
    assert score(reward, source, stdio("allocated")) == 0.0
    assert time.monotonic() - start < TIMEOUT_S + 2.0


WRITE_MANY_FILES = """
import os
written = 0
try:
    for index in range(1000):  # 1 GiB in all, each file under file_size_mb
        with open(f"part{index}", "wb", buffering=0) as file:
            for _ in range(4):
                written += file.write(b"x" * (1 << 18))
                print(written, flush=True)
except OSError as error:
    print("refused:", error, flush=True)
"""


def bytes_written(run) -> int:
    """What the program last said it had written (it says so after each 256 KiB)."""
    return max((int(line) for line in run.output.split() if line.isdigit()), default=0)


def test_a_run_writing_many_files_is_stopped_at_its_disk_cap(sandbox_backend):
    capped = CodeExecutionReward(timeout_s=TIMEOUT_S, memory_mb=256, disk_mb=DISK_MB, sandbox=sandbox_backend)
    run = capped.run("stdio", WRITE_MANY_FILES)
    assert (DISK_MB - 1) << 20 <= bytes_written(run) <= DISK_MB << 20


NO_USER_NAMESPACES = """
import errno, os, sys
import pyseccomp as seccomp
rules = seccomp.SyscallFilter(seccomp.ALLOW)
rules.add_rule(seccomp.ERRNO(errno.EPERM), "unshare")
rules.load()
os.execv(sys.argv[1], sys.argv[1:])
"""


def without_user_namespaces(monkeypatch) -> CodeExecutionReward:
    """The ``python`` backend on a machine that refuses user namespaces, as this one does not: its runs
    start under a seccomp filter that refuses ``unshare`` (a stand-in for that machine)."""
    pytest.importorskip("pyseccomp")
    command = sandbox_command.command
    monkeypatch.setattr(
        sandbox_command, "command", lambda *args: [sys.executable, "-c", NO_USER_NAMESPACES, *command(*args)]
    )
    return CodeExecutionReward(timeout_s=TIMEOUT_S, memory_mb=256, disk_mb=DISK_MB, sandbox="python")


def bubblewrap_without_tmpfs_sizes(monkeypatch) -> CodeExecutionReward:
    """bubblewrap older than 0.8, which has no ``--size`` (a stand-in: the one here has it)."""
    if sandbox_command.bubblewrap_problem() is not None:
        pytest.skip("bubblewrap cannot run here")
    monkeypatch.setattr(sandbox_command, "bubblewrap_sizes_tmpfs", lambda: False)
    return CodeExecutionReward(timeout_s=TIMEOUT_S, memory_mb=256, disk_mb=DISK_MB, sandbox="bubblewrap")


@pytest.mark.parametrize("uncapped", [without_user_namespaces, bubblewrap_without_tmpfs_sizes],
                         ids=["python without user namespaces", "bubblewrap without --size"])  # fmt: skip
def test_without_the_kernels_cap_the_disk_cap_holds_by_polling(uncapped, monkeypatch):
    """The run's directory is the host's; the trainer's poll stops the run, past the cap by at most
    what it wrote between two polls."""
    run = uncapped(monkeypatch).run("stdio", WRITE_MANY_FILES)
    assert run.status is None  # stopped
    assert DISK_MB << 20 < bytes_written(run) <= (DISK_MB + 64) << 20


def test_without_user_namespaces_the_first_call_warns_that_host_files_show(monkeypatch):
    reward = without_user_namespaces(monkeypatch)
    with pytest.warns(UserWarning, match="shows the host's files to a program here .* allow them"):
        assert score(reward, "def square(n):\n    return n * n\n", SQUARE_TESTS) == 1.0
    run = reward.run("stdio", STAT_HOST_FILES)
    assert run.output.strip() != b"nothing"  # what the warning says


RESULTS_TO_COLLIDE = {  # ints k * (2**61 - 1) all hash to 0: each insert in a hash table compares with all before
    "indices": "DATA = b''.join(b'[%d, [\"int\", \"9\"]]\\n' % (k * (2**61 - 1)) for k in range(1, 30000))\n",
    "a set": "ITEMS = b','.join(b'[\"int\", \"%d\"]' % (k * (2**61 - 1)) for k in range(1, 30000))\n"
    "DATA = b'[0, [\"set\", [' + ITEMS + b']]]\\n'\n",
}
WRITER = """
import os
def square(n):
    for fd in range(3, 10):
        try:
            os.write(fd, DATA)
        except OSError:
            pass
    os._exit(0)
"""


@pytest.mark.parametrize("data", RESULTS_TO_COLLIDE.values(), ids=RESULTS_TO_COLLIDE.keys())
def test_results_built_to_collide_in_a_hash_table_do_not_stall_the_trainer(reward, data):
    """1 MiB of results whose keys all collide took the trainer 10-20 s to read."""
    start = time.monotonic()
    assert score(reward, data + WRITER, ["assert square(3) == {9}"]) == 0.0
    assert time.monotonic() - start < 3.0


def test_the_next_program_runs_as_before_after_every_attack(reward):
    assert score(reward, "def square(n):\n    return n * n\n", SQUARE_TESTS) == 1.0
