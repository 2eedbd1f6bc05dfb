"""Environments written for TRL's ``environment_factory`` run unchanged: detected by their ``reset``,
public methods as tools, ``get_reward()`` after the episode, ``environments`` for TRL-style reward
functions, and a dict of environments that each row picks from."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.agents import EnvironmentOptions, ToolCall
from grpo_lightning.agents.adapters.trl import TRLEnvironment, follows_trl_contract
from grpo_lightning.agents.multi_turn import sample_episodes
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO

HERE = __name__


class CounterEnv:
    """TRL's documented style: count up to the row's ``target`` with the ``increment`` tool."""

    def __init__(self):
        self.count, self.target, self.reward = 0, 0, 0.0

    def reset(self, **kwargs) -> str | None:
        self.count, self.target = 0, int(kwargs["target"])
        return f"Count to {self.target}."

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add, at most 3.

        Returns:
            The count.
        """
        if step > 3:
            raise ValueError("at most 3 at a time")
        self.count += step
        self.reward = float(self.count)
        return str(self.count)

    def get_reward(self) -> float:
        return float(self.count == self.target)

    def _helper(self) -> None:
        """Private: not a tool."""


class EchoEnv:
    """TRL's style without a reward of its own; ``step`` here is one of its tools."""

    def reset(self, **kwargs) -> None:
        self.said = []

    def step(self, message: str) -> str:
        """Say something.

        Args:
            message: What to say.
        """
        self.said.append(message)
        return message


class OwnEnvironment:
    """This library's protocol: ``reset(row)`` and ``step(message)``."""

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, message):
        return [], 1.0, True


def always_increment(text: str) -> list[ToolCall]:
    """A call format for the tiny model: every turn calls ``increment(step=1)``."""
    return [ToolCall("increment", {"step": 1})]


def counter_reward(environments, **kwargs) -> list[float]:
    """A reward function as TRL's documentation writes them."""
    return [env.reward if isinstance(env, CounterEnv) else 0.0 for env in environments]


def test_a_class_with_a_keyword_reset_or_without_step_is_trl_style():
    assert follows_trl_contract(CounterEnv) and follows_trl_contract(EchoEnv)  # EchoEnv's step is a tool
    assert not follows_trl_contract(OwnEnvironment) and not follows_trl_contract(object)
    made = EnvironmentOptions.of({"name": f"{HERE}.CounterEnv"}).make({"prompt": "p", "target": 2})
    assert isinstance(made, TRLEnvironment) and [tool.__name__ for tool in made.tools] == ["increment"]
    assert [tool.__name__ for tool in TRLEnvironment(EchoEnv()).tools] == ["step"]
    assert isinstance(EnvironmentOptions.of({"name": f"{HERE}.OwnEnvironment"}).make({"prompt": "p"}), OwnEnvironment)


def test_reset_gets_the_rows_columns_and_its_observation_follows_the_prompt():
    environment = TRLEnvironment(CounterEnv())
    messages = environment.reset({"prompt": "Use the tools.", "target": 2})
    assert messages == [{"role": "user", "content": "Use the tools.\n\nCount to 2."}]
    assert environment.trl_environment.target == 2
    assert TRLEnvironment(EchoEnv()).reset({"prompt": [{"role": "user", "content": "hi"}]}) == [
        {"role": "user", "content": "hi"}]  # fmt: skip


def test_a_tool_call_runs_the_method_and_one_that_raises_is_answered_with_its_error():
    environment = TRLEnvironment(CounterEnv())
    environment.reset({"prompt": "p", "target": 2})
    call = '<tool_call>{"name": "increment", "arguments": {"step": %d}}</tool_call>'
    replies, reward, done = environment.step({"role": "assistant", "content": call % 2})
    assert (replies, reward, done) == ([{"role": "tool", "name": "increment", "content": "2"}], None, False)
    replies, _, _ = environment.step({"role": "assistant", "content": call % 5})
    assert replies[0]["content"] == "Error: increment raised ValueError: at most 3 at a time"
    assert environment.tool_errors == {"tool_exception": 1}
    assert environment.step({"role": "assistant", "content": "done"}) == ([], None, True)
    assert environment.final_reward() == 1.0  # get_reward(): the count reached the target
    assert TRLEnvironment(EchoEnv()).final_reward() is None  # no reward of its own


