"""The child side of :mod:`grpo_lightning.rewards.code_execution`: confine this process, then run one
untrusted program. Run as ``python -I -S -B -X utf8 code_sandbox.py`` (directly or under bubblewrap:
:mod:`~grpo_lightning.rewards.sandbox.command`) in an empty directory with an empty environment; it
imports nothing but the standard library.

Standard input starts with a header: ten ASCII digits giving the length of a JSON object
``{"mode", "source", "memory_bytes", "cpu_seconds", "file_bytes", "disk_bytes", "seccomp", ...}``. Modes:

* ``"stdio"``: the rest of standard input is the program's input; the caller compares its output
  with the expected one.
* ``"calls"`` (``"calls"``: ``[index, expression]`` pairs): the program's input and output are
  ``/dev/null``; after the program, each expression is evaluated in its namespace and written to the
  original standard output as the JSON line ``[index, value]``, the value encoded by :func:`encoder`
  (``null`` when it raised or is no plain value). The caller holds the expected values and compares.
* ``"statement"`` (``"statement"``, ``"nonce"``): after the program, one whole test statement; when
  it raises nothing, the nonce is written to the original standard output.

The program runs in this interpreter and can change anything here, this module's functions
included: what it writes is a claim the caller checks, never trusted. Only ``"statement"`` runs hold
something worth stealing (the test and its nonce).

Confinement, in order, each step kept only where the platform allows it:

1. new user, mount and network namespaces (no network interface but a loopback that is down), and a
   parent-death signal: the run ends with the process that started it;
2. a private root (:func:`private_root`), where the mount namespace is this process's own: a tmpfs
   holding only the readable paths of step 3 (bound, read-only where the kernel allows) and the run's
   directory, a tmpfs of ``disk_bytes``; the host's other paths do not exist (``os.stat`` learns
   nothing of them), and the run cannot hold more than ``disk_bytes`` of files;
3. Landlock (Linux 5.13+): writes only beneath the working directory, reads only of it, the Python
   installation and system libraries, no ``execve``, no TCP (Linux 6.7+), no signals to processes
   outside (Linux 6.12+);
4. the caller's seccomp filter (``"seccomp"``, compiled BPF), where it sends one: a run that cannot
   load it ends with ``SECCOMP_FAILED`` before the program starts;
5. rlimits: address space, CPU seconds, file size, no core files, one process (``RLIMIT_NPROC``;
   the kernel does not apply it to root);
6. an audit hook (:func:`sys.addaudithook`, which cannot be removed) that refuses sockets, ``fork``,
   ``exec``, ``system``, ``subprocess``, ``kill``, ``ctypes``, raising the rlimits and walking the
   heap, and opens or file changes outside the allowed directories.

The audit hook runs in the same interpreter as the program and does not reach subinterpreters: it
stops the obvious only. Steps 1-5 are the kernel's: they hold whatever the program does.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys

HEADER_DIGITS = 10
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
# The mount flags a bind inherits and a remount must keep (statvfs's ST_* bits have the same values
# as MS_*, except relatime): nosuid, nodev, noexec, noatime, nodiratime.
LOCKED_MOUNT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048
ST_RELATIME, MS_RELATIME = 4096, 1 << 21
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}  # pivot_root(2)
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
SECCOMP_FAILED = 125  # exit status of a run whose seccomp filter could not be loaded
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # every architecture
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
# Landlock's filesystem rights: execute, write, read file, read dir, 9 that change a directory (bits 4-12),
# then one per ABI: refer (2), truncate (3), device ioctl (5).
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_ALL_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}  # ABI 5+: 1 << 16
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (1 << 14) | (1 << 15)  # rights a file rule may hold
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
READABLE_SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache", "/etc/localtime")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")

REFUSED_EVENTS = {
    "os.fork", "os.forkpty", "os.system", "os.kill", "os.killpg", "os.posix_spawn", "os.posix_spawnp",
    "os.startfile", "subprocess.Popen", "pty.spawn", "resource.setrlimit", "resource.prlimit",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "signal.pthread_kill",
}  # fmt: skip
REFUSED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.spawn")
REFUSED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess"}
# Events that change a file, with the positions of their path arguments.
WRITE_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
    "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "os.chflags": (0,), "os.lchflags": (0,),
}  # fmt: skip
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def read_exactly(fd: int, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = os.read(fd, count - len(data))
        if not chunk:
            raise EOFError("standard input ended inside the header")
        data += chunk
    return data


def readable_roots(workdir: str) -> list[str]:
    """Where the program may read: its directory, the Python installation and the system libraries."""
    roots = [workdir, sys.base_prefix, sys.base_exec_prefix, *sys.path, *READABLE_SYSTEM_PATHS, *DEVICES]
    return [os.path.realpath(root) for root in dict.fromkeys(roots) if root and os.path.exists(root)]


def confine(workdir: str, header: dict) -> None:
    """Steps 1-6 of the module's docstring."""
    try:  # steps 1-3 are Linux's; elsewhere, or where they are not allowed, they are left out
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        own_mounts = new_namespaces(ctypes, libc)
        libc.prctl(ctypes.c_int(PR_SET_PDEATHSIG), *(ctypes.c_ulong(value) for value in (signal.SIGKILL, 0, 0, 0)))
        libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), *(ctypes.c_ulong(value) for value in (1, 0, 0, 0)))
        if own_mounts:
            private_root(ctypes, libc, workdir, header["disk_bytes"])
        landlock(ctypes, libc, workdir)
        del libc
    except (ImportError, AttributeError, OSError):
        pass
    if header.get("seccomp"):
        seccomp(bytes.fromhex(header["seccomp"]))
    for name in [name for name in sys.modules if name.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]
    import resource

    for limit, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, header["file_bytes"]),
        (resource.RLIMIT_CPU, header["cpu_seconds"]),
        (resource.RLIMIT_NPROC, 1),
        (resource.RLIMIT_AS, header["memory_bytes"]),
    ):
        resource.setrlimit(limit, (value, value))
    sys.addaudithook(audit_hook(workdir, readable_roots(workdir)))


