"""Assert tests split so that their expected values never reach the program under test.

``assert add(1, 2) == 3`` becomes the *call* ``add(1, 2)``, which the sandbox evaluates and returns as
plain data (:func:`decode` reads what :func:`grpo_lightning.rewards.sandbox.code_sandbox.encode` wrote), and
the *check* ``== 3``, which this process applies. The program sees the calls, never ``3``: whatever it
does to its own interpreter (lying ``__eq__``, patched builtins, forged output), the most it can
report is a value for each call, and a wrong value fails. Only values of the builtin types (``None``,
``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, and lists, tuples, dicts, sets and
frozensets of them) cross the boundary; any other object fails its test.

Split forms (``L`` an expected value: a literal, or ``set``, ``frozenset``, ``tuple``, ``list``,
``sorted``, ``float``, ``int``, ``str``, ``bytes``, ``dict`` of literals):
``E op L`` and ``L op E`` for ``op`` in ``== != < <= > >= in not in`` (and ``is``/``is not`` with
``None``, ``True`` or ``False``); ``math.isclose(E, L, ...)``; ``abs(E - L) < L`` (or ``<=``);
``E`` and ``not E`` (truth), where ``E`` holds no comparison or boolean operator (the expected value
would be inside the call). Several ``assert`` statements in one test, and ``assert A and B``, split
into one part each (all must pass). Anything else is a *whole* test, run in a process of its own: it holds its expected value,
so a program set on it can fake its pass (one test at most, never another's).
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

COMPARISONS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}  # fmt: skip
SINGLETONS = (None, True, False)  # the only values ``is`` compares as Python would across the boundary
EXPECTED_CALLS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "sorted": sorted,
                  "float": float, "int": int, "str": str, "bytes": bytes, "dict": dict}  # fmt: skip
LEAKY_NODES = (ast.Compare, ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.Assert)
MAX_DEPTH = 64
MAX_HASHED = 4096  # items of sets and dicts in one value: ints that collide on purpose make each insert slow
MAX_INT_DIGITS = 4300  # Python's own default limit on int <-> str conversion


@dataclass(frozen=True)
class SplitTest:
    """``check(value of call)`` decides the pass; ``call`` is source for the sandbox to evaluate."""

    call: str
    check: Callable[[Any], bool]


def split(statement: str) -> tuple[SplitTest, ...] | None:
    """The parts of one assert test, each split (the test passes when every part does); ``None`` when
    some part does not split (the test is then run whole). Several ``assert`` statements, and
    ``assert A and B``, give one part each."""
    try:
        module = ast.parse(statement)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not module.body or not all(isinstance(node, ast.Assert) for node in module.body):
        return None
    tests = []
    for node in module.body:
        conjunction = isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)
        tests += node.test.values if conjunction else [node.test]
    try:
        parts = tuple(_split_expression(test) for test in tests)
    except RecursionError:
        return None
    return None if any(part is None for part in parts) else parts


def _split_expression(test: ast.expr) -> SplitTest | None:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        call = _call_source(test.operand)
        return None if call is None else SplitTest(call, lambda value: not value)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        return _split_comparison(test.left, test.ops[0], test.comparators[0])
    if isinstance(test, ast.Call) and _named(test.func, "isclose", "math") and len(test.args) == 2:
        expected, options = _expected(test.args[1]), {}
        for keyword in test.keywords:
            options[keyword.arg] = _expected(keyword.value)
        call = _call_source(test.args[0])
        if expected is _NONE or call is None or any(v is _NONE for v in options.values()) or None in options:
            return None
        if not set(options) <= {"rel_tol", "abs_tol"}:
            return None
        return SplitTest(call, lambda value: _guarded(math.isclose, value, expected, **options))
    call = _call_source(test)
    return None if call is None else SplitTest(call, bool)


def _split_comparison(left: ast.expr, op: ast.cmpop, right: ast.expr) -> SplitTest | None:
    # abs(E - L) < tolerance
    if (
        isinstance(op, (ast.Lt, ast.LtE))
        and isinstance(left, ast.Call)
        and _named(left.func, "abs")
        and len(left.args) == 1
        and not left.keywords
        and isinstance(left.args[0], ast.BinOp)
        and isinstance(left.args[0].op, ast.Sub)
    ):
        target, tolerance = _expected(left.args[0].right), _expected(right)
        call = _call_source(left.args[0].left)
        if target is not _NONE and tolerance is not _NONE and call is not None:
            compare = COMPARISONS[type(op)]
            return SplitTest(call, lambda value: _guarded(lambda v: compare(abs(v - target), tolerance), value))
    compare = COMPARISONS[type(op)]
    expected_right, expected_left = _expected(right), _expected(left)
    if expected_right is not _NONE and (call := _call_source(left)) is not None:
        if isinstance(op, (ast.Is, ast.IsNot)) and not any(expected_right is s for s in SINGLETONS):
            return None
        return SplitTest(call, lambda value: _guarded(compare, value, expected_right))
    if expected_left is not _NONE and (call := _call_source(right)) is not None:
        if isinstance(op, (ast.Is, ast.IsNot)) and not any(expected_left is s for s in SINGLETONS):
            return None
        return SplitTest(call, lambda value: _guarded(compare, expected_left, value))
    return None


class _Missing:
    pass


_NONE = _Missing()  # "not an expected value" (``None`` is one)


def _expected(node: ast.expr) -> Any:
    """The value of ``node`` if it is a literal (or one of ``EXPECTED_CALLS`` of literals), else ``_NONE``."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in EXPECTED_CALLS:
        arguments = [_expected(argument) for argument in node.args]
        if node.keywords or len(arguments) > 1 or any(a is _NONE for a in arguments):
            return _NONE
        try:
            return EXPECTED_CALLS[node.func.id](*arguments)
        except Exception:  # noqa: BLE001 - e.g. float("x"): not an expected value
            return _NONE
    return _NONE


