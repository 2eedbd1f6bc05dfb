"""Multi-turn rollouts: environments, tools, and the built-in calculator and guess-the-number tasks."""

from grpo_lightning.agents.calculator import CalculatorEnvironment, calculator, think_expression_calls
from grpo_lightning.agents.environment import Environment, EnvironmentOptions, environment_reward
from grpo_lightning.agents.guess_number import GuessNumberEnvironment
from grpo_lightning.agents.python_tool import python
from grpo_lightning.agents.tool_calls import TOOL_CALL_FORMATS, ToolCall, json_tag_calls, llama_json_calls
from grpo_lightning.agents.tool_environment import ToolEnvironment
from grpo_lightning.agents.tools import TOOL_ERROR_KINDS, run_tool_call, tool_schema

__all__ = [
    "TOOL_CALL_FORMATS",
    "TOOL_ERROR_KINDS",
    "CalculatorEnvironment",
    "Environment",
    "EnvironmentOptions",
    "GuessNumberEnvironment",
    "ToolCall",
    "ToolEnvironment",
    "calculator",
    "environment_reward",
    "json_tag_calls",
    "llama_json_calls",
    "python",
    "run_tool_call",
    "think_expression_calls",
    "tool_schema",
]
