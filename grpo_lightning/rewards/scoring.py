"""Resolve reward functions from configuration and score completions with them.

A reward function is a callable ``(prompts, completions, **columns) -> list[float | None]``:
``columns`` are the dataset's other columns aligned with the completions (e.g. ``answer=[...]``),
and ``None`` means "not applicable to this sample". A function that takes a ``group_index``
parameter (or ``**kwargs``) also gets the group (prompt) of each completion, to score a completion
against the others of its group (e.g. :func:`grpo_lightning.rewards.majority_vote_reward`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import numbers
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

RewardFunction = Callable[..., Sequence[float | None]]

EXAMPLE_PATH = "grpo_lightning.rewards.accuracy_reward"
GROUP_INDEX = "group_index"
RESERVED_COLUMNS = ("prompt", "prompts", "completions", GROUP_INDEX)
PREVIEW_CHARS = 80
# Which keywords each reward function takes, by function (each inspected once).
_ACCEPTS_KEYWORD: weakref.WeakKeyDictionary[Any, dict[str, bool]] = weakref.WeakKeyDictionary()


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something other than one number (or None) per completion."""


def completion_text(completion: Any) -> str:
    """Text of a completion: the string itself, or the last message's content for a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content", ""))
    if isinstance(completion, Sequence) and completion:
        return completion_text(completion[-1])
    return "" if completion is None else str(completion)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # multimodal parts: [{"type": "text", "text": ...}, ...]
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def resolve_reward_function(spec: Any, field: str = "reward_funcs[0]") -> tuple[str, RewardFunction]:
    """Return ``(name, function)`` for a callable or an import path such as ``"package.module.attr"``.

    Classes are refused: configure an instance (``{"class_path": ..., "init_args": ...}``) instead.
    """
    if isinstance(spec, str):
        function = _import_path(spec, field)
        where = f"{field}={spec!r}"
    else:
        function = spec
        where = f"{field}={spec!r}"
    if isinstance(function, type):
        path = f"{function.__module__}.{function.__qualname__}"
        raise ValueError(
            f"{where} is a class; pass an instance as {{\"class_path\": \"{path}\", \"init_args\": {{...}}}} "
            f"or a function such as {EXAMPLE_PATH!r}."
        )
    if not callable(function):
        raise ValueError(
            f"{where} resolves to a {type(function).__name__}, which is not callable; pass a function "
            f"(prompts, completions, **columns) -> list[float | None], e.g. {EXAMPLE_PATH!r}."
        )
    return _function_name(function), function


def _import_path(path: str, field: str) -> Any:
    parts = path.split(".")
    if len(parts) < 2 or not all(parts):
        raise ValueError(
            f"{field}={path!r} is not an import path; write it as 'package.module.attr', e.g. {EXAMPLE_PATH!r}."
        )
    _find_local_module(parts[0])
    import_error: Exception | None = None
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            target: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and (module_name + ".").startswith(error.name + "."):
                import_error = import_error or error
                continue
            import_error = error
            break
        except Exception as error:  # the module exists but failed while importing
            import_error = error
            break
        try:
            for attribute in parts[split:]:
                target = getattr(target, attribute)
            return target
        except AttributeError as error:
            import_error = error
            break
    raise ValueError(
        f"{field}={path!r} could not be imported ({type(import_error).__name__}: {import_error}); "
        f"give an importable 'package.module.attr' path, e.g. {EXAMPLE_PATH!r}."
    ) from import_error


def _find_local_module(name: str) -> None:
    """Let ``name`` import from the working directory, as ``python -m`` would: console scripts
    leave the working directory off ``sys.path``, so a reward module beside the user's data would
    otherwise need ``PYTHONPATH=.``."""
    cwd = os.getcwd()
    if cwd in sys.path or "" in sys.path:
        return
    if os.path.isfile(os.path.join(cwd, name + ".py")) or os.path.isfile(os.path.join(cwd, name, "__init__.py")):
        sys.path.append(cwd)


def _function_name(function: Any) -> str:
    if isinstance(function, functools.partial):
        return _function_name(function.func)
    name = getattr(function, "__name__", None)
    return name if isinstance(name, str) else type(function).__name__


def group_indices(count: int, group_size: int) -> list[int]:
    """The group of each of ``count`` completions laid out as a rollout lays them: rows
    ``g*G .. g*G + G - 1`` are the completions of prompt ``g``."""
    return [row // group_size for row in range(count)]


def accepts_group_index(function: RewardFunction) -> bool:
    """Whether ``function`` takes a ``group_index`` keyword (:func:`accepts_keyword`)."""
    return accepts_keyword(function, GROUP_INDEX)


def accepts_keyword(function: Callable, keyword: str) -> bool:
    """Whether ``function`` takes ``keyword``: a parameter of that name, or ``**kwargs``. Inspected
    once per function and keyword (functions that cannot be weakly referenced are inspected per call)."""
    try:
        return _ACCEPTS_KEYWORD[function][keyword]
    except (KeyError, TypeError):
        pass
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature: call them without it
        accepts = False
    else:
        accepts = any(
            p.kind is p.VAR_KEYWORD or (p.name == keyword and p.kind is not p.POSITIONAL_ONLY) for p in parameters
        )
    with contextlib.suppress(TypeError):
        _ACCEPTS_KEYWORD.setdefault(function, {})[keyword] = accepts
    return accepts


def score_completions(
    reward_functions: list[tuple[str, RewardFunction]],
    prompts: list[Any],
    completions: list[Any],
    columns: dict[str, list[Any]],
    group_index: Sequence[int] | None = None,
) -> torch.Tensor:
    """Score every completion with every function: a float32 tensor ``[N, F]``.

    Each function is called as ``function(prompts, completions, **columns)``; the keys ``prompt``,
    ``prompts``, ``completions`` and ``group_index`` are dropped from ``columns``. ``group_index``
    (one int per completion, e.g. :func:`group_indices`) is passed to the functions that take it
    (:func:`accepts_group_index`). ``None`` scores become NaN.
    """
    count = len(completions)
    if len(prompts) != count:
        raise ValueError(f"got {len(prompts)} prompts for {count} completions; pass one prompt per completion.")
    if group_index is not None and len(group_index) != count:
        raise ValueError(
            f"got {len(group_index)} group_index values for {count} completions; pass one group per completion."
        )
    columns = {key: values for key, values in columns.items() if key not in RESERVED_COLUMNS}
    for key, values in columns.items():
        if hasattr(values, "__len__") and len(values) != count:
            raise ValueError(
                f"column {key!r} has {len(values)} values for {count} completions; "
                "repeat each row's value once per completion of its group."
            )
    scores = torch.empty(count, len(reward_functions), dtype=torch.float32)
    for index, (name, function) in enumerate(reward_functions):
        arguments = columns
        if group_index is not None and accepts_group_index(function):
            arguments = {**columns, GROUP_INDEX: list(group_index)}
        scores[:, index] = torch.tensor(_call(name, function, prompts, completions, arguments), dtype=torch.float32)
    return scores


def _call(
    name: str, function: RewardFunction, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]
) -> list[float]:
    try:
        returned = function(prompts, completions, **columns)
    except Exception as error:
        sample = _first_failing_sample(function, prompts, completions, columns)
        shown = sample or 0
        where = f"sample {sample}" if sample is not None else f"the batch of {len(completions)} (no sample fails alone)"
        raise RewardFunctionError(
            f"reward function {name!r} raised {type(error).__name__}: {error} at {where}; "
            f"prompt={_preview(prompts[shown])!r}, completion={_preview(completions[shown])!r}."
        ) from error
    return _as_scores(name, returned, len(completions))


def _first_failing_sample(
    function: RewardFunction, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]
) -> int | None:
    """Retry one sample at a time to find which input the function fails on."""
    for sample in range(len(completions)):
        single_columns = {key: _slice(values, sample) for key, values in columns.items()}
        try:
            function(prompts[sample : sample + 1], completions[sample : sample + 1], **single_columns)
        except Exception:
            return sample
    return None


def _slice(values: Any, sample: int) -> Any:
    return values[sample : sample + 1] if hasattr(values, "__getitem__") and hasattr(values, "__len__") else values


def _as_scores(name: str, returned: Any, count: int) -> list[float]:
    expected = f"a list of {count} floats (or None), one per completion"
    if isinstance(returned, torch.Tensor):
        returned = returned.detach().cpu()
    if hasattr(returned, "tolist"):  # tensors and numpy arrays
        returned = returned.tolist()
    if isinstance(returned, (str, bytes)) or not isinstance(returned, Sequence):
        raise RewardFunctionError(f"reward function {name!r} returned {_describe(returned)}; expected {expected}.")
    values = list(returned)
    if len(values) != count:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} values for {count} completions; expected {expected}."
        )
    if count and all(value is None for value in values):
        warnings.warn(
            f"reward function {name!r} returned None for every completion of a batch: it scored nothing, so it "
            "adds 0 to every reward; return a number per completion (None only where it does not apply).",
            stacklevel=2,
        )
    scores = []
    for sample, value in enumerate(values):
        if value is None:
            scores.append(math.nan)
        elif isinstance(value, numbers.Real):
            scores.append(float(value))
        else:
            raise RewardFunctionError(
                f"reward function {name!r} returned {_describe(value)} for sample {sample}; expected {expected}."
            )
    return scores


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {_preview(value)!r}"


def _preview(value: Any) -> str:
    text = completion_text(value) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."


def weighted_reward(per_function: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over functions ``[N, F] -> [N]`` that skips NaN ("not applicable") scores.

    A row whose scores are all NaN gets reward 0.
    """
    if per_function.dim() != 2 or weights.shape != (per_function.shape[1],):
        raise ValueError(
            f"per_function must be [N, F] and weights [F]; got {tuple(per_function.shape)} and {tuple(weights.shape)}."
        )
    weights = weights.to(device=per_function.device, dtype=per_function.dtype)
    return torch.nansum(per_function * weights, dim=1)