def new_namespaces(ctypes, libc) -> bool:
    """Step 1: new user, mount and network namespaces, this process's ids mapped to themselves (a
    tmpfs of the new namespace refuses files of unmapped ids); ``True`` when the mount namespace is
    new. Where user namespaces are refused: a new network namespace alone, which root may still make."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(ctypes.c_int(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET)) != 0:
        libc.unshare(ctypes.c_int(CLONE_NEWUSER | CLONE_NEWNET))
        return False
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
    except OSError:
        return False
    return True


def root_entries(workdir: str) -> tuple[list[tuple[str, str]], list[str]]:
    """What the private root holds besides the run's directory: ``(links, binds)``, the symbolic links
    among the readable paths (``/lib -> usr/lib``) and the directories and files to bind, none beneath
    another (a mount point made inside a bound host directory would be made on the host)."""
    links, paths = [], []
    for path in dict.fromkeys([sys.base_prefix, sys.base_exec_prefix, *sys.path, *READABLE_SYSTEM_PATHS]):
        if not path or not os.path.exists(path):
            continue
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        paths.append(os.path.realpath(path))

    def beneath(path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip(os.sep) + os.sep)

    binds: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(beneath(path, bound) for bound in binds):
            binds.append(path)
    links = [(link, target) for link, target in links if not any(beneath(link, bound) for bound in binds)]
    return links, binds


def private_root(ctypes, libc, workdir: str, disk_bytes: int) -> None:
    """Step 2: build the private root on a tmpfs mounted over the (empty) run's directory, then make
    it this process's root (``pivot_root``) and let go of the host's. Where a mount fails before the
    switch, the host's root stays (the caller's poll of the run's directory caps its disk use then);
    a failure after it ends the run (``RuntimeError``), as half a switch shows neither root whole."""
    links, binds = root_entries(workdir)
    pivot = PIVOT_ROOT.get(os.uname().machine)
    if pivot is None or any(workdir == path or workdir.startswith(path.rstrip(os.sep) + os.sep) for path in binds):
        return

    def mount(source, target, kind, flags: int, data=None) -> None:
        arguments = [None if value is None else os.fsencode(value) for value in (source, target, kind)]
        data = None if data is None else data.encode()
        if libc.mount(*arguments, ctypes.c_ulong(flags), data) != 0:
            raise OSError(ctypes.get_errno(), f"mount on {target} failed")

    new_root = workdir
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
        for link, target in links:
            os.makedirs(os.path.dirname(new_root + link), exist_ok=True)
            os.symlink(target, new_root + link)
        for path in [*binds, *(device for device in DEVICES if os.path.exists(device))]:
            inside = new_root + path
            if os.path.isdir(path):
                os.makedirs(inside, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(inside), exist_ok=True)
                os.close(os.open(inside, os.O_CREAT | os.O_WRONLY, 0o644))
            mount(path, inside, None, MS_BIND | MS_REC)
            if path not in DEVICES:
                try:
                    mount(None, inside, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(path))
                except OSError:
                    pass  # read-only is Landlock's and the audit hook's job too
        os.makedirs(new_root + workdir, mode=0o700)
        mount("tmpfs", new_root + workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_bytes},mode=0700")
        os.chdir(new_root)
        if libc.syscall(ctypes.c_long(pivot), b".", b".") != 0:
            raise OSError(ctypes.get_errno(), "pivot_root failed")
    except OSError:
        libc.umount2(os.fsencode(workdir), ctypes.c_int(MNT_DETACH))
        os.chdir(workdir)
        return
    try:
        if libc.umount2(b".", ctypes.c_int(MNT_DETACH)) != 0:
            raise OSError(ctypes.get_errno(), "detaching the host's root failed")
        os.chdir("/")
        mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.chdir(workdir)
    except OSError as error:
        raise RuntimeError(f"the code sandbox's private root is half made: {error}") from None


def _kept_flags(path: str) -> int:
    """The flags of ``path``'s mount that a read-only remount of its bind must keep."""
    flags = os.statvfs(path).f_flag
    return (flags & LOCKED_MOUNT_FLAGS) | (MS_RELATIME if flags & ST_RELATIME else 0)


