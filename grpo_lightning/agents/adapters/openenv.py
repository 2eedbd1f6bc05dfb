"""OpenEnv environments (Meta's environment spec, ``pip install 'grpo-lightning[openenv]'``) run as
multi-turn environments: ``--model.environment.name path.to.Thing``, detected by its base class.

Two kinds of thing take part, as OpenEnv defines them:

- an ``Environment`` subclass (the server side): built here with ``environment.args``, one per episode,
  and stepped in process, with no server and no container;
- an ``EnvClient`` subclass (a typed client, or ``GenericEnvClient``): built with ``environment.args``
  (``base_url``, timeouts) and stepped over its own session on a running server; an asynchronous client
  (openenv-core 0.3) runs through its ``sync()`` wrapper.

An episode: ``reset()``, given the row's ``seed`` and ``episode_id`` columns where it has them
(``reset_columns``); the observation follows the row's prompt. Each model turn is one action: a JSON
object of the action's fields, or, for an action of one required field (an echoed message, a guessed
word), the turn's text as that field. The observation's ``reward`` is the step's reward (where the
environment has a rubric, it set it), its ``done`` ends the episode, and its other fields are the
reply: one text field as it is, several as a JSON object. A turn that is no action is answered with
what is wrong, counted as ``bad_call`` (not an action) or ``bad_arguments`` (fields the action refuses),
and the episode goes on. The episode's environment is closed once it is over.

``environment.args`` also takes the adapter's settings (:data:`ADAPTER_ARGS`): ``action_format``, an
import path of a function ``text -> action`` (raising ``ValueError`` for a turn that is none);
``observation_format``, one of ``observation -> text``; ``reset_columns``, the row's columns passed
to ``reset`` as keywords.

MCP environments (``MCPEnvironment``, ``MCPToolClient``), whose actions are calls of their tools, are
refused with a :class:`ConfigError`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
import typing
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from grpo_lightning.agents.messages import Message, followed_by, prompt_messages
from grpo_lightning.agents.tool_calls import import_object, unreadable_json
from grpo_lightning.errors import ConfigError

#: The adapter's settings in ``environment.args``; the other arguments build the environment or client.
ADAPTER_ARGS = ("action_format", "observation_format", "reset_columns")
#: Fields every observation has that are not what it shows.
NOT_SHOWN = ("done", "reward", "metadata")
#: The module defining each of OpenEnv's base classes, loaded once a subclass of theirs exists.
BASES = {"Environment": "openenv.core.env_server.interfaces", "EnvClient": "openenv.core.env_client",
         "MCPEnvironment": "openenv.core.env_server.mcp_environment", "MCPClientBase": "openenv.core.mcp_client"}


def openenv_base(name: str) -> type | None:
    """OpenEnv's base class ``name`` (:data:`BASES`) where its module is imported, else ``None``."""
    found = getattr(sys.modules.get(BASES[name]), name, None)
    return found if isinstance(found, type) else None


def follows_openenv_contract(factory: Any) -> bool:
    """Whether ``factory`` is a subclass of OpenEnv's ``Environment`` or ``EnvClient`` (no import needed:
    such a class exists only once openenv is imported)."""
    bases = [base for base in map(openenv_base, ("Environment", "EnvClient")) if base is not None]
    return isinstance(factory, type) and any(issubclass(factory, base) for base in bases)


def action_type(cls: type) -> type | None:
    """The action class of an ``Environment`` or ``EnvClient`` subclass: its first type argument
    (``Environment[EchoAction, EchoObservation, State]``), else the annotation of ``step``'s ``action``;
    ``None`` where neither is a model (``GenericEnvClient``: actions are dicts)."""
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            arguments = typing.get_args(base)
            if arguments and hasattr(arguments[0], "model_validate"):
                return arguments[0]
    try:
        hint = typing.get_type_hints(cls.step).get("action")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve names no action class
        hint = None
    return hint if hasattr(hint, "model_validate") else None


