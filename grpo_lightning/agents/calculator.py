"""A calculator tool for the arithmetic task, and the environment that scores the final answer."""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from grpo_lightning.agents.tool_calls import ToolCall
from grpo_lightning.agents.tool_environment import ToolEnvironment
from grpo_lightning.rewards.accuracy import answers_match, extract_answer

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_MAX_MAGNITUDE = 10**30  # keeps repeated products from growing without bound


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, +, -, *, / and parentheses.

    Args:
        expression: the expression, e.g. "123 * (45 + 6)".
    """

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            result = _OPERATORS[type(node.op)](value(node.left), value(node.right))
            if abs(result) > _MAX_MAGNITUDE:
                raise ValueError("the result is too large")
            return result
        raise ValueError("only numbers, +, -, *, / and parentheses are allowed")

    result = value(ast.parse(expression.strip(), mode="eval").body)
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def think_expression_calls(text: str) -> list[ToolCall]:
    """Calculator calls written as ``<think>EXPRESSION</think>``: a call format for models that
    have not learnt to write JSON, such as the quickstart's tiny model."""
    return [ToolCall("calculator", {"expression": body}) for body in _THINK.findall(text)]


class CalculatorEnvironment(ToolEnvironment):
    """The arithmetic task with a calculator: reward 1 when the final answer (the turn without a
    call) matches the row's ``answer`` (:func:`~grpo_lightning.rewards.accuracy.answers_match`), else 0;
    ``None`` (left to the reward functions) for a row without an answer."""

    def __init__(self, tool_call_format: Any = "json_tags", tool_timeout: float = 5.0, max_tool_calls: int = 4) -> None:
        super().__init__([calculator], tool_call_format, tool_timeout, max_tool_calls)

    def score(self, answer: str) -> float | None:
        reference = self.row.get("answer")
        return None if reference is None else float(answers_match(extract_answer(answer), reference))