def landlock(ctypes, libc, workdir: str) -> None:
    """Landlock's ruleset (step 3), at the highest ABI the kernel has; nothing where it has none."""

    def call(number: int, *arguments) -> int:
        return libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in (number, *arguments)))

    abi = call(LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return
    handled_fs = FS_ALL_BY_ABI.get(abi, (1 << 16) - 1)
    fields = [handled_fs] + ([NET_BIND_TCP | NET_CONNECT_TCP] if abi >= 4 else [])
    fields += [SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL] if abi >= 6 else []
    attributes = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = call(LANDLOCK_CREATE_RULESET, ctypes.byref(attributes), ctypes.sizeof(attributes), 0)
    if ruleset < 0:
        return

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))

    writable = handled_fs & ~FS_EXECUTE
    rules = [(workdir, writable), ("/dev/null", FS_READ_FILE | FS_WRITE_FILE)]
    rules += [(root, FS_READ_FILE | FS_READ_DIR) for root in readable_roots(workdir) if root != workdir]
    try:
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    rights &= FILE_RIGHTS
                rule = PathBeneath(rights & handled_fs, fd)
                call(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0)
            finally:
                os.close(fd)
        call(LANDLOCK_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)


def seccomp(program: bytes) -> None:
    """Step 4: load the caller's seccomp filter (compiled BPF); a run that cannot load it ends here,
    with ``SECCOMP_FAILED``, before any of the program runs."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        buffer = ctypes.create_string_buffer(program, len(program))

        class Program(ctypes.Structure):  # struct sock_fprog
            _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

        fprog = Program(len(program) // 8, ctypes.addressof(buffer))
        arguments = (SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)
        if libc.prctl(ctypes.c_int(PR_SET_SECCOMP), *(ctypes.c_ulong(value) for value in arguments)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    except (ImportError, AttributeError, OSError):
        os._exit(SECCOMP_FAILED)


def audit_hook(workdir: str, readable: list[str]):
    """Step 6: a hook that raises ``PermissionError`` for refused events."""
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
    # Copies: the program can reach this module's globals (it is ``__main__``), not these.
    refused, imports, write_events = frozenset(REFUSED_EVENTS), frozenset(REFUSED_IMPORTS), dict(WRITE_EVENTS)
    prefixes, write_flags = REFUSED_PREFIXES, WRITE_FLAGS
    writable, readable = (workdir,), tuple(readable)

    def inside(path, roots: tuple[str, ...]) -> bool:
        if isinstance(path, int):  # an open file descriptor
            return True
        resolved = realpath(fsdecode(path))
        return any(resolved == root or resolved.startswith(root.rstrip(sep) + sep) for root in roots)

    def hook(event: str, arguments: tuple) -> None:
        if event in refused or event.startswith(prefixes):
            raise PermissionError(f"{event} is not allowed in the code sandbox")
        if event == "import" and arguments[0] in imports:
            raise PermissionError(f"importing {arguments[0]} is not allowed in the code sandbox")
        if event == "open" and arguments[0] is not None:
            path, mode, flags = arguments
            writes = (isinstance(flags, int) and bool(flags & write_flags)) or (
                isinstance(mode, str) and any(c in mode for c in "wax+")
            )
            if not inside(path, writable if writes else readable):
                raise PermissionError(f"opening {path!r} is not allowed in the code sandbox")
        elif event in write_events:
            for position in write_events[event]:
                if position < len(arguments) and not inside(arguments[position], writable):
                    raise PermissionError(f"{event} on {arguments[position]!r} is not allowed in the code sandbox")

    return hook


def encoder():
    """``encode(value)``: ``value`` as tagged JSON-ready lists (read by
    :func:`grpo_lightning.rewards.sandbox.assert_tests.decode`), for the builtin types only, subclasses and
    other objects refused: their comparisons could lie, and comparing is the caller's job."""
    exact, text, represent, containers = type, str, repr, (list, tuple, set, frozenset)

    def encode(value, depth=0):
        if depth > 64:
            raise ValueError("nested too deeply")
        kind = exact(value)
        if value is None:
            return ["none"]
        if kind is bool or kind is str:
            return [kind.__name__, value]
        if kind is int:
            return ["int", text(value)]
        if kind is float or kind is complex:
            return [kind.__name__, represent(value)]
        if kind is bytes:
            return ["bytes", value.hex()]
        if kind in containers:
            return [kind.__name__, [encode(item, depth + 1) for item in value]]
        if kind is dict:
            return ["dict", [["tuple", [encode(k, depth + 2), encode(v, depth + 2)]] for k, v in value.items()]]
        raise TypeError(f"{kind.__name__} is not a plain value")

    return encode


