"""Resolve reward functions from configuration (:mod:`grpo_lightning.rewards.sandbox.execution` calls them).

A reward function is a callable ``(prompts, completions, **columns) -> list[float | None]``:
``columns`` are the dataset's other columns aligned with the completions (e.g. ``answer=[...]``),
and ``None`` means "not applicable to this sample". A function that takes a ``group_index``
parameter (or ``**kwargs``) also gets the group (prompt) of each completion, to score a completion
against the others of its group (e.g. :func:`grpo_lightning.rewards.majority_vote_reward`). As in TRL,
one that takes ``completion_ids`` (or ``**kwargs``) gets each completion's token ids, and one that
takes ``trainer_state`` a :class:`TrainerState`; a dataset column of either name is an error.
"""

from __future__ import annotations

import functools
import importlib
import math
import numbers
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpo_lightning.errors import ConfigError, require
from grpo_lightning.rewards.calls import parameters_of

RewardFunction = Callable[..., Sequence[float | None]]

EXAMPLE_PATH = "grpo_lightning.rewards.accuracy_reward"
GROUP_INDEX = "group_index"
RESERVED_COLUMNS = ("prompt", "prompts", "completions", GROUP_INDEX)
COMPLETION_IDS, TRAINER_STATE = "completion_ids", "trainer_state"
#: What the scoring passes beside the columns, with what it is: no column may take these names.
SCORING_KEYWORDS = {
    COMPLETION_IDS: "each completion's token ids, the model's tokens only, unpadded",
    TRAINER_STATE: "the training's progress: global_step, epoch, max_steps, num_train_epochs",
}


@dataclass(frozen=True)
class TrainerState:
    """How far training is, under the names of the ``TrainerState`` that TRL passes its reward
    functions: ``global_step``, the optimizer steps taken; ``epoch``, the epochs of training prompts
    done, with the share of the current one when its length is known (``1.5``: half way through the
    second); ``max_steps`` and ``num_train_epochs``, the fit's limits (``trainer.max_steps``,
    ``trainer.max_epochs``), ``None`` where the fit sets none. In validation before training, all zero."""

    global_step: int = 0
    epoch: float = 0.0
    max_steps: int | None = None
    num_train_epochs: int | None = None

    @classmethod
    def of(cls, trainer: Any) -> TrainerState:
        """The state of a Lightning ``trainer`` (``None``: a state at the start)."""
        if trainer is None:
            return cls()
        batches, done = trainer.num_training_batches, trainer.fit_loop.epoch_loop.batch_progress.current.completed
        share = done / batches if isinstance(batches, int) and batches > 0 else 0.0
        max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
        return cls(trainer.global_step, trainer.current_epoch + min(share, 1.0), max_steps if max_steps > 0 else None,
                   max_epochs if max_epochs is not None and max_epochs > 0 else None)  # fmt: skip


def passed_keywords(function: Callable, completion_ids: Any = None, trainer_state: Any = None) -> dict[str, Any]:
    """What the scoring passes ``function`` beside the columns: ``completion_ids`` and ``trainer_state``,
    each when known and taken (a parameter of that name, or ``**kwargs``), as ``group_index`` is."""
    given = {COMPLETION_IDS: completion_ids, TRAINER_STATE: trainer_state}
    return {name: value for name, value in given.items() if value is not None and accepts_keyword(function, name)}


def check_column_names(columns: Any, where: str = "the data") -> None:
    """Raise :class:`ConfigError` for a column named as what the scoring passes (:data:`SCORING_KEYWORDS`)."""
    for name, meaning in SCORING_KEYWORDS.items():
        require(name not in columns, f"column {name!r} of {where}: reward functions get {name} from the scoring "
                f"({meaning}, as in TRL); rename the column.")  # fmt: skip


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


def resolve_reward_function(spec: Any, field: str = "rewards.funcs[0]") -> tuple[str, RewardFunction]:
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
    """Whether ``function`` takes ``keyword``: a parameter of that name, or ``**kwargs``."""
    named, any_keyword = _keywords(function)
    return keyword in named or any_keyword


def names_group_index(function: RewardFunction) -> bool:
    """Whether ``function`` has a ``group_index`` parameter by name (not only ``**kwargs``): its score
    of a sample may depend on the sample's group."""
    return GROUP_INDEX in _keywords(function)[0]


def _keywords(function: Callable) -> tuple[frozenset[str], bool]:
    """``(parameters passable by keyword, whether it takes **kwargs)``, inspected once per function
    (:func:`~grpo_lightning.rewards.calls.parameters_of`)."""
    parameters = parameters_of(function)
    return parameters.named, parameters.any_keyword


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


def resolve_function(spec: Any, field: str) -> tuple[str, Callable]:
    """``(name, function)`` of a reward function given as a callable or an import path; a path that
    does not import, or names no function, is a :class:`ConfigError` naming ``field``."""
    try:
        return resolve_reward_function(spec, field=field)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(str(error)) from error


def check_rewards(funcs: Any, weights: Any) -> None:
    """Raise :class:`ConfigError` unless ``funcs`` is a non-empty list of functions (or import
    paths) and ``weights`` null or one finite number per function."""
    require(
        isinstance(funcs, Sequence) and not isinstance(funcs, str) and len(funcs) > 0,
        f"rewards.funcs: give a list of at least one reward function (got {funcs!r}); "
        "e.g. --model.rewards.funcs '[grpo_lightning.rewards.accuracy_reward]'.",
    )
    for i, spec in enumerate(funcs):
        resolve_function(spec, f"rewards.funcs[{i}]")
    if weights is None:
        return
    require(
        isinstance(weights, Sequence) and not isinstance(weights, str),
        f"rewards.weights: give a list of numbers, one per reward function, or null for all 1 (got {weights!r}).",
    )
    for i, weight in enumerate(weights):
        real = isinstance(weight, numbers.Real) and not isinstance(weight, bool)
        require(real and math.isfinite(weight), f"rewards.weights[{i}]: must be a finite number (got {weight!r}).")
    require(
        len(weights) == len(funcs),
        f"rewards.weights: {len(weights)} weights for {len(funcs)} reward functions; "
        "give one per function.",
    )
