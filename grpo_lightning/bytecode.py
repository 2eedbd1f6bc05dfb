"""A bytecode cache for processes that were told not to write one.

Container images often set ``PYTHONDONTWRITEBYTECODE=1``; where they also ship torch without its
``.pyc`` files, every new process compiles torch, Lightning and transformers from source. On the
GPU image this project is measured on (it sets the variable; torch there has no ``.pyc``),
``import lightning`` took 14-23 s that way, and 7.2-9.4 s once Python could cache the bytecode in a
folder of its own (``PYTHONPYCACHEPREFIX``, the mechanism used here): a fit, a ``validate``, every
sweep's server and every debugging run paid the difference.

So when Python may not write bytecode, no ``PYTHONPYCACHEPREFIX`` is set and torch has no bytecode
beside its sources, the console entry points point Python's cache at a folder of the project's cache
(``$GRPO_LIGHTNING_CACHE/pycache``, else ``~/.cache/grpo_lightning/pycache``) and lets it write
there: the sources' folders stay untouched, as the setting intends. The first process fills it.
Such an image simulated on a 2-core CPU (no bytecode to read): importing the CLI took 19-22 s in
every process; with this cache 22 s once, then 7.9-8.5 s (9-10 s from pip's own bytecode). Where
torch has its bytecode, or the folder cannot be written, nothing changes. Each entry point (the
console scripts, ``python -m grpo_lightning.cli`` and a sweep's cell server) calls
:func:`use_own_bytecode_cache` first, before torch is imported; importing the package changes no
interpreter setting. The helper processes the package starts itself with Python (math-verify's) are
given the same folder (:func:`child_environment`).
"""

from __future__ import annotations

import importlib.util
import os
import sys


_own_folder: str | None = None
"""The folder :func:`use_own_bytecode_cache` chose in this process, if it did."""


def cache_folder() -> str:
    """Where the bytecode goes: ``pycache`` in the project's cache (:func:`~grpo_lightning.runtime.cache.cache_dir`,
    whose module imports neither torch nor transformers)."""
    from grpo_lightning.runtime.cache import cache_dir

    return str(cache_dir() / "pycache")


def torch_has_bytecode() -> bool:
    """Whether torch's ``__init__`` has its bytecode beside it (as pip writes it); ``True`` without
    torch (nothing to gain)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return True
    return os.path.exists(importlib.util.cache_from_source(spec.origin))


def use_own_bytecode_cache() -> str | None:
    """Point ``sys.pycache_prefix`` at :func:`cache_folder` and allow writing, where Python was
    told not to write bytecode, has no prefix and finds no bytecode of torch's; the folder, or
    ``None`` where nothing changed."""
    if not sys.dont_write_bytecode or sys.pycache_prefix is not None or torch_has_bytecode():
        return None
    folder = cache_folder()
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return None
    if not os.access(folder, os.W_OK):
        return None
    global _own_folder
    sys.pycache_prefix = _own_folder = folder
    sys.dont_write_bytecode = False
    return folder


def child_environment() -> dict[str, str]:
    """``os.environ`` for a Python process this one starts, with this process's own bytecode cache where
    :func:`use_own_bytecode_cache` set one: a child that does not import the package first would
    otherwise compile all it imports from source, each time. math-verify's child did: its sympy took
    2.4 s a process that way on the 2-core CPU, 0.43 s from this cache."""
    environment = dict(os.environ)
    if _own_folder is not None and sys.pycache_prefix == _own_folder:
        environment["PYTHONPYCACHEPREFIX"] = _own_folder
        environment.pop("PYTHONDONTWRITEBYTECODE", None)
    return environment