def main() -> None:
    header = json.loads(read_exactly(0, int(read_exactly(0, HEADER_DIGITS))))
    workdir = os.path.realpath(os.getcwd())
    # The program may replace any of these originals; it gains nothing by it (see the module docstring).
    run, evaluate, write, leave, dumps, encode = builtins.exec, builtins.eval, os.write, os._exit, json.dumps, encoder()
    sys.argv = ["solution.py"]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    mode, source = header["mode"], header.pop("source")
    if mode == "stdio":
        confine(workdir, header)
        run(compile(source, "solution.py", "exec"), namespace)
        return
    if mode == "calls":
        calls = [(index, compile(call, f"<test {index}>", "eval")) for index, call in header["calls"]]
    else:
        statement, nonce = compile(header["statement"], "<test>", "exec"), header.pop("nonce").encode()
    results = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    confine(workdir, header)
    del header
    try:
        run(compile(source, "solution.py", "exec"), namespace)
    except SystemExit:
        pass  # a program that ends itself is still tested on what it defined
    except BaseException:  # noqa: BLE001 - a program that fails passes no test
        leave(1)
    if mode == "statement":
        try:
            run(statement, namespace)
        except BaseException:  # noqa: BLE001 - a test that raises anything fails
            leave(1)
        write(results, nonce + b"\n")
        leave(0)
    for index, call in calls:
        try:
            line = dumps([index, encode(evaluate(call, namespace))])
        except BaseException:  # noqa: BLE001 - a call that raises, or returns no plain value, fails
            line = dumps([index, None])
        write(results, line.encode() + b"\n")
    leave(0)


if __name__ == "__main__":
    main()