def _call_source(node: ast.expr) -> str | None:
    """Source of the side the sandbox evaluates; ``None`` when it could hide the check itself."""
    if _expected(node) is not _NONE or any(isinstance(child, LEAKY_NODES) for child in ast.walk(node)):
        return None
    return ast.unparse(node)


def _named(func: ast.expr, name: str, module: str | None = None) -> bool:
    if isinstance(func, ast.Name):
        return func.id == name
    return (
        module is not None
        and isinstance(func, ast.Attribute)
        and func.attr == name
        and isinstance(func.value, ast.Name)
        and func.value.id == module
    )


def _guarded(check: Callable[..., bool], *arguments: Any, **options: Any) -> bool:
    """A comparison of plain values that raises (``1 < "a"``) is a failed test."""
    try:
        return bool(check(*arguments, **options))
    except Exception:  # noqa: BLE001 - any error of the comparison fails the test
        return False


# ---------------------------------------------------------------- the values the sandbox reports


class Undecodable(ValueError):
    """What the sandbox reported is not a value :func:`decode` builds."""


def decode(node: Any) -> Any:
    """The plain value a ``[tag, payload]`` tree (parsed JSON) stands for; :class:`Undecodable` for
    anything else."""
    try:
        return _decode(node, 0, [MAX_HASHED])
    except (ValueError, TypeError, RecursionError, OverflowError, MemoryError) as error:
        raise Undecodable(str(error)) from error


def _decode(node: Any, depth: int, hashable_left: list[int]) -> Any:
    if depth > MAX_DEPTH or not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise Undecodable("not a tagged value")
    tag, payload = node[0], node[1:]
    if tag == "none" and not payload:
        return None
    if len(payload) != 1:
        raise Undecodable(f"tag {tag!r} takes one payload")
    (value,) = payload
    scalar = {"bool": bool, "str": str}
    if tag in scalar and type(value) is scalar[tag]:
        return value
    if tag == "int" and type(value) is str and len(value) <= MAX_INT_DIGITS:
        return int(value)
    if tag == "float" and type(value) is str:
        return float(value)
    if tag == "complex" and type(value) is str:
        return complex(value)
    if tag == "bytes" and type(value) is str:
        return bytes.fromhex(value)
    if type(value) is not list:
        raise Undecodable(f"bad payload for {tag!r}")
    items = [_decode(item, depth + 1, hashable_left) for item in value]
    if tag in ("set", "frozenset", "dict"):
        hashable_left[0] -= len(items)
        if hashable_left[0] < 0:
            raise Undecodable(f"more than {MAX_HASHED} items of sets and dicts")
    containers = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
    if tag in containers:
        return containers[tag](items)
    if tag == "dict" and all(type(item) is tuple and len(item) == 2 for item in items):
        return dict(items)
    raise Undecodable(f"unknown tag {tag!r}")
