"""The command line that runs :mod:`grpo_lightning.rewards.sandbox.code_sandbox`, and the seccomp filter it loads.

Two backends:

* ``bubblewrap``: the interpreter runs under ``bwrap`` (Debian/Ubuntu package ``bubblewrap``) in a
  fresh root holding only the interpreter and its libraries (read-only) and the run's directory (a
  tmpfs of the run's disk cap, where this ``bwrap`` sizes one: ``--size``, bubblewrap 0.8+), with
  every namespace unshared (user, PID, network, IPC, UTS, cgroup), an unprivileged uid and gid
  (65534), no ``/proc``, no further user namespaces, and ``--die-with-parent``: the sandbox's PID 1
  takes every process of the run with it, whatever they do (``setsid``, double fork).
* ``python``: the interpreter runs directly, confined from inside by the layers of
  :mod:`~grpo_lightning.rewards.sandbox.code_sandbox` alone (the fallback where bubblewrap is missing or
  cannot start, e.g. user namespaces turned off), its own private root among them where user
  namespaces are allowed.

Both load the seccomp filter built here (libseccomp, through ``pyseccomp``): no process creation,
``execve``, sockets, namespaces, mounts, ``ptrace``, signals to other processes, io_uring, BPF or
kernel keyrings. ``auto`` picks bubblewrap when a probe run of it works, once per process, and warns
once when it falls back.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import warnings

from grpo_lightning.rewards.sandbox import code_sandbox

BACKENDS = ("auto", "bubblewrap", "python")
INTERPRETER_FLAGS = ("-I", "-S", "-B", "-X", "utf8")
SANDBOX_UID = 65534  # "nobody"
SCRIPT_INSIDE = "/sandbox/code_sandbox.py"
SYSTEM_LIBRARIES = (
    "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/local/lib", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache",
)  # fmt: skip
PROBE_TIMEOUT_S = 30.0
PROBE_DISK_BYTES = 1 << 20
CLONE_THREAD = 0x00010000
DENIED_SYSCALLS = (
    "fork", "vfork", "execve", "execveat", "socket", "unshare", "setns", "mount", "umount2", "pivot_root",
    "chroot", "ptrace", "process_vm_readv", "process_vm_writev", "kill", "tkill", "tgkill", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "name_to_handle_at",
    "open_by_handle_at", "mknod", "mknodat", "fanotify_init", "open_tree", "move_mount", "fsopen", "fsmount",
    "fspick", "mount_setattr", "swapon", "swapoff", "reboot", "acct", "syslog", "quotactl", "setpriority",
)  # fmt: skip


class SandboxUnavailable(RuntimeError):
    """``sandbox="bubblewrap"`` was asked for where bubblewrap cannot run."""


def command(backend: str, workdir: str, disk_bytes: int) -> list[str]:
    """The argv of one run in ``workdir`` under ``backend`` (``bubblewrap`` or ``python``), holding at
    most ``disk_bytes`` of files (the ``python`` backend learns it from the run's header)."""
    if backend == "python":
        return [sys.executable, *INTERPRETER_FLAGS, code_sandbox.__file__]
    interpreter = _interpreter()
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--clearenv"]  # fmt: skip
    for path in _readable_paths(interpreter):
        if os.path.islink(path) and os.path.dirname(path) == "/":  # /lib -> usr/lib on merged-/usr systems
            argv += ["--symlink", os.readlink(path), path]
        else:
            argv += ["--ro-bind", path, path]
    for device in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"):
        argv += ["--dev-bind", device, device]
    argv += ["--ro-bind", code_sandbox.__file__, SCRIPT_INSIDE, *_run_directory(workdir, disk_bytes)]
    argv += ["--chdir", workdir]
    argv += ["--remount-ro", "/", "--", interpreter, *INTERPRETER_FLAGS, SCRIPT_INSIDE]
    return argv


def _run_directory(workdir: str, disk_bytes: int) -> list[str]:
    """The run's directory inside: a tmpfs of ``disk_bytes``, whose files the kernel caps; where this
    ``bwrap`` cannot size one, the host's directory, bound (the caller's poll caps it then)."""
    if bubblewrap_sizes_tmpfs():
        return ["--perms", "0700", "--size", str(disk_bytes), "--tmpfs", workdir]
    return ["--bind", workdir, workdir]


@functools.cache
def bubblewrap_sizes_tmpfs() -> bool:
    """Whether the installed ``bwrap`` takes ``--size`` before ``--tmpfs`` (bubblewrap 0.8+)."""
    try:
        usage = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--size" in usage.stdout


def _interpreter() -> str:
    """The real interpreter binary (not a virtual environment's link, whose pyvenv.cfg would be needed)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = os.path.join(sys.base_exec_prefix, "bin", version)
    return os.path.realpath(candidate if os.path.exists(candidate) else sys.executable)


def _readable_paths(interpreter: str) -> list[str]:
    """What the interpreter needs: itself, its standard library and shared libraries, the system's."""
    paths = [interpreter]
    for prefix in dict.fromkeys((sys.base_prefix, sys.base_exec_prefix)):
        library = os.path.join(prefix, "lib")
        if prefix not in ("/usr", "/") and os.path.isdir(library):
            paths.append(os.path.realpath(library))
    paths += [path for path in SYSTEM_LIBRARIES if os.path.lexists(path)]
    return list(dict.fromkeys(paths))


@functools.cache
def seccomp_filter() -> bytes | None:
    """The compiled filter (BPF) that every run loads; ``None`` where libseccomp is not available."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError, OSError):  # no pyseccomp, or no libseccomp.so
        warnings.warn(
            "code execution runs without a seccomp filter: libseccomp or its Python bindings are missing; "
            "install the system package libseccomp2 and `pip install pyseccomp`.",
            stacklevel=4,
        )
        return None
    import errno
    import tempfile

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    denied = seccomp.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(denied, name)
        except (OSError, ValueError, RuntimeError):
            continue  # a call this architecture does not have
    rules.add_rule(denied, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, 0))  # a process, not a thread
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags are out of reach: libc falls back to clone
    rules.add_rule(denied, "prlimit64", seccomp.Arg(0, seccomp.NE, 0))  # another process's limits
    with tempfile.TemporaryFile() as file:
        rules.export_bpf(file)
        file.seek(0)
        return file.read()


@functools.cache
def resolve(requested: str) -> str:
    """The backend runs use: ``requested``, or for ``auto`` bubblewrap where a probe run of it works.
    Warns once per process when ``auto`` falls back, or when runs get no seccomp filter."""
    if requested not in BACKENDS:
        raise ValueError(f"CodeExecutionReward sandbox={requested!r} must be one of {', '.join(BACKENDS)}.")
    seccomp_filter()  # its warning, if any, before the first run
    if requested == "python":
        return "python"
    problem = bubblewrap_problem()
    if problem is None:
        if not bubblewrap_sizes_tmpfs():
            warnings.warn(
                "this bwrap cannot size a tmpfs (`--size`, bubblewrap 0.8+): a code run's disk use is capped by "
                "polling its directory, which it may overshoot by what it writes between two polls; upgrade "
                "bubblewrap for the kernel's cap.",
                stacklevel=3,
            )
        return "bubblewrap"
    if requested == "bubblewrap":
        raise SandboxUnavailable(f"CodeExecutionReward sandbox='bubblewrap': {problem}")
    warnings.warn(
        f"code execution runs without bubblewrap ({problem}), confined by the interpreter's own layers only; "
        "install the package `bubblewrap` (apt-get install bubblewrap) for the stronger sandbox.",
        stacklevel=3,
    )
    return "python"


@functools.cache
def bubblewrap_problem() -> str | None:
    """Why bubblewrap cannot run here (not installed, or user namespaces refused to it), ``None``
    when a probe run prints ``ok``."""
    if shutil.which("bwrap") is None:
        return "no `bwrap` on PATH"
    import tempfile

    workdir = tempfile.mkdtemp(prefix="grpo-code-probe-")
    try:
        argv = command("bubblewrap", workdir, PROBE_DISK_BYTES)
        probe = [*argv[: argv.index("--") + 2], "-I", "-S", "-c", "print('ok')"]
        result = subprocess.run(probe, capture_output=True, timeout=PROBE_TIMEOUT_S, env={}, cwd=workdir)
    except (OSError, subprocess.SubprocessError) as error:
        return f"`bwrap` did not start: {error}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if result.returncode != 0 or result.stdout.strip() != b"ok":
        detail = result.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"`bwrap` failed (exit status {result.returncode}: {detail[-1] if detail else 'no message'})"
    return None
