"""A built-in verifiable task: short arithmetic problems with exact answers."""

from __future__ import annotations

import random

from datasets import Dataset, DatasetDict

from grpo_lightning.errors import ConfigError

SUPPORTED_OPERATIONS = "+-*"
#: The prompt of the built-in task, for models trained on it from scratch (the quickstart's).
TERSE_TEMPLATE = "{a}{op}{b}="


def format_target(answer: str) -> str:
    """Return the completion a model should produce for ``answer`` (EOS not included)."""
    return f"<answer>{answer}</answer>"


def make_arithmetic_dataset(
    num_train: int = 2000,
    num_val: int = 200,
    digits: int = 2,
    operations: str = "+",
    seed: int = 0,
    template: str = TERSE_TEMPLATE,
) -> DatasetDict:
    """Build ``train``/``validation`` splits of problems like ``"37+45="`` with answers like ``"82"``.

    ``template`` writes each prompt from the operands ``{a}``, ``{b}`` and the operation ``{op}``,
    e.g. ``"What is {a} {op} {b}? Reply with only the number."`` for an instruction-tuned model.

    Operands are uniform in ``[0, 10**digits - 1]``; each problem's operation is drawn uniformly
    from ``operations``. For ``-`` the larger operand comes first, so answers are never negative.
    Where the rows asked for are over half of all distinct problems, they are drawn uniformly from
    those instead, so ``-``, which has fewer distinct problems, comes less often.
    All prompts are distinct, hence the validation prompts never appear in training. The result
    depends only on the arguments.
    """
    check_arithmetic_arguments(num_train, num_val, digits, operations, template)
    ops = sorted(set(operations))
    total = num_train + num_val
    space = _count_distinct_prompts(10**digits, ops)
    if total > space:
        raise ConfigError(
            f"num_train + num_val = {total} exceeds the {space} distinct problems with "
            f"digits={digits} and operations={operations!r}; lower num_train/num_val, "
            "raise digits or add operations."
        )
    rng = random.Random(seed)
    if 2 * total > space:
        problems = rng.sample(_all_problems(10**digits, ops), total)
    else:
        problems = _sample_distinct_problems(rng, 10**digits, ops, total)
    prompts = [template.format(a=a, op=op, b=b) for op, a, b in problems]
    answers = [str(_evaluate(op, a, b)) for op, a, b in problems]
    return DatasetDict(
        {
            "train": Dataset.from_dict({"prompt": prompts[:num_train], "answer": answers[:num_train]}),
            "validation": Dataset.from_dict({"prompt": prompts[num_train:], "answer": answers[num_train:]}),
        }
    )


def check_arithmetic_arguments(num_train: int, num_val: int, digits: int, operations: str, template: str) -> None:
    """Raise :class:`ConfigError` for arguments of :func:`make_arithmetic_dataset` that cannot build it."""
    if num_train < 1:
        raise ConfigError(f"num_train must be at least 1, got {num_train}.")
    if num_val < 0:
        raise ConfigError(f"num_val must be 0 or more, got {num_val}.")
    if digits < 1:
        raise ConfigError(f"digits must be at least 1, got {digits}.")
    unknown = sorted(set(operations) - set(SUPPORTED_OPERATIONS))
    if not operations or unknown:
        raise ConfigError(
            f"operations={operations!r} must be a non-empty string of characters from "
            f"{SUPPORTED_OPERATIONS!r}, e.g. '+-'."
        )
    _check_template(template, operations)


def _check_template(template: str, operations: str = "+") -> None:
    try:
        written = template.format(a=37, op="+", b=45)
    except (KeyError, IndexError, ValueError) as error:
        raise ConfigError(
            f"template={template!r} cannot be filled ({type(error).__name__}: {error}); use only the fields "
            "{a}, {op} and {b}, and double literal braces ({{ }})."
        ) from None
    if "37" not in written or "45" not in written:
        raise ConfigError(f"template={template!r} must contain {{a}} and {{b}}, e.g. 'What is {{a}} {{op}} {{b}}?'.")
    if len(set(operations)) > 1 and written == template.format(a=37, op="*", b=45):
        raise ConfigError(
            f"template={template!r} does not write the operation, so with operations={operations!r} one prompt would "
            "stand for problems of different answers (and a validation prompt could be a training one); add {op}, "
            "e.g. 'What is {a} {op} {b}?'."
        )


def _count_distinct_prompts(num_values: int, ops: list[str]) -> int:
    ordered_pairs = num_values * num_values
    unordered_pairs = num_values * (num_values + 1) // 2
    return sum(unordered_pairs if op == "-" else ordered_pairs for op in ops)


def _all_problems(num_values: int, ops: list[str]) -> list[tuple[str, int, int]]:
    return [
        (op, a, b)
        for op in ops
        for a in range(num_values)
        for b in range(num_values)
        if op != "-" or a >= b
    ]


def _sample_distinct_problems(
    rng: random.Random, num_values: int, ops: list[str], count: int
) -> list[tuple[str, int, int]]:
    seen: set[tuple[str, int, int]] = set()
    problems: list[tuple[str, int, int]] = []
    while len(problems) < count:
        op = rng.choice(ops)
        a, b = rng.randrange(num_values), rng.randrange(num_values)
        if op == "-" and a < b:
            a, b = b, a
        if (op, a, b) not in seen:
            seen.add((op, a, b))
            problems.append((op, a, b))
    return problems


def _evaluate(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b
