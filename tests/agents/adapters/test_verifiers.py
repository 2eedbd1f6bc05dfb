"""verifiers tasksets (the ``verifiers.v1`` API) run unchanged: detected by their base class, a row is a
task, the task's ``@vf.reward`` functions score the trace, toolsets' tools run in process, and an env
whose engine plays the user runs turn by turn."""

from __future__ import annotations

import asyncio
import json

import pytest

vf = pytest.importorskip("verifiers.v1", reason="the verifiers extra: pip install 'grpo-lightning[verifiers]'")

from grpo_lightning.agents import EnvironmentOptions  # noqa: E402
from grpo_lightning.agents.adapters.verifiers import VerifiersEnvironment, build_taskset, follows_verifiers_contract  # noqa: E402
from grpo_lightning.agents.adapters.verifiers_data import TasksetDataModule, task_row  # noqa: E402
from grpo_lightning.errors import ConfigError  # noqa: E402

HERE = __name__
# The module that exports a taskset exports its env too: verifiers pairs them so (GuessEnv plays GuessTaskset).
__all__ = ["GuessEnv", "GuessTaskset"]


# ------------------------------------------------------------------ a single-turn taskset, as vf-init writes one


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= len(self.data.answer))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class ReverseConfig(vf.TasksetConfig):
    num_tasks: int = 3
    """How many tasks to build."""


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self) -> list[ReverseTask]:
        words = ["12", "345", "6789", "10"][: self.config.num_tasks]
        return [ReverseTask(ReverseData(prompt=word, answer=word[::-1], system_prompt="Reverse it."), self.config.task)
                for word in words]  # fmt: skip


# ------------------------------------------------------------------ a taskset with a toolset (vf-init -T)


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @vf.tool(name="negate")
    async def minus(self, x: int) -> str:
        """Negate an integer."""
        return str(-x)


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.answer))


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self) -> list[SumTask]:
        return [SumTask(SumData(prompt="2+3=", answer=5), self.config.task)]


