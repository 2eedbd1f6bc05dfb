"""A record of what this machine has compiled, so that ``"auto"`` knows a warm compile cache from a cold one.

Inductor and Triton keep what they compile in folders on disk, and nothing there says which model it was
compiled for. After a process has compiled and run a part (:data:`PARTS`) for a model, it writes a marker
in the project's cache (:func:`grpo_lightning.runtime.cache.cache_dir`), named by a hash of everything that
changes that part's compiled code (torch and Triton versions, the device, the model's shape and dtype, the
engine options that change its graphs) and of the compile-cache folders in effect. The marker lists the
folders the compiled code went into; it answers warm only while each of them is still the same folder
(inode) and is not empty, so a deleted or emptied cache reads cold.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: The parts of a run that compile: the static engine's decode step and prefill (Inductor), the
#: log-prob passes' model and log-softmax (Inductor), the static engine's own Triton kernels.
PARTS = ("decode", "logprobs", "kernels")

RECORD_FOLDER = "compiled"
"""The folder of the markers, inside the project's cache."""


@dataclass(frozen=True)
class CompiledShape:
    """What the compiled code of a model depends on, beyond the engine options and the software."""

    model_type: str | None
    num_layers: int | None
    hidden_size: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    dtype: str
    device: str
    """The device's name and compute capability."""

    @classmethod
    def of(cls, model: Any) -> CompiledShape:
        """The shape of a Hugging Face model (unwrapped from FSDP) on its CUDA device."""
        import torch

        config = getattr(model, "module", model).config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        parameter = next(getattr(model, "module", model).parameters())
        index = parameter.device.index if parameter.device.index is not None else torch.cuda.current_device()
        capability = torch.cuda.get_device_capability(index)
        heads = getattr(config, "num_attention_heads", None)
        hidden = getattr(config, "hidden_size", None)
        head_dim = getattr(config, "head_dim", None) or (hidden // heads if hidden and heads else None)
        return cls(
            model_type=getattr(config, "model_type", None),
            num_layers=getattr(config, "num_hidden_layers", None),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            vocab_size=getattr(config, "vocab_size", None),
            dtype=str(parameter.dtype),
            device=f"{torch.cuda.get_device_name(index)} sm{''.join(map(str, capability))}",
        )


def record_for(model: Any) -> CompileRecord | None:
    """The record of a model on a CUDA device (:meth:`CompileRecord.here`); ``None`` where its shape cannot be
    read (no parameters, no CUDA device), which estimates every part cold."""
    try:
        return CompileRecord.here(CompiledShape.of(model))
    except (StopIteration, RuntimeError, AssertionError, AttributeError):
        return None


def software() -> dict[str, str | None]:
    """The versions of the compilers: torch (Inductor) and Triton."""
    import torch

    try:
        from importlib.metadata import version

        triton = version("triton")
    except Exception:  # noqa: BLE001 - not installed, or installed under another distribution name
        triton = None
    return {"torch": torch.__version__, "triton": triton}


def inductor_cache_folder() -> Path:
    """Inductor's cache: ``$TORCHINDUCTOR_CACHE_DIR``, else its default (read without creating it, which
    Inductor's own ``cache_dir()`` does)."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if folder:
        return Path(folder).absolute()
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def triton_cache_folder() -> Path:
    """Where Triton writes what it compiles now: ``$TRITON_CACHE_DIR`` (which Inductor sets once it has
    compiled, to a folder inside its own cache), else Triton's default."""
    folder = os.environ.get("TRITON_CACHE_DIR")
    if folder:
        return Path(folder).absolute()
    home = os.environ.get("TRITON_HOME") or Path.home()
    return Path(home) / ".triton" / "cache"


def configured_folders() -> dict[str, str | None]:
    """The compile-cache folders as configured before anything compiles: part of each marker's name."""
    return {"inductor": str(inductor_cache_folder()), "triton": os.environ.get("TRITON_CACHE_DIR")}


def _folders_in_effect(part: str) -> list[Path]:
    """The folders ``part``'s compiled code is in: Inductor's graphs with their Triton kernels, or Triton's."""
    return [triton_cache_folder()] if part == "kernels" else [inductor_cache_folder(), triton_cache_folder()]


def _identity(folder: Path) -> list[int] | None:
    """The folder's device and inode, or ``None`` where it is gone or empty."""
    try:
        if not folder.is_dir() or next(folder.iterdir(), None) is None:
            return None
        status = folder.stat()
    except OSError:
        return None
    return [status.st_dev, status.st_ino]


@dataclass(frozen=True)
class CompileRecord:
    """The markers of one model's compiled parts, named by what the code depends on."""

    shape: CompiledShape
    folders: dict[str, str | None]
    """:func:`configured_folders`, taken when the run chose what to compile."""
    versions: dict[str, str | None]
    """:func:`software`."""
    root: Path
    """The folder of the markers (``cache_dir() / RECORD_FOLDER``)."""

    @classmethod
    def here(cls, shape: CompiledShape) -> CompileRecord:
        """The record of ``shape`` in the project's cache, with the folders and versions in effect now."""
        from grpo_lightning.runtime.cache import cache_dir

        return cls(shape, configured_folders(), software(), cache_dir() / RECORD_FOLDER)

    def marker(self, part: str, options: dict[str, Any]) -> Path:
        """The marker of ``part`` compiled with the engine ``options`` that change its code."""
        if part not in PARTS:
            raise ValueError(f"part {part!r} is not one of {PARTS}")
        named_by = {"part": part, "shape": asdict(self.shape), "options": options, "folders": self.folders,
                    "versions": self.versions}  # fmt: skip
        key = hashlib.sha256(json.dumps(named_by, sort_keys=True, default=str).encode()).hexdigest()[:24]
        return self.root / f"{part}-{key}.json"

    def is_warm(self, part: str, options: dict[str, Any]) -> bool:
        """Whether ``part`` was compiled and run with ``options`` and its cache folders are still there."""
        try:
            written = json.loads(self.marker(part, options).read_text())
            return bool(written["folders"]) and all(
                _identity(Path(folder)) == identity for folder, identity in written["folders"].items()
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False

    def mark(self, part: str, options: dict[str, Any]) -> None:
        """Record that ``part`` has compiled and run with ``options``, in the folders in effect now. A
        cache that cannot be written records nothing (the next run then estimates cold)."""
        folders = {str(folder): _identity(folder) for folder in _folders_in_effect(part)}
        if any(identity is None for identity in folders.values()):
            return  # nothing there to be warm
        marker = self.marker(part, options)
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            partial = marker.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({"folders": folders, "shape": asdict(self.shape), "options": options}))
            partial.replace(marker)
        except OSError:
            pass
