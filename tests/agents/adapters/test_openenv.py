"""OpenEnv environments run unchanged: detected by their base class, stepped in process (an
``Environment``) or over a client's session (an ``EnvClient``), a turn read as the action, the
observation's reward and done taken as they are."""

from __future__ import annotations

import inspect
import json
from uuid import uuid4

import pytest

pytest.importorskip("openenv.core", reason="the openenv extra: pip install 'grpo-lightning[openenv]'")

from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402
from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from grpo_lightning.agents import EnvironmentOptions  # noqa: E402
from grpo_lightning.agents.adapters.openenv import OpenEnvEnvironment, follows_openenv_contract, parse_action  # noqa: E402
from grpo_lightning.errors import ConfigError  # noqa: E402

HERE = __name__


# ------------------------------------------------------------------ models and servers, in OpenEnv's documented style


class GuessAction(Action):
    """Guess the secret number."""

    guess: int


class GuessObservation(Observation):
    feedback: str


class GuessEnvironment(Environment):
    """A secret from 0 to 9, the reset's seed modulo 10. Each guess is answered ``higher``, ``lower`` or
    ``correct``; a right guess at the k-th try ends the episode with reward 1 / k, ``max_guesses`` wrong
    ones with reward 0."""

    def __init__(self, max_guesses: int = 4):
        super().__init__()
        self.max_guesses, self.secret = max_guesses, 0
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self.secret = (seed or 0) % 10
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(feedback="Guess a number from 0 to 9.")

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.secret:
            return GuessObservation(feedback="correct", done=True, reward=1.0 / self._state.step_count)
        done = self._state.step_count >= self.max_guesses
        return GuessObservation(feedback="higher" if action.guess < self.secret else "lower", done=done, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str
    message_length: int


class EchoEnvironment(Environment[EchoAction, EchoObservation, State]):
    """OpenEnv's echo example: every step is rewarded 0.1 per character and never ends the episode."""

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> EchoObservation:
        return EchoObservation(echoed_message="", message_length=0)

    def step(self, action, timeout_s=None, **kwargs) -> EchoObservation:
        self._state.step_count += 1
        length = len(action.message)
        return EchoObservation(echoed_message=action.message, message_length=length, reward=0.1 * length)

    @property
    def state(self) -> State:
        return self._state


class GuessClient(EnvClient[GuessAction, GuessObservation, State]):
    """The typed client of GuessEnvironment's server, as OpenEnv's environments write their client.py."""

    def _step_payload(self, action: GuessAction) -> dict:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict) -> StepResult[GuessObservation]:
        observation = GuessObservation(**payload["observation"], done=payload["done"], reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload["done"])

    def _parse_state(self, payload: dict) -> State:
        return State(**payload)


ASYNCHRONOUS = inspect.iscoroutinefunction(EnvClient.reset)  # openenv-core 0.3's clients are


class InProcessSession:
    """The server app's websocket in this process (Starlette's test client), where a client keeps its
    connection: the real server and the real client protocol, without a socket."""

    def __init__(self) -> None:
        from starlette.testclient import TestClient

        self.context = TestClient(create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation)).websocket_connect("/ws")
        self.websocket = self.context.__enter__()
        self.closed = False

    def send_now(self, text: str) -> None:
        self.websocket.send_text(text)

    def recv_now(self) -> str:
        return self.websocket.receive_text()

    def close_now(self) -> None:
        self.closed = True
        self.context.__exit__(None, None, None)

    if ASYNCHRONOUS:

        async def send(self, text: str) -> None:
            self.send_now(text)

        async def recv(self, timeout: float | None = None) -> str:
            return self.recv_now()

        async def close(self) -> None:
            self.close_now()

    else:

        def send(self, text: str) -> None:
            self.send_now(text)

        def recv(self, timeout: float | None = None) -> str:
            return self.recv_now()

        def close(self) -> None:
            self.close_now()


class InProcessGuessClient(GuessClient):
    """GuessClient connected to the server app in this process rather than at ``base_url``."""

    sessions: list[InProcessSession] = []

    if ASYNCHRONOUS:

        async def connect(self):
            return self.connect_now()

    else:

        def connect(self):
            return self.connect_now()

    def connect_now(self):
        if self._ws is None:
            self._ws = InProcessSession()
            self.sessions.append(self._ws)
        return self


