"""Numbers and text as the report prints them: counts with thousands separators, other values
with four significant digits (no exponent between 0.001 and a million), intervals, p-values, and
free text (prompts, completions) made safe for a Markdown table cell."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from grpo_lightning.report.render.document import user_text

#: Metrics whose values are counts: printed as whole numbers with thousands separators.
COUNT_METRICS = {"perf/generated_tokens", "steps", "batches", "step_of:val/accuracy"}
#: Keys of thresholds reached (``learning.REACH_AXES``): ``inf`` means never reached.
REACH_PREFIXES = ("steps_to@", "tokens_to@")
#: Units printed after a value.
UNITS = {"train_time_s": " s"}


def fmt(value: float | None, digits: int = 4) -> str:
    """``0.5752`` -> ``0.5752``; ``70440.0`` -> ``70,440``; ``5633.4`` -> ``5,633``; ``1.2e-05`` -> ``1.2e-05``;
    nan -> ``n/a``. From a thousand on, thousands separators always (``-5,633`` beside ``-4,894``)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    if 10**digits <= abs(value) < 1e9 or (abs(value) >= 10 ** (digits - 1) and float(value).is_integer()):
        return f"{value:,.0f}"
    if 1000 <= abs(value) < 1e9:  # ``digits`` significant digits, of which the whole part holds at least four
        text = f"{value:,.{max(0, digits - len(str(int(abs(value)))))}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return f"{value:.{digits}g}"  # an exponent below 0.001 only


def not_reached(value: float | None, key: str) -> bool:
    """Whether ``value`` is a threshold never reached (``inf`` of ``steps_to@``/``tokens_to@``)."""
    return value == math.inf and key.startswith(REACH_PREFIXES)


def fmt_metric(value: float | None, key: str = "") -> str:
    """A metric value: counts as whole numbers (``70,440``), the rest by :func:`fmt`."""
    if not_reached(value, key):
        return "not reached"
    if key in COUNT_METRICS and value is not None and math.isfinite(value):
        return f"{value:,.0f}"
    return fmt(value)


def fmt_interval(mean: float, low: float, high: float, key: str = "") -> str:
    """``mean [low, high]``, or the mean alone without an interval."""
    if not_reached(mean, key):
        return "not reached by every seed"
    if not math.isfinite(low) or not math.isfinite(high):
        return fmt_metric(mean, key)
    return f"{fmt_metric(mean, key)} [{fmt_metric(low, key)}, {fmt_metric(high, key)}]"


def fmt_p(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def p_phrase(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"= {p:.4f}"


def join_words(items: Sequence[str]) -> str:
    """``a``; ``a and b``; ``a, b and c`` (empty for none)."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def join_names(names: list[str]) -> str:
    """``a``, ``b`` and ``c`` in bold (users' names: :func:`~grpo_lightning.report.render.document.user_text`)."""
    return join_words([f"**{user_text(n)}**" for n in names])


def shorten(text: str, limit: int) -> str:
    """At most ``limit`` characters: the middle of a longer text is replaced by `` … ``."""
    if len(text) <= limit:
        return text
    keep = max(limit - 3, 2)
    return text[: (keep + 1) // 2] + " … " + text[len(text) - keep // 2 :]


def code_text(text: str, limit: int) -> str:
    """A user's free text as an inline code span, shortened: nothing inside is read as markup,
    newlines show as ``⏎`` and backticks (which would end the span) as ``'``."""
    flat = shorten(re.sub(r"\r\n|\r|\n", "⏎", str(text)).replace("`", "'"), limit)
    return f"`{user_text(flat)}`" if flat.strip() else "(empty)"
