"""The environment protocol of multi-turn rollouts, and the options that pick one (``--model.environment``).

An episode: ``reset(row)`` gives the opening messages (the prompt); then the model answers, and
``step(assistant_message)`` gives the environment's reply ``(new_messages, reward, done)``, until
``done``, ``max_turns`` model turns or ``max_tokens`` tokens after the prompt. The episode's
reward is the sum of the rewards ``step`` returned (``None`` adds nothing); it reaches the reward
functions as the column ``environment_reward`` (:func:`environment_reward`).

One environment is built per trajectory, so a group's ``G`` trajectories of one task each have
their own state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from grpo_lightning.agents.adapters import adapted_environment
from grpo_lightning.agents.adapters.extras import import_optional_object
from grpo_lightning.agents.adapters.trl import TRLEnvironment, follows_trl_contract
from grpo_lightning.agents.messages import Message
from grpo_lightning.errors import ConfigError

#: The column of a row that names its environment when ``environment.name`` is a dict (TRL's).
ENVIRONMENT_COLUMN = "environment"


class EnvironmentFailureError(RuntimeError):
    """More of a step's episodes ended by their environment's exception than ``environment.max_error_fraction`` allows."""


@runtime_checkable
class Environment(Protocol):
    """What a multi-turn rollout talks to. Optional attributes: ``tools`` (callables whose schemas
    go to the chat template), ``tool_calls`` and ``tool_errors`` (counts, logged per step),
    ``final_reward()`` (a reward added once the episode is over, ``None`` for none) and
    ``trl_environment`` (what TRL-style reward functions get in ``environments``)."""

    def reset(self, row: dict[str, Any]) -> list[Message]:
        """The opening messages of an episode on the dataset ``row`` (its columns by name)."""
        ...

    def step(self, message: Message) -> tuple[list[Message], float | None, bool]:
        """The reply to the model's ``{"role": "assistant", "content": text}``: messages (role
        ``tool`` or ``user``), a reward or ``None``, and whether the episode is over."""
        ...


@dataclass(frozen=True)
class EnvironmentOptions:
    """Multi-turn rollouts: which environment, and how long an episode may run."""

    name: str | dict[str, str]
    """Import path of the environment's class (or of a function returning one), e.g.
    ``grpo_lightning.agents.CalculatorEnvironment``; a verifiers taskset, an OpenEnv environment or
    client, or a class written for TRL's ``environment_factory`` runs as it is
    (:mod:`grpo_lightning.agents.adapters`). A dict ``{name: import path}``: several, each row naming
    its own in its ``environment`` column."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of each new environment (of another library's: its own and the adapter's settings)."""
    max_turns: int = 4
    """Model turns per episode at most; an episode still going then is truncated."""
    max_tokens: int | None = None
    """Tokens after the prompt at most, the model's and the environment's together; ``None``:
    ``max_turns * max_new_tokens``. Each turn is also limited to ``max_new_tokens``."""
    max_error_fraction: float = 0.1
    """Share of a step's episodes whose environment may raise (in ``reset`` or ``step``): such an
    episode ends with reward 0 and is counted (``agent/environment_errors``); past this share the
    fit stops, naming the environment and its error."""

    @classmethod
    def of(cls, value: EnvironmentOptions | dict[str, Any]) -> EnvironmentOptions:
        """``value`` itself, or built from a dict of its fields; checked, and one environment built."""
        if isinstance(value, dict):
            unknown = sorted(set(value) - {f.name for f in fields(cls)})
            if unknown or "name" not in value:
                problem = f"no option {unknown[0]!r}" if unknown else "'name' is missing"
                raise ConfigError(f"environment: {problem}; give name (an import path), args, max_turns, max_tokens, max_error_fraction.")
            value = cls(**value)
        if not isinstance(value, cls):
            raise ConfigError(f"environment: give EnvironmentOptions or a dict of its fields, got {value!r}.")
        if value.max_turns < 1 or (value.max_tokens is not None and value.max_tokens < 1):
            raise ConfigError("environment.max_turns and environment.max_tokens: must be at least 1.")
        if not 0.0 <= value.max_error_fraction <= 1.0:
            raise ConfigError(f"environment.max_error_fraction: must be between 0 and 1, got {value.max_error_fraction!r}.")
        if isinstance(value.name, dict) and not value.name:
            raise ConfigError("environment.name: give an import path, or a dict of environment names to import paths.")
        for key in value.name if isinstance(value.name, dict) else (None,):
            value.make(None if key is None else {ENVIRONMENT_COLUMN: key})
        return value

    def make(self, row: dict[str, Any] | None = None) -> Environment:
        """A new environment, for the dataset ``row`` (its ``environment`` column picks one of a dict)."""
        path = self.name
        if isinstance(self.name, dict):
            chosen = (row or {}).get(ENVIRONMENT_COLUMN)
            if chosen not in self.name:
                raise ConfigError(f"environment.name: is a dict of {', '.join(map(repr, self.name))}, and a row's "
                                  f"{ENVIRONMENT_COLUMN!r} column is {chosen!r}; give every row one of them.")  # fmt: skip
            path = self.name[chosen]
        factory: Callable[..., Any] = import_optional_object(path, "environment.name")
        adapted = adapted_environment(factory, self.args, path)
        if adapted is not None:
            return adapted
        try:
            environment = factory(**self.args)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"environment.args: {path} refuses them ({error}).") from None
        if follows_trl_contract(environment):
            return TRLEnvironment(environment)
        if not isinstance(environment, Environment):
            raise ConfigError(f"environment.name: {path} made {environment!r}, which has no reset(row) and step(message).")
        return environment

    def token_budget(self, max_new_tokens: int) -> int:
        """Tokens after the prompt at most."""
        return self.max_tokens if self.max_tokens is not None else self.max_turns * max_new_tokens

    def state(self) -> dict[str, Any]:
        """Plain values, for the hyperparameters."""
        return asdict(self)


def environment_reward(prompts: list, completions: list, environment_reward: list[float], **columns: Any) -> list[float]:
    """The reward the environment gave each episode (the sum of its steps' rewards)."""
    return [float(value) for value in environment_reward]