def parse_action(text: str, action: type | None) -> Any:
    """The action a model's turn writes: a JSON object of ``action``'s fields (a fenced block too), or
    the text as its one required field; a ``ValueError`` for a turn that is neither (pydantic's
    ``ValidationError``, one, for fields the action refuses). ``action`` ``None``: the dict itself."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and text.count("\n") >= 1:
        text = text.split("\n", 1)[1].rsplit("```", 1)[0].strip()
    value = None
    if text.startswith("{"):
        if (problem := unreadable_json(text)) is not None:
            raise ValueError(problem.replace("tool call", "action"))
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"the action is not valid JSON ({error.msg})") from None
    required = [] if action is None else [n for n, f in action.model_fields.items() if f.is_required()]
    if not isinstance(value, dict):
        if len(required) != 1:
            fields = ", ".join(required or (action.model_fields if action is not None else ())) or "its fields"
            raise ValueError(f"reply with the action as a JSON object of {fields}")
        value = {required[0]: text}
    return value if action is None else action.model_validate(value)


def observation_text(observation: Any) -> str:
    """What an observation shows the model: its fields but ``done``, ``reward`` and ``metadata``; one
    text field as it is, else a JSON object."""
    values = observation.model_dump() if hasattr(observation, "model_dump") else dict(observation or {})
    shown = {name: value for name, value in values.items() if name not in NOT_SHOWN}
    if len(shown) == 1 and isinstance(only := next(iter(shown.values())), str):
        return only
    return json.dumps(shown, default=str)


class OpenEnvEnvironment:
    """One OpenEnv environment (in process) or client (of a server) as a multi-turn environment;
    ``openenv``: the instance. The other arguments are the adapter's settings (:data:`ADAPTER_ARGS`)."""

    def __init__(self, openenv: Any, action_format: str | Callable[[str], Any] | None = None,
                 observation_format: str | Callable[[Any], str] | None = None,
                 reset_columns: Sequence[str] = ("seed", "episode_id")) -> None:  # fmt: skip
        mcp = [base for base in map(openenv_base, ("MCPEnvironment", "MCPClientBase")) if base is not None]
        if isinstance(openenv, tuple(mcp)):
            raise ConfigError(f"environment.name: {type(openenv).__name__} is an MCP environment, whose actions are "
                              "calls of its MCP tools; this adapter steps typed actions, not MCP tools.")  # fmt: skip
        local = openenv_base("Environment")
        self.in_process = local is not None and isinstance(openenv, local)
        self.action = action_type(type(openenv))
        if not self.in_process and inspect.iscoroutinefunction(getattr(openenv, "reset", None)):
            openenv = openenv.sync()  # openenv-core 0.3's clients are asynchronous
        self.openenv = openenv
        if self.in_process and self.action is None and action_format is None:
            raise ConfigError(f"environment.name: {type(openenv).__name__} names no action class; subclass "
                              "Environment[MyAction, MyObservation, State], annotate step's action, or give "
                              "environment.args.action_format.")  # fmt: skip
        self.parse = self.resolve(action_format, "action_format") or (lambda text: parse_action(text, self.action))
        self.show = self.resolve(observation_format, "observation_format") or observation_text
        self.reset_columns = tuple(reset_columns)
        self.tool_calls, self.tool_errors, self.closed = 0, Counter(), False

    @staticmethod
    def resolve(format: str | Callable | None, name: str) -> Callable | None:
        return import_object(format, f"environment.args.{name}") if isinstance(format, str) else format

    def outcome(self, result: Any) -> tuple[Any, float | None, bool]:
        """``(observation, reward, done)`` of what ``reset`` or ``step`` returned: an observation in
        process, a ``StepResult`` from a client."""
        observation = result if self.in_process else result.observation
        reward = result.reward
        return observation, None if reward is None else float(reward), bool(result.done)

    def reset(self, row: dict[str, Any]) -> list[Message]:
        """The row's prompt, followed by the first observation."""
        with self.closing_on_error():
            arguments = {column: row[column] for column in self.reset_columns if row.get(column) is not None}
            observation, _, _ = self.outcome(self.openenv.reset(**arguments))
            return followed_by(prompt_messages(row.get("prompt")), self.show(observation))

    def step(self, message: Message) -> tuple[list[Message], float | None, bool]:
        """The observation after the turn's action (none once done), its reward and done."""
        from pydantic import ValidationError

        with self.closing_on_error():
            try:
                action = self.parse(message["content"])
            except ValueError as error:
                self.tool_errors["bad_arguments" if isinstance(error, ValidationError) else "bad_call"] += 1
                return [{"role": "user", "content": f"Error: {' '.join(str(error).split())}."}], None, False
            observation, reward, done = self.outcome(self.openenv.step(action))
            return ([] if done else [{"role": "user", "content": self.show(observation)}]), reward, done

    def final_reward(self) -> None:
        """Nothing: the steps gave the rewards. The episode is over, so its environment is closed."""
        self.close()

    @contextlib.contextmanager
    def closing_on_error(self):
        """An exception ends the episode (counted by the rollout): its environment is closed first."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):  # a session that will not close must not fail the episode
                self.openenv.close()


def openenv_environment(factory: type, args: dict[str, Any], name: str) -> OpenEnvEnvironment:
    """A new environment (or client) of ``factory`` built with ``args`` but the adapter's settings, adapted."""
    settings = {key: args[key] for key in ADAPTER_ARGS if key in args}
    try:
        openenv = factory(**{key: value for key, value in args.items() if key not in ADAPTER_ARGS})
    except (TypeError, ValueError) as error:
        raise ConfigError(f"environment.args: {name} refuses them ({error}); the adapter's own settings are "
                          f"{', '.join(ADAPTER_ARGS)}.") from None  # fmt: skip
    return OpenEnvEnvironment(openenv, **settings)