def turn(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_environments_and_clients_are_told_apart_from_this_librarys_and_trls():
    assert follows_openenv_contract(GuessEnvironment) and follows_openenv_contract(GuessClient)
    assert not follows_openenv_contract(GuessAction) and not follows_openenv_contract(object)
    made = EnvironmentOptions.of({"name": f"{HERE}.GuessEnvironment", "args": {"max_guesses": 2}}).make()
    assert isinstance(made, OpenEnvEnvironment) and made.in_process and made.openenv.max_guesses == 2
    assert made.action is GuessAction  # from step's annotation
    assert OpenEnvEnvironment(EchoEnvironment()).action is EchoAction  # from the type arguments


def test_a_turn_is_the_action_as_json_or_as_its_one_required_field():
    assert parse_action("7", GuessAction) == GuessAction(guess=7)
    assert parse_action('{"guess": 7}', GuessAction) == GuessAction(guess=7)
    assert parse_action('```json\n{"guess": 2}\n```', GuessAction) == GuessAction(guess=2)
    assert parse_action("hello there", EchoAction) == EchoAction(message="hello there")
    assert parse_action('{"code": "x = 1"}', None) == {"code": "x = 1"}  # GenericEnvClient: dicts
    with pytest.raises(ValueError, match="reply with the action as a JSON object"):
        parse_action("hi", None)


def test_an_episode_steps_the_environment_in_process_and_takes_its_rewards():
    environment = EnvironmentOptions.of({"name": f"{HERE}.GuessEnvironment"}).make()
    opening = environment.reset({"prompt": "Play.", "seed": 13, "answer": "3"})
    assert opening == [{"role": "user", "content": "Play.\n\nGuess a number from 0 to 9."}]
    assert environment.openenv.secret == 3  # reset got the row's seed
    assert environment.step(turn("5")) == ([{"role": "user", "content": "lower"}], 0.0, False)
    assert environment.step(turn('{"guess": 1}')) == ([{"role": "user", "content": "higher"}], 0.0, False)
    assert environment.step(turn("3")) == ([], pytest.approx(1 / 3), True)
    assert environment.final_reward() is None and environment.closed


def test_a_turn_that_is_no_action_is_answered_and_counted_and_the_episode_goes_on():
    environment = OpenEnvEnvironment(GuessEnvironment())
    environment.reset({"prompt": "Play."})
    replies, reward, done = environment.step(turn("three"))
    assert (reward, done) == (None, False) and replies[0]["content"].startswith("Error: 1 validation error for GuessAction")
    replies, _, _ = environment.step(turn('{"guess": [[[['))
    assert replies == [{"role": "user", "content": "Error: the action is not valid JSON (Expecting value)."}]
    assert environment.tool_errors == {"bad_arguments": 1, "bad_call": 1}
    assert environment.openenv.state.step_count == 0  # neither reached the environment


def test_an_observation_of_several_fields_is_shown_as_json_and_every_steps_reward_counts():
    environment = OpenEnvEnvironment(EchoEnvironment())
    opening = environment.reset({"prompt": [{"role": "system", "content": "Echo."}]})
    assert opening == [{"role": "system", "content": "Echo."},
                       {"role": "user", "content": '{"echoed_message": "", "message_length": 0}'}]  # fmt: skip
    replies, reward, done = environment.step(turn("abcd"))
    assert json.loads(replies[0]["content"]) == {"echoed_message": "abcd", "message_length": 4}
    assert (reward, done) == (pytest.approx(0.4), False)


def test_the_adapters_settings_and_the_environments_arguments_share_args():
    def shout(observation) -> str:
        return observation.feedback.upper()

    options = {"name": f"{HERE}.GuessEnvironment", "args": {"max_guesses": 1, "observation_format": shout,
                                                            "reset_columns": ["level"]}}  # fmt: skip
    environment = EnvironmentOptions.of(options).make()
    opening = environment.reset({"prompt": "Go.", "seed": 5, "level": None})
    assert opening == [{"role": "user", "content": "Go.\n\nGUESS A NUMBER FROM 0 TO 9."}]
    assert environment.openenv.secret == 0  # seed is not among reset_columns
    assert environment.step(turn("4")) == ([], 0.0, True)  # one guess at most
    with pytest.raises(ConfigError, match=r"^environment.args: .*GuessEnvironment refuses them .*unexpected keyword"):
        EnvironmentOptions.of({"name": f"{HERE}.GuessEnvironment", "args": {"difficulty": 3}})


def test_a_client_steps_its_servers_session_and_closes_it_after_the_episode():
    InProcessGuessClient.sessions.clear()
    environment = EnvironmentOptions.of({"name": f"{HERE}.InProcessGuessClient", "args": {"base_url": "http://env:8000"}}).make()
    assert not environment.in_process and environment.action is GuessAction
    opening = environment.reset({"prompt": "Play.", "seed": 7})
    assert opening == [{"role": "user", "content": "Play.\n\nGuess a number from 0 to 9."}]
    assert environment.step(turn("9")) == ([{"role": "user", "content": "lower"}], 0.0, False)
    assert environment.step(turn("7")) == ([], 0.5, True)
    environment.final_reward()
    assert [session.closed for session in InProcessGuessClient.sessions] == [True]


class CalculatorMCPEnvironment(MCPEnvironment):
    """An MCP environment, in the style of OpenEnv's MCPEnvironment docstring: its actions call its tools."""

    def __init__(self):
        from fastmcp import FastMCP

        server = FastMCP("calculator")

        @server.tool()
        def add(a: int, b: int) -> int:
            return a + b

        super().__init__(server)

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:
        return Observation()

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return State()


def test_an_mcp_environment_is_refused_naming_why():
    with pytest.raises(ConfigError, match=r"^environment.name: CalculatorMCPEnvironment is an MCP environment"):
        EnvironmentOptions.of({"name": f"{HERE}.CalculatorMCPEnvironment"})


def test_a_rubric_sets_the_observations_reward():
    rubrics = pytest.importorskip("openenv.core.rubrics", reason="rubrics came with openenv-core 0.3")

    class ExactGuess(rubrics.Rubric):
        def forward(self, action, observation) -> float:
            return 1.0 if observation.feedback == "correct" else -0.1

    class RubricGuessEnvironment(GuessEnvironment):
        def __init__(self):
            super().__init__()
            self.rubric = ExactGuess()

        def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
            observation = super().step(action)
            observation.reward = self._apply_rubric(action, observation)
            return observation

    environment = OpenEnvEnvironment(RubricGuessEnvironment())
    environment.reset({"prompt": "Play.", "seed": 2})
    assert environment.step(turn("8"))[1] == -0.1
    assert environment.step(turn("2"))[1:] == (1.0, True)


def test_a_tiny_model_fits_an_openenv_game_through_the_command_line(tiny_model_dir, tmp_path, one_torch_thread):
    from grpo_lightning.cli.app import GRPOLightningCLI
    from grpo_lightning.cli.resources import config_dir

    configs = config_dir()
    args = [
        "--config", str(configs / "trainer/cpu.yaml"), "--config", str(configs / "data/arithmetic.yaml"),
        "--config", str(configs / "variant/grpo.yaml"),
        "--model.model", tiny_model_dir, "--model.sampling.group_size", "2", "--model.sampling.max_new_tokens", "4",
        "--model.environment.name", f"{HERE}.GuessEnvironment", "--model.environment.max_turns", "3",
        "--model.environment.max_tokens", "24", "--model.rewards.funcs", "[grpo_lightning.agents.environment_reward]",
        "--data.batch_size", "2", "--data.num_train", "4", "--data.num_val", "2", "--data.val_batch_size", "2",
        "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_checkpointing", "false", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.callbacks", "[]",
    ]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 1
    logged = cli.model.last_step_metrics
    assert 1 <= logged["agent/turns"] <= 3 and logged["agent/environment_errors"] == 0
    assert 0.0 <= logged["agent/environment_reward"] <= 1.0
