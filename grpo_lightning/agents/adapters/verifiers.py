"""verifiers environments (Prime Intellect's Environments Hub; ``pip install 'grpo-lightning[verifiers]'``,
the ``verifiers.v1`` API of verifiers 0.4) run as multi-turn environments: ``--model.environment.name
my_env.MyTaskset``, detected by its base class ``vf.Taskset``.

The taskset is built with ``environment.args`` as its config's fields (``num_tasks: 10``), the adapter's
settings (:data:`ADAPTER_ARGS`) taken out first. A row is one task: its ``task`` column (the task's
``TaskData`` as JSON, as :class:`~grpo_lightning.agents.adapters.verifiers_data.TasksetDataModule`
writes it), else those of its columns that are ``TaskData`` fields (``prompt``, ``answer``, ...).

An episode is what verifiers' ``SingleAgentEnv`` runs with its chat harness, the policy in the agent's
seat: the task's system prompt and prompt open it, the tools of the task's and the taskset's toolsets
(``@vf.tool`` methods of ``Task.toolsets`` and ``Taskset.toolsets``) run in process, without an MCP
server, and the first turn without a tool call ends it. Where the taskset's package exports a ``vf.Env``
(verifiers' own rule: a game engine or a simulated user playing the user, as ``TextArenaEnv``), or
``env`` names one (``env: null``: none), that env's ``setup``, ``run`` and ``finalize`` run the episode:
each ``turn(message)`` of its interaction is a user message to the model, and the model's next turn
without a tool call is the segment ``turn`` returns. The env is built without its ``__init__``, whose serving machinery
(harness programs, model interception, runtimes) this adapter replaces; its hooks see ``self.config``
and ``self.taskset``. Once the episode is over (or cut by ``max_turns``: ``stop_condition``
``max_turns``), the task's ``@vf.reward`` functions score its trace (``task.score``), and the episode's
reward is the trace's weighted reward, with what the env recorded on it: the column ``environment_reward``.

Refused, naming what (a :class:`ConfigError`), as they need verifiers' serving machinery: tasks that
need a container, rewards that need a runtime, judges plugged into the task config, envs of several
agents, and (not checked here) ``@vf.stop`` conditions. Harness programs do not run: the policy is the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sys
from collections.abc import Callable
from typing import Any

from grpo_lightning.agents.messages import Message
from grpo_lightning.agents.tool_calls import import_object
from grpo_lightning.agents.tool_environment import ToolEnvironment
from grpo_lightning.errors import ConfigError

#: The adapter's settings in ``environment.args``; the other arguments are the taskset config's fields.
ADAPTER_ARGS = ("env", "tool_call_format", "tool_timeout", "max_tool_calls")


def follows_verifiers_contract(factory: Any) -> bool:
    """Whether ``factory`` is a subclass of ``verifiers.v1.Taskset`` (no import needed: such a class
    exists only once verifiers is imported)."""
    taskset = getattr(sys.modules.get("verifiers.v1.taskset"), "Taskset", None)
    return isinstance(factory, type) and isinstance(taskset, type) and issubclass(factory, taskset)


def build_taskset(factory: type, args: dict[str, Any], field: str = "environment.args") -> Any:
    """A taskset of ``factory``, its config built from ``args`` but the adapter's settings."""
    from verifiers.v1.utils.generic import concrete_type

    import verifiers.v1 as vf

    config_type = concrete_type(factory, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    try:
        return factory(config_type(**{key: value for key, value in args.items() if key not in ADAPTER_ARGS}))
    except (TypeError, ValueError) as error:
        problem = " ".join(str(error).split())
        raise ConfigError(f"{field}: {factory.__name__} refuses them as fields of {config_type.__name__} ({problem}); "
                          f"the adapter's own are {', '.join(ADAPTER_ARGS)}.") from None  # fmt: skip


def exported_env(taskset: type) -> type | None:
    """The ``vf.Env`` subclass that the module exporting ``taskset`` in its ``__all__`` exports too
    (innermost such module of the class's package path), as verifiers pairs a taskset package with its env."""
    import verifiers.v1 as vf

    parts = taskset.__module__.split(".")
    for module in (sys.modules.get(".".join(parts[:n])) for n in range(len(parts), 0, -1)):
        exported = [getattr(module, name, None) for name in getattr(module, "__all__", ())]
        if taskset in exported:
            return next((e for e in exported if isinstance(e, type) and issubclass(e, vf.Env) and e is not vf.Env), None)
    return None


def needs_runtime(function: Callable) -> bool:
    """Whether a reward takes a ``runtime`` without a default, which verifiers skips where there is none."""
    parameter = inspect.signature(function).parameters.get("runtime")
    return parameter is not None and parameter.default is parameter.empty


def vf_message(message: Any) -> Message:
    """A verifiers message as this library's ``{"role", "content"}`` (its text)."""
    from verifiers.v1.types import content_text

    return {"role": message.role, "content": content_text(message.content)}


def tool_function(name: str, method: Callable) -> Callable[..., str]:
    """A toolset's ``@vf.tool`` method as a tool here: named as verifiers advertises it, described by the
    JSON schema of its signature (as MCP describes it) and its docstring; a coroutine runs to its end."""
    from pydantic import create_model

    try:
        signature = inspect.signature(method, eval_str=True)
    except Exception:  # noqa: BLE001 - annotations that do not resolve describe their arguments as anything
        signature = inspect.signature(method)
    fields = {p.name: (Any if p.annotation is p.empty else p.annotation, ... if p.default is p.empty else p.default)
              for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}  # fmt: skip
    parameters = create_model(f"{name}_arguments", **fields).model_json_schema()
    parameters.pop("title", None)
    for argument in parameters.get("properties", {}).values():
        argument.pop("title", None)

    def call(**arguments: Any) -> str:
        result = method(**arguments)
        if inspect.isawaitable(result):
            result = asyncio.run(result)  # on the call's own thread (run_tool_call), with its own loop
        return result if isinstance(result, str) else json.dumps(result, default=str)

    described = {"name": name, "description": inspect.getdoc(method) or "", "parameters": parameters}
    call.__name__, call.__signature__ = name, signature  # type: ignore[attr-defined]
    call.json_schema = {"type": "function", "function": described}  # type: ignore[attr-defined]
    return call


def toolset_tools(toolsets: list[Any]) -> list[Callable[..., str]]:
    """Every ``@vf.tool`` method of ``toolsets``, named ``<server>_<tool>`` as verifiers' chat harness names them."""
    from verifiers.v1.utils.decorators import discover_decorated

    tools = []
    for toolset in toolsets:
        for method in discover_decorated(toolset, "tool"):
            tool = getattr(method, "tool_name", None) or method.__name__
            tools.append(tool_function(f"{toolset.server_name}_{tool}" if toolset.server_name else tool, method))
    return tools


class Seat:
    """The policy in an env's agent seat, where a ``vf.Agent`` would be: ``run(task)`` plays one segment,
    ``interaction(task)`` yields the episode's :class:`VerifiersEnvironment` (its ``turn`` and ``trace``),
    and the task scores the trace once the interaction closes."""

    trainable = True

    def __init__(self, episode: VerifiersEnvironment) -> None:
        self.episode = episode

    async def run(self, task: Any, **borrowed: Any) -> Any:
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return interaction.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **borrowed: Any):
        yield self.episode
        await task.score(self.episode.trace)


