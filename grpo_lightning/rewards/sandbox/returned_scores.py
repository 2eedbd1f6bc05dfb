"""What a reward function returned, read as one float32 score per row, and each value that is a failure."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpo_lightning.rewards.scoring import completion_text

PREVIEW_CHARS = 80
#: The largest score kept: scores are float32, where anything larger becomes inf.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


@dataclass
class Failure:
    """A reward function's failure on ``rows``: the message that names it, and what it raised or returned."""

    rows: list[int]
    message: str
    error: BaseException | None = None  # what the function raised
    nan: bool = False  # it returned NaN (counted for the health checks)


def as_scores(
    name: str, returned: Any, rows: list[int], where: Callable[[list[int]], str]
) -> tuple[list[float], list[Failure]]:
    """One float per row (None -> NaN) and the failures: the whole return if it is no list of
    ``len(rows)``, else each value that is not a finite number float32 holds, or None."""
    count = len(rows)
    expected = f"a list of {count} floats (or None), one per completion"
    if isinstance(returned, torch.Tensor):
        returned = returned.detach().cpu()
    if hasattr(returned, "tolist"):  # tensors and numpy arrays
        returned = returned.tolist()
    if isinstance(returned, (str, bytes)) or not isinstance(returned, Sequence):
        return [], [Failure(rows, f"reward function {name!r} returned {_describe(returned)}; expected {expected}.")]
    values = list(returned)
    if len(values) != count:
        got = f"returned {len(values)} values for {count} completions"
        return [], [Failure(rows, f"reward function {name!r} {got}; expected {expected}.")]
    if count and all(value is None for value in values):
        warnings.warn(
            f"reward function {name!r} returned None for every completion of a batch: it scored nothing, so it "
            "adds 0 to every reward; return a number per completion (None only where it does not apply).",
            stacklevel=5,
        )
    scores, failures = [], []
    for row, value in zip(rows, values):
        score = _float32_score(value) if isinstance(value, numbers.Real) else None
        if value is None:
            scores.append(math.nan)
        elif score is not None:
            scores.append(score)
        elif isinstance(value, numbers.Real):
            scores.append(math.nan)
            message = f"reward function {name!r} returned {_number_text(value)} for {where([row])}; expected a finite"
            message += f" number of at most {FLOAT32_MAX:.4g} in magnitude (None where it does not apply)."
            failures.append(Failure([row], message, nan=_is_nan(value)))
        else:
            scores.append(math.nan)
            failures.append(Failure([row], f"reward function {name!r} returned {_describe(value)} for sample {row}; "
                                            f"expected {expected}."))  # fmt: skip
    return scores, failures


def _float32_score(value: numbers.Real) -> float | None:
    """``value`` as a float when float32 holds it finitely; ``None`` for NaN, infinities and numbers
    past float32's range (``1e39`` would become inf in the rewards, ``10**400`` does not even fit a float)."""
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) and abs(number) <= FLOAT32_MAX else None


def _is_nan(value: numbers.Real) -> bool:
    try:
        return math.isnan(value)
    except (OverflowError, ValueError, TypeError):
        return False


def _number_text(value: numbers.Real) -> str:
    """``value`` for a message, short even for an integer of thousands of digits."""
    try:
        return repr(float(value))
    except (OverflowError, ValueError, TypeError):
        if isinstance(value, numbers.Integral):
            return f"an integer of about {int(int(value).bit_length() * math.log10(2)) + 1} digits"
        return f"a {type(value).__name__} too large for a float"


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {preview(value)!r}"


def preview(value: Any) -> str:
    """``value`` as text for a message, cut to ``PREVIEW_CHARS`` characters."""
    text = completion_text(value) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."
