"""Accuracy reward: does the answer in a completion match the reference answer?"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from grpo_lightning.rewards import math_verifier
from grpo_lightning.rewards.scoring import completion_text

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
BOXED_OPENING = re.compile(r"\\boxed\s*\{")
# A minus sign counts only when it does not follow a word or a closing bracket ("10-3" is not "-3").
NUMBER = re.compile(r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?:(?<![\w)\]])-)?\.\d+")
LATEX_FRACTION = re.compile(r"^(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
THOUSANDS = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d+)?$")
SPACED_THOUSANDS = re.compile(r"^[-+]?\d{1,3}( \d{3})+(\.\d+)?$")
MIXED_NUMBER = re.compile(r"^([-+]?)(\d+) (\d+)/(\d+)$")
SPACE_BESIDE_NON_DIGIT = re.compile(r"(?<!\d)\s+|\s+(?!\d)")
# Plain words compare as text only: math-verify would read "AB" as the product a*b, equal to "BA".
WORDS = re.compile(r"^[^\W\d_]+(?:\s+[^\W\d_]+)*$")
RELATIVE_TOLERANCE = 1e-6
#: Exponents (``1e400``) past this are no float's, and too costly to expand exactly.
EXPONENT = re.compile(r"[eE][-+]?([\d_]+)")
MAX_EXPONENT = 4300


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: the last ``<answer>...</answer>``, else the last ``\\boxed{...}``,
    else the last number (commas removed); ``None`` when there is none."""
    tagged = ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` whose braces balance, allowing nested braces."""
    for opening in reversed(list(BOXED_OPENING.finditer(text))):
        depth = 1
        for position in range(opening.end(), len(text)):
            if text[position] == "{":
                depth += 1
            elif text[position] == "}":
                depth -= 1
                if depth == 0:
                    return text[opening.end() : position]
    return None


def parse_number(text: str) -> float | None:
    """Parse ints, decimals, fractions (``3/4``, ``\\frac{3}{4}``), ``1,234`` and ``\\$18``; ``None`` if not a
    number, or not one a float holds (``1e400``, 309 digits, a nonzero ``1e-400``): such answers
    compare as text. Never raises, on any text a model writes."""
    cleaned = text.replace("\\$", "").strip().strip("$").strip().rstrip(".").strip()  # "\$18": money, as MATH writes it
    latex = LATEX_FRACTION.match(cleaned)
    if latex:
        cleaned = f"{latex.group(1)}{latex.group(2)}/{latex.group(3)}"
    if THOUSANDS.match(cleaned):
        cleaned = cleaned.replace(",", "")
    cleaned = SPACE_BESIDE_NON_DIGIT.sub("", cleaned)  # "- 5", "5 / 2", "$ 18"
    if SPACED_THOUSANDS.match(cleaned):
        cleaned = cleaned.replace(" ", "")  # "1 000 000"
    mixed = MIXED_NUMBER.match(cleaned)
    if mixed:  # "3 1/2" is 3.5, not 31/2
        sign, whole, numerator, denominator = mixed.groups()
        cleaned = f"{sign}{int(whole) * int(denominator) + int(numerator)}/{denominator}"
    if any(c.isspace() for c in cleaned):
        return None  # "1 2": two numbers, not 12
    if any(_too_large(exponent) for exponent in EXPONENT.findall(cleaned)):
        return None  # Fraction would compute 10**exponent first: "1e999999999" takes minutes
    try:
        exact = Fraction(cleaned)
        number = float(exact)
    except (ValueError, ZeroDivisionError, OverflowError):  # ValueError too for over 4300 digits
        return None
    return None if number == 0 and exact != 0 else number


def _too_large(exponent: str) -> bool:
    digits = exponent.replace("_", "").lstrip("0")
    return len(digits) > len(str(MAX_EXPONENT)) or bool(digits) and int(digits) > MAX_EXPONENT


def answers_match(predicted: str | None, reference: Any) -> bool:
    """Numeric comparison when both sides are numbers (:func:`numbers_match`: whole numbers exactly, others
    to a relative tolerance of 1e-6); else normalized text
    equality, then (with math-verify installed, and unless both are plain words) math-verify's
    equivalence of the two as LaTeX: expressions, sets, intervals, units."""
    if predicted is None or reference is None:
        return False
    reference = str(reference)
    predicted_number, reference_number = parse_number(predicted), parse_number(reference)
    if predicted_number is not None and reference_number is not None:
        return numbers_match(predicted_number, reference_number)
    if _normalize(predicted) == _normalize(reference):
        return True
    if WORDS.match(predicted.strip()) and WORDS.match(reference.strip()):
        return False
    return bool(math_verifier.equivalent(predicted, reference))


def numbers_match(first: float, second: float) -> bool:
    """Two whole numbers only when equal (``66681335`` is not ``66681336``, however large); otherwise
    within :data:`RELATIVE_TOLERANCE` (``0.3333333`` is ``1/3``, ``2.9999999`` is ``3``)."""
    if first.is_integer() and second.is_integer():
        return first == second
    return math.isclose(first, second, rel_tol=RELATIVE_TOLERANCE)


def _normalize(text: str) -> str:
    return " ".join(text.strip().strip("$").strip().rstrip(".").lower().split())


def accuracy_reward(prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's extracted answer matches ``answer``, else 0.0; ``None`` where ``answer`` is None."""
    if len(answer) != len(completions):
        raise ValueError(
            f"got {len(answer)} answers for {len(completions)} completions; pass one answer per completion."
        )
    return [
        None if reference is None else float(answers_match(extract_answer(completion_text(completion)), reference))
        for completion, reference in zip(completions, answer)
    ]


def start_math_verify_for(functions: Iterable[Callable]) -> None:
    """Start math-verify's child in the background (:func:`math_verifier.start_in_background`) when one of
    ``functions`` is :func:`accuracy_reward`, whose comparisons may need it: its imports then run while a
    fit loads its model, not at the first answer that is no plain number."""
    if any(function is accuracy_reward for function in functions):
        math_verifier.start_in_background()