# ------------------------------------------------------------------ a game whose engine plays the user (TextArenaEnv's style)


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    pass


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for secret in (3, 7):
            yield GuessTask(GuessData(prompt="(0,9)=", secret=secret), self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """Each reply is a guess; the engine answers ``+`` (higher), ``-`` (lower) or ``?`` (not a number).
    A right guess at the k-th try scores 1 / k."""

    async def run(self, task, agents):
        guesses, won = 0, False
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guesses += 1
                guess = segment.last_reply
                if guess == str(task.data.secret):
                    won = True
                    break
                hint = "?" if not guess.isdigit() else "+" if int(guess) < task.data.secret else "-"
                segment = await interaction.turn(hint)
        interaction.trace.record_reward("won", 1.0 / guesses if won else 0.0)
        interaction.trace.record_metric("guesses", guesses)


def row_of(taskset: type, index: int = 0, **config) -> dict:
    """The row TasksetDataModule makes of the taskset's ``index``-th task."""
    return task_row(list(build_taskset(taskset, config))[index])


def turn(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_a_taskset_class_is_told_apart_from_this_librarys_environments():
    assert follows_verifiers_contract(ReverseTaskset) and not follows_verifiers_contract(ReverseTask)
    environment = EnvironmentOptions.of({"name": f"{HERE}.ReverseTaskset", "args": {"num_tasks": 2}}).make()
    assert isinstance(environment, VerifiersEnvironment) and environment.taskset.config.num_tasks == 2
    assert environment.env is None and environment.tools == []


def test_args_are_the_taskset_configs_fields_and_the_adapters_settings():
    environment = EnvironmentOptions.of({"name": f"{HERE}.SumTaskset", "args": {"max_tool_calls": 1}}).make()
    assert environment.max_tool_calls == 1
    with pytest.raises(ConfigError, match=r"^environment.args: ReverseTaskset refuses them as fields of ReverseConfig"):
        EnvironmentOptions.of({"name": f"{HERE}.ReverseTaskset", "args": {"num_taks": 2}})


def test_a_single_turn_episode_is_scored_by_the_tasks_weighted_rewards():
    environment = EnvironmentOptions.of({"name": f"{HERE}.ReverseTaskset"}).make()
    opening = environment.reset(row_of(ReverseTaskset, 1))
    assert opening == [{"role": "system", "content": "Reverse it."}, {"role": "user", "content": "345"}]
    assert environment.step(turn("543")) == ([], None, True)
    assert environment.final_reward() == 1.5  # exact (1.0 x 1) + short (1.0 x 0.5)
    assert environment.trace.metrics == {"turns": 1.0}
    assert [node.message.role for node in environment.trace.nodes] == ["system", "user", "assistant"]

    environment.reset(row_of(ReverseTaskset, 1))
    environment.step(turn("5432"))
    assert environment.final_reward() == 0.0  # wrong, and longer than the answer


def test_a_row_without_a_task_column_gives_the_tasks_data_fields():
    environment = EnvironmentOptions.of({"name": f"{HERE}.ReverseTaskset"}).make()
    assert environment.reset({"prompt": "12", "answer": "21", "difficulty": 3}) == [{"role": "user", "content": "12"}]
    environment.step(turn("21"))
    assert environment.final_reward() == 1.5


def test_toolsets_tools_run_in_process_under_verifiers_names_and_schemas():
    environment = EnvironmentOptions.of({"name": f"{HERE}.SumTaskset"}).make()
    assert [tool.__name__ for tool in environment.tools] == ["calc_add", "calc_negate"]
    add = environment.tools[0].json_schema["function"]
    assert add["description"] == "Add two integers."
    assert add["parameters"] == {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                 "required": ["a", "b"]}  # fmt: skip
    environment.reset(row_of(SumTaskset))
    call = '<tool_call>{"name": "calc_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    call += '<tool_call>{"name": "calc_negate", "arguments": {"x": 5}}</tool_call>'
    replies, reward, done = environment.step(turn(call))
    assert (replies, reward, done) == ([{"role": "tool", "name": "calc_add", "content": "5"},
                                        {"role": "tool", "name": "calc_negate", "content": "-5"}], None, False)  # fmt: skip
    assert environment.step(turn("5")) == ([], None, True)
    assert environment.final_reward() == 1.0
    assert [m.content for m in environment.trace.tool_messages] == ["5", "-5"]
    assert [c.name for c in environment.trace.assistant_messages[0].tool_calls] == ["calc_add", "calc_negate"]


def test_the_env_a_taskset_package_exports_plays_the_user_turn_by_turn():
    environment = EnvironmentOptions.of({"name": f"{HERE}.GuessTaskset", "max_turns": 4}).make()
    assert environment.env.__class__ is GuessEnv
    assert environment.reset(row_of(GuessTaskset, 0)) == [{"role": "user", "content": "(0,9)="}]
    assert environment.step(turn("5")) == ([{"role": "user", "content": "-"}], None, False)
    assert environment.step(turn("x")) == ([{"role": "user", "content": "?"}], None, False)
    assert environment.step(turn("3")) == ([], None, True)
    assert environment.final_reward() == pytest.approx(1 / 3)
    assert environment.trace.metrics == {"guesses": 3.0}
    assert [n.message.role for n in environment.trace.nodes] == ["user", "assistant", "user", "assistant", "user", "assistant"]


def test_an_episode_cut_by_max_turns_ends_as_verifiers_ends_one_at_a_limit():
    environment = EnvironmentOptions.of({"name": f"{HERE}.GuessTaskset", "args": {"env": f"{HERE}.GuessEnv"}}).make()
    environment.reset(row_of(GuessTaskset, 1))
    environment.step(turn("1"))
    assert environment.final_reward() == 0.0
    assert environment.trace.stop_condition == "max_turns" and environment.trace.metrics == {"guesses": 1.0}
    assert environment.loop is None  # the episode's event loop is closed


class SlowlyScoredTask(SumTask):
    @vf.reward
    async def scored_in_a_thread(self, trace: vf.Trace) -> float:
        return await asyncio.to_thread(lambda: 1.0)  # a reward that awaits real work (a thread, a service)


class SlowlyScoredTaskset(vf.Taskset[SlowlyScoredTask, vf.TasksetConfig]):
    def load(self) -> list[SlowlyScoredTask]:
        return [SlowlyScoredTask(SumData(prompt="2+3=", answer=5), self.config.task)]


def test_an_episode_cut_while_a_tool_call_waits_is_scored_by_rewards_that_await():
    """Cut on the model's turn: its scoring awaits a thread. It was cancelled half way, and the unscored
    rewards (None) counted 0."""
    environment = EnvironmentOptions.of({"name": f"{HERE}.SlowlyScoredTaskset"}).make()
    environment.reset(row_of(SlowlyScoredTaskset))
    name = environment.tools[0].__name__
    environment.step(turn('<tool_call>{"name": "%s", "arguments": {"a": 2, "b": 3}}</tool_call>' % name))
    assert environment.final_reward() == 1.0  # correct: 0 (no reply yet), scored_in_a_thread: 1
    assert environment.trace.stop_condition == "max_turns" and environment.loop is None


class SubmitStopTask(SumTask):
    @vf.stop
    async def submitted(self, trace: vf.Trace) -> bool:
        return len(trace.tool_messages) >= 1


class SubmitStopTaskset(vf.Taskset[SubmitStopTask, vf.TasksetConfig]):
    def load(self) -> list[SubmitStopTask]:
        return [SubmitStopTask(SumData(prompt="2+3=", answer=5), self.config.task)]


def test_a_task_that_ends_its_episodes_by_stop_conditions_is_refused_naming_them():
    """verifiers checks @vf.stop before each model turn; unchecked, the model would go on past it."""
    environment = EnvironmentOptions.of({"name": f"{HERE}.SubmitStopTaskset"}).make()
    with pytest.raises(ConfigError, match=r"SubmitStopTask ends its episodes by the stop conditions \['submitted'\]"):
        environment.reset(row_of(SubmitStopTaskset))


class CrashingEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            await interaction.turn()
            raise RuntimeError("the engine crashed")


def test_an_env_that_raises_fails_its_episode_and_closes_its_loop():
    environment = EnvironmentOptions.of({"name": f"{HERE}.GuessTaskset", "args": {"env": f"{HERE}.CrashingEnv"}}).make()
    with pytest.raises(ValueError, match="secret"):
        environment.reset({"prompt": "(0,9)="})  # no secret: the row is no task of this taskset
    environment.reset(row_of(GuessTaskset, 0))
    with pytest.raises(RuntimeError, match="the engine crashed"):
        environment.step(turn("5"))  # the rollout counts the failed episode (tests/agents/test_multi_turn.py)
    assert environment.loop is None


class SandboxTask(vf.Task[ReverseData]):
    @vf.reward
    async def tests_pass(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return 1.0


class SandboxTaskset(vf.Taskset[SandboxTask, vf.TasksetConfig]):
    def load(self) -> list[SandboxTask]:
        return [SandboxTask(ReverseData(prompt="12", answer="21"), self.config.task)]


def test_what_needs_verifiers_serving_machinery_is_refused_naming_it():
    environment = EnvironmentOptions.of({"name": f"{HERE}.SandboxTaskset"}).make()
    with pytest.raises(ConfigError, match=r"^environment.name: the rewards \['tests_pass'\] of SandboxTask need a runtime"):
        environment.reset(row_of(SandboxTaskset))
    judged = {"name": f"{HERE}.ReverseTaskset", "args": {"task": {"judges": [{"id": "reference"}]}}}
    with pytest.raises(ConfigError, match=r"^environment.args: ReverseTaskset's task config plugs judges"):
        EnvironmentOptions.of(judged)


def test_the_data_module_rows_are_the_tasks_and_rebuild_them():
    data = TasksetDataModule(f"{HERE}.ReverseTaskset", args={"num_tasks": 4}, num_val=1, batch_size=2)
    data.setup("fit")
    assert data.train_dataset["prompt"] == ["12", "345", "6789"] and data.val_dataset["prompt"] == ["10"]
    task = json.loads(data.train_dataset[1]["task"])
    assert (task["idx"], task["answer"], task["system_prompt"]) == (1, "543", "Reverse it.")
    infinite = TasksetDataModule(f"{HERE}.GuessTaskset", num_train=2, batch_size=2)
    infinite.setup("fit")
    assert [json.loads(t)["secret"] for t in infinite.train_dataset["task"]] == [3, 7]


def test_a_tiny_model_fits_a_verifiers_game_through_the_command_line(tiny_model_dir, tmp_path, one_torch_thread):
    from grpo_lightning.cli.app import GRPOLightningCLI
    from grpo_lightning.cli.resources import config_dir

    configs = config_dir()
    args = [
        "--config", str(configs / "trainer/cpu.yaml"), "--config", str(configs / "variant/grpo.yaml"),
        "--model.model", tiny_model_dir, "--model.sampling.group_size", "2", "--model.sampling.max_new_tokens", "4",
        "--model.environment.name", f"{HERE}.GuessTaskset", "--model.environment.max_turns", "3",
        "--model.environment.max_tokens", "24", "--model.rewards.funcs", "[grpo_lightning.agents.environment_reward]",
        "--data.class_path", "grpo_lightning.agents.adapters.verifiers_data.TasksetDataModule",
        "--data.init_args.taskset", f"{HERE}.GuessTaskset", "--data.init_args.num_train", "2",
        "--data.init_args.batch_size", "2",
        "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
        "--trainer.callbacks", "[]",
    ]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 1
    logged = cli.model.last_step_metrics
    assert 1 <= logged["agent/turns"] <= 3 and logged["agent/environment_errors"] == 0
    assert 0.0 <= logged["agent/environment_reward"] <= 1.0