def test_each_row_picks_its_environment_from_a_dict_and_sees_its_tools_only():
    options = EnvironmentOptions.of({"name": {"counter": f"{HERE}.CounterEnv", "echo": f"{HERE}.EchoEnv"}})
    counter = options.make({"prompt": "p", "target": 1, "environment": "counter"})
    echo = options.make({"prompt": "p", "environment": "echo"})
    assert isinstance(counter.trl_environment, CounterEnv) and isinstance(echo.trl_environment, EchoEnv)
    assert [t.__name__ for t in counter.tools] == ["increment"] and [t.__name__ for t in echo.tools] == ["step"]
    with pytest.raises(ConfigError, match=r"^environment.name: .*'environment' column is 'chess'"):
        options.make({"prompt": "p", "environment": "chess"})


def test_args_are_the_adapters_settings_as_trl_builds_the_class_without_any():
    options = EnvironmentOptions.of({"name": f"{HERE}.CounterEnv", "args": {"max_tool_calls": 1}})
    assert options.make({"prompt": "p", "target": 1}).max_tool_calls == 1
    with pytest.raises(ConfigError, match=r"^environment.args: .* not url"):
        EnvironmentOptions.of({"name": f"{HERE}.CounterEnv", "args": {"url": "http://x"}})


def test_a_tiny_model_plays_episodes_of_both_environments_and_trl_rewards_read_them(make_module, one_torch_thread):
    names = {"counter": f"{HERE}.CounterEnv", "echo": f"{HERE}.EchoEnv"}
    environment = {"name": names, "args": {"tool_call_format": f"{HERE}.always_increment"}, "max_turns": 3}
    module = make_module(GRPO, environment=environment, rewards={"funcs": [counter_reward]}, sampling={"group_size": 2})
    head = module.policy.get_output_embeddings()
    certain_end = torch.nn.Linear(head.in_features, head.out_features, bias=True)  # every turn is EOS alone
    with torch.no_grad():
        certain_end.weight.zero_()
        certain_end.bias.zero_()
        certain_end.bias[module.tokenizer.eos_token_id] = 20.0
    module.policy.set_output_embeddings(certain_end)
    batch = {"prompt": ["Count.", "Talk."], "environment": ["counter", "echo"], "target": [3, 0]}
    rollout = sample_episodes(module.policy, module.tokenizer, batch, 2, module.sampling, module.environment)
    module.score(rollout)
    instances = rollout.columns["environments"]
    assert [type(env) for env in instances] == [CounterEnv, CounterEnv, EchoEnv, EchoEnv]
    assert [env.count for env in instances[:2]] == [3, 3]  # three turns, each a call of increment
    assert rollout.columns["environment_reward"] == [1.0, 1.0, 0.0, 0.0]  # get_reward() after the episode
    assert rollout.columns["tool_errors"][2:] == [{"unknown_tool": 3}] * 2  # echo has no increment
    assert rollout.rewards.tolist() == [3.0, 3.0, 0.0, 0.0]  # counter_reward read env.reward


def test_the_command_line_takes_a_dict_of_environments():
    import contextlib
    import io

    import yaml

    from grpo_lightning.cli.app import main

    names = f"{{counter: {HERE}.CounterEnv, echo: {HERE}.EchoEnv}}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as exited:
        main(["fit", "--config", "trainer/cpu", "--config", "data/arithmetic", "--config", "variant/grpo", "--model.model",
              "m", "--model.environment.name", names, "--print_config"], report_errors=True)  # fmt: skip
    assert exited.value.code == 0
    environment = yaml.safe_load(out.getvalue())["model"]["init_args"]["environment"]
    assert environment["name"] == {"counter": f"{HERE}.CounterEnv", "echo": f"{HERE}.EchoEnv"}
