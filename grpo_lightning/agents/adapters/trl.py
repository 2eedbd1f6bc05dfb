"""TRL's ``environment_factory`` contract (``GRPOTrainer(environment_factory=...)``), run unchanged as a
multi-turn environment here: ``--model.environment.name path.to.Factory``, detected by its ``reset``.

TRL's documented environment class: ``__init__()`` takes no argument; ``reset(**kwargs)`` starts an
episode from the row's columns and returns an observation, appended to the prompt (or ``None``); every
other public method is a tool (type hints, a docstring with ``Args:``), and one that raises is answered
with its error; the episode ends at the first model turn without a tool call (or at the episode's
limits). The reward is the environment's own ``get_reward()``, called once after the episode (TRL's
environment-owned reward, the column ``environment_reward``), and the reward functions get the
episode's instances as ``environments`` (TRL's keyword): ``[env.reward for env in environments]``.

A dict of factories, ``--model.environment.name '{wordle: pkg.Wordle, catch: pkg.Catch}'`` (TRL's
multi-environment dict), runs several in one fit: each row names its own in its ``environment``
column, and its episodes see that environment's tools only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from grpo_lightning.agents.messages import Message, followed_by
from grpo_lightning.agents.tool_environment import ToolEnvironment
from grpo_lightning.errors import ConfigError

#: Public methods of a TRL environment that are not tools.
NOT_TOOLS = ("reset", "get_reward")
#: The adapter's settings, which ``environment.args`` gives (TRL builds the class without arguments).
ADAPTER_ARGS = ("tool_call_format", "tool_timeout", "max_tool_calls")


def follows_trl_contract(factory: Any) -> bool:
    """Whether ``factory`` (a class, or an instance) is TRL-style rather than this library's
    ``reset(row)`` / ``step(message)``: it has a ``reset`` and either no ``step`` or a ``reset``
    that takes the row's columns as keywords (``**kwargs``) with no positional argument."""
    reset = getattr(factory, "reset", None)
    if not callable(reset):
        return False
    if not callable(getattr(factory, "step", None)):
        return True
    parameters = list(inspect.signature(reset).parameters.values())[1 if isinstance(factory, type) else 0 :]
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return not positional and any(p.kind is p.VAR_KEYWORD for p in parameters)


def tool_methods(environment: Any) -> list[Callable]:
    """The environment's tools, as TRL finds them: its public methods but ``reset`` and ``get_reward``."""
    names = [name for name, member in inspect.getmembers(type(environment), callable)
             if not name.startswith("_") and name not in NOT_TOOLS and not isinstance(member, type)]  # fmt: skip
    return [getattr(environment, name) for name in names]


class TRLEnvironment(ToolEnvironment):
    """One TRL-style ``environment`` as a :class:`ToolEnvironment`; ``trl_environment``: the instance,
    which TRL-style reward functions get in ``environments``. The other arguments are
    :class:`ToolEnvironment`'s (``environment.args``)."""

    def __init__(self, environment: Any, tool_call_format: Any = "json_tags", tool_timeout: float = 5.0,
                 max_tool_calls: int = 4) -> None:  # fmt: skip
        super().__init__(tool_methods(environment), tool_call_format, tool_timeout, max_tool_calls)
        self.trl_environment = environment

    def reset(self, row: dict[str, Any]) -> list[Message]:
        """The row's prompt, with ``reset(**row)``'s observation appended to its last user message."""
        return followed_by(super().reset(row), self.trl_environment.reset(**row))

    def final_reward(self) -> float | None:
        """``get_reward()`` once the episode is over, where the environment has one; else ``None``."""
        get_reward = getattr(self.trl_environment, "get_reward", None)
        return None if get_reward is None else float(get_reward())


def trl_environment(factory: Callable[..., Any], args: dict[str, Any], name: str) -> TRLEnvironment:
    """A new TRL-style environment of ``factory`` (a class, built without arguments as TRL builds it),
    adapted; ``args``: the adapter's settings (:data:`ADAPTER_ARGS`)."""
    unknown = sorted(set(args) - set(ADAPTER_ARGS))
    if unknown:
        raise ConfigError(f"environment.args: {name} follows TRL's environment_factory contract and is built without "
                          f"arguments; args takes the adapter's {', '.join(ADAPTER_ARGS)}, not {', '.join(unknown)}.")  # fmt: skip
    return TRLEnvironment(factory(), **args)