class VerifiersEnvironment(ToolEnvironment):
    """One episode of a verifiers taskset (``taskset``, built by :func:`build_taskset`), played by the policy;
    ``env``: the ``vf.Env`` class that runs it (``None``: the single-agent episode). The other arguments
    are :class:`ToolEnvironment`'s, for the toolsets' tools."""

    def __init__(self, taskset: Any, env: type | None = None, **tool_settings: Any) -> None:
        import verifiers.v1 as vf
        from verifiers.v1.configs.agent import agent_config_fields
        from verifiers.v1.utils.generic import concrete_type

        self.taskset, self.task_type = taskset, type(taskset).task_type()
        if getattr(self.task_type, "NEEDS_CONTAINER", False):
            raise ConfigError(f"environment.name: {self.task_type.__name__} needs a container, which this adapter "
                              "does not run.")  # fmt: skip
        if taskset.config.task.judges:
            raise ConfigError(f"environment.args: {type(taskset).__name__}'s task config plugs judges, which call a "
                              "model of their own; this adapter does not run them.")  # fmt: skip
        self.task_toolsets = self.task_type.toolsets(taskset.config.task)
        self.toolsets = [*self.task_toolsets, *type(taskset).toolsets(taskset.config)]
        super().__init__(toolset_tools(self.toolsets), **tool_settings)
        self.env, self.agents, self.seat = None, None, Seat(self)
        if env is not None:
            config = (concrete_type(env, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig)(taskset=taskset.config)
            seats = list(agent_config_fields(config))
            if len(seats) != 1:
                raise ConfigError(f"environment.args.env: {env.__name__} has the agent seats {seats}; the policy "
                                  "plays envs of exactly one.")  # fmt: skip
            self.env = env.__new__(env)  # its __init__ would start verifiers' serving machinery, replaced here
            self.env.config, self.env.taskset = config, taskset
            self.agents = vf.Agents(config, make=lambda name, spec: self.seat)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.trace: Any = None

    def task(self, row: dict[str, Any]) -> Any:
        """The row's task: its ``task`` column as the task's data, else its columns that are data fields."""
        data_type = self.task_type.data_type()
        if isinstance(row.get("task"), str):
            data = data_type.model_validate_json(row["task"])
        else:
            data = data_type.model_validate({k: v for k, v in row.items() if k in data_type.model_fields})
        task = self.task_type(data, self.taskset.config.task)
        needing = [fn.__name__ for fn in task.hooks("reward") if needs_runtime(fn)]
        if needing:
            raise ConfigError(f"environment.name: the rewards {needing} of {self.task_type.__name__} need a runtime "
                              "(a sandbox of the task's), which this adapter does not run.")  # fmt: skip
        stops = [fn.__name__ for fn in task.hooks("stop")]
        if stops:  # verifiers checks them before each model turn: unchecked, the episode would run on past them
            raise ConfigError(f"environment.name: {self.task_type.__name__} ends its episodes by the stop conditions "
                              f"{stops} (@vf.stop), which this adapter does not check; end them from the env or the "
                              "tools instead, or use a task without them.")  # fmt: skip
        return task if self.taskset.system_prompt is None else task.with_system_prompt(self.taskset.system_prompt)

    def reset(self, row: dict[str, Any]) -> list[Message]:
        """The task's system prompt and prompt, and the env's first user message if it opens the talk."""
        import verifiers.v1 as vf

        self.close()  # an instance reset again starts a new episode
        self.row, task = row, self.task(row)
        self.trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                              agent=vf.AgentInfo(config=vf.AgentConfig()))  # fmt: skip
        opening = [vf.SystemMessage(content=task.data.system_prompt)] if task.data.system_prompt else []
        prompt = task.data.prompt
        opening += [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or ())
        for message in opening:
            self.record(message)
        self.loop, self.segment, self.over, self.answer = asyncio.new_event_loop(), [], False, None
        with self.closing_on_error():
            self.asked = self.loop.create_future()
            self.loop.run_until_complete(self.set_up_toolsets(task))
            self.runner = self.loop.create_task(self.play(task))
            self.advance()
        return [vf_message(m) for m in opening] + self.asked_messages()

    async def set_up_toolsets(self, task: Any) -> None:
        """As verifiers sets up a rollout's tool servers: ``setup()``, and the task's ``setup_task(task)``."""
        for toolset in self.toolsets:
            await toolset.setup()
        for toolset in self.task_toolsets:
            await toolset.setup_task(task)

    async def play(self, task: Any) -> None:
        """The episode, as verifiers' ``Env.run_episode`` runs it (retries and timeouts aside)."""
        if self.env is None:
            await self.seat.run(task)
            return
        import verifiers.v1 as vf

        await self.env.setup(self.agents)
        await self.env.run(task, self.agents)
        record = vf.Episode(env=vf.EnvInfo(id=self.env.config.env_id), task=self.trace.task, traces=[self.trace])
        await self.env.finalize(task, record)

    async def turn(self, message: str | None = None) -> Any:
        """``vf.Interaction.turn``: ``message`` to the model (none: the model speaks), then the segment the
        model writes, up to its first turn without a tool call; a terminated segment once the episode is cut."""
        import verifiers.v1 as vf

        if self.over:
            return vf.Segment(messages=[], terminated=True)
        if message:
            self.record(vf.UserMessage(content=message))
        self.answer = asyncio.get_running_loop().create_future()
        self.asked.set_result(message)
        return await self.answer

    def step(self, message: Message) -> tuple[list[Message], float | None, bool]:
        """The tools' replies to the turn's calls; else, the segment over, the env's next user message,
        or the end of the episode."""
        import verifiers.v1 as vf

        if self.runner.done():  # the env ended the episode before the model's first turn
            return [], None, True
        with self.closing_on_error():
            calls = self.parse(message["content"])
            ids = [f"call_{len(self.trace.nodes)}_{n}" for n in range(len(calls))]
            tool_calls = [vf.ToolCall(id=i, name=c.name or "?", arguments=json.dumps(c.arguments))
                          for i, c in zip(ids, calls)]  # fmt: skip
            turn = vf.AssistantMessage(content=message["content"], tool_calls=tool_calls or None)
            self.segment.append(self.record(turn, sampled=True))
            if calls:
                replies, _, _ = super().step(message)
                for reply, call_id in zip(replies, ids):
                    tool_message = vf.ToolMessage(tool_call_id=call_id, name=reply["name"], content=reply["content"])
                    self.segment.append(self.record(tool_message))
                return replies, None, False
            self.asked = self.loop.create_future()
            self.answer.set_result(vf.Segment(messages=self.segment))
            self.segment = []
            self.advance()
            return self.asked_messages(), None, self.runner.done()

    def final_reward(self) -> float:
        """The trace's weighted reward once the episode is over; an episode still going (cut by
        ``max_turns`` or the token budget) is closed first, as verifiers closes one at a limit."""
        with self.closing_on_error():
            if not self.runner.done():
                import verifiers.v1 as vf

                self.over = True
                self.trace.stop("max_turns")
                if self.answer is not None and not self.answer.done():
                    self.answer.set_result(vf.Segment(messages=self.segment, terminated=True))
                self.loop.run_until_complete(self.runner)  # to its end: the rewards may await (a thread, a call)
            self.close()
            return float(self.trace.reward)

    def record(self, message: Any, sampled: bool = False) -> Any:
        """Append ``message`` to the trace (``sampled``: the model wrote it)."""
        from verifiers.v1.graph import MessageNode

        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))
        return message

    def advance(self) -> None:
        """Run the episode until it asks for the model's turn or is over (its exception raised here)."""
        self.loop.run_until_complete(asyncio.wait({self.runner, self.asked}, return_when=asyncio.FIRST_COMPLETED))
        if self.runner.done():
            self.runner.result()

    def asked_messages(self) -> list[Message]:
        message = self.asked.result() if self.asked.done() else None
        return [{"role": "user", "content": message}] if message else []

    @contextlib.contextmanager
    def closing_on_error(self):
        """An exception ends the episode (counted by the rollout): its event loop is closed first."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        loop, self.loop = self.loop, None
        if loop is None or loop.is_closed():
            return

        async def cancelled() -> None:
            pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        loop.run_until_complete(cancelled())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def verifiers_environment(factory: type, args: dict[str, Any], name: str) -> VerifiersEnvironment:
    """A new episode of the taskset class ``factory``, its config and the adapter's settings from ``args``."""
    env = args["env"] if "env" in args else exported_env(factory)  # env: null plays the taskset single-agent
    env = import_object(env, "environment.args.env") if isinstance(env, str) else env
    settings = {key: args[key] for key in ADAPTER_ARGS if key in args and key != "env"}
    return VerifiersEnvironment(build_taskset(factory, args), env, **settings)
