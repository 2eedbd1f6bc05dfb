"""Reward functions contained: a function that raises, returns NaN/inf or runs past its timeout
stops the fit with an error naming it and the sample (``on_error: raise``), scores 0
(``zero``) or leaves its group out of the update (``skip_group``); async functions are awaited
together; worker processes score as the trainer's process does, in order."""

from __future__ import annotations

import asyncio
import importlib
import math
import os
import re
import signal
import sys
import textwrap
import threading
import time
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.errors import ConfigError
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.rewards import (
    RewardExecution,
    RewardFunctionError,
    RewardFunctionWarning,
    RewardScorer,
    score_completions,
)
from tests.helpers import fit, make_module

COMPLETIONS = ["a", "", "abcd", "ab"]
PROMPTS = ["p0", "p1", "p2", "p3"]


def inverse_length(prompts, completions, **columns):
    """1 / len: raises ZeroDivisionError on the empty completion (sample 1)."""
    return [1.0 / len(c) for c in completions]


def nan_when_long(prompts, completions, **columns):
    """len, but NaN past 3 characters (sample 2)."""
    return [math.nan if len(c) > 3 else float(len(c)) for c in completions]


def inf_when_long(prompts, completions, **columns):
    return [math.inf if len(c) > 3 else float(len(c)) for c in completions]


def score(functions, on_error="raise", completions=COMPLETIONS, group_index=None, **options):
    scorer = RewardScorer(RewardExecution(on_error=on_error, **options))
    try:
        return scorer.score(functions, PROMPTS[: len(completions)], completions, {}, group_index)
    finally:
        scorer.close()


# ---------------------------------------------------------------- the three policies


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (inverse_length, r"'inverse_length' raised ZeroDivisionError: .* at sample 1; prompt='p1', completion=''"),
        (nan_when_long, r"'nan_when_long' returned nan for sample 2; prompt='p2', completion='abcd'; expected"),
        (inf_when_long, r"'inf_when_long' returned inf for sample 2; prompt='p2'"),
    ],
    ids=["raises", "nan", "inf"],
)
def test_raise_names_the_function_and_the_failing_sample(function, expected):
    with pytest.raises(RewardFunctionError, match=expected):
        score([(function.__name__, function)])


def test_zero_scores_each_failing_sample_0_for_that_function_only():
    functions = [("inverse_length", inverse_length), ("nan_when_long", nan_when_long)]
    with pytest.warns(RewardFunctionWarning) as caught:
        scores = score(functions, "zero")
    expected = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.25, 0.0], [0.5, 2.0]])
    assert torch.equal(scores.per_function, expected)
    assert scores.failed.tolist() == [[False, False], [True, False], [False, True], [False, False]]
    messages = [str(w.message) for w in caught if w.category is RewardFunctionWarning]
    assert "'inverse_length' raised ZeroDivisionError" in messages[0] and "sample 1" in messages[0]
    assert "'nan_when_long' returned nan for sample 2" in messages[1]
    assert "rewards/nan_when_long/error_rate" in messages[1]


def test_each_function_warns_once_then_only_counts():
    scorer = RewardScorer(RewardExecution(on_error="zero"))
    with pytest.warns(RewardFunctionWarning):
        scorer.score([("inverse_length", inverse_length)], PROMPTS, COMPLETIONS, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = scorer.score([("inverse_length", inverse_length)], PROMPTS, COMPLETIONS, {})
    assert scores.failed[:, 0].tolist() == [False, True, False, False]


def group_relative_length(prompts, completions, group_index):
    """len minus its group's mean len; raises on a batch holding "bad"."""
    if "bad" in completions:
        raise ValueError("cannot score 'bad'")
    lengths = [len(c) for c in completions]
    means = {g: sum(n for n, h in zip(lengths, group_index) if h == g) / group_index.count(g) for g in group_index}
    return [n - means[g] for n, g in zip(lengths, group_index)]


def test_a_group_aware_function_is_retried_per_group_so_its_scores_stay_those_of_the_group():
    with pytest.warns(RewardFunctionWarning, match="at the group of samples 0-1"):
        scores = score([("relative", group_relative_length)], "zero", ["a", "bad", "bb", "bbbb"], [0, 0, 1, 1])
    assert scores.per_function[:, 0].tolist() == [0.0, 0.0, -1.0, 1.0]
    assert scores.failed[:, 0].tolist() == [True, True, False, False]


def test_skip_group_marks_the_samples_to_leave_out_like_zero():
    """``inverse_length`` gets ``group_index`` (``**columns``) without naming it: retried per sample."""
    with pytest.warns(RewardFunctionWarning, match="its group left out of the update"):
        scores = score([("inverse_length", inverse_length)], "skip_group", group_index=[0, 0, 1, 1])
    assert scores.per_function[:, 0].tolist() == [1.0, 0.0, 0.25, 0.5]
    assert scores.failed[:, 0].tolist() == [False, True, False, False]


def test_none_is_not_a_failure():
    def partial(prompts, completions, **columns):
        return [None if c == "" else 1.0 for c in completions]

    scores = score([("partial", partial)], "zero")
    assert scores.per_function[:, 0].isnan().tolist() == [False, True, False, False]
    assert not scores.failed.any()


def returns(value):
    def reward(prompts, completions, **columns):
        return [value if c == "abcd" else 1.0 for c in completions]

    return reward


@pytest.mark.parametrize(
    ("value", "shown"),
    [(1e39, "1e+39"), (-1e39, "-1e+39"), (10**400, "an integer of about 401 digits")],
    ids=["past-float32", "past-float32-negative", "past-float64"],
)
def test_a_score_float32_cannot_hold_is_a_failure_handled_by_on_error(value, shown):
    """Scores are float32: 1e39 would be inf in the rewards, silently zeroing the advantages."""
    with pytest.raises(RewardFunctionError, match=rf"'huge' returned {re.escape(shown)} for sample 2; prompt='p2'"):
        score([("huge", returns(value))])
    with pytest.warns(RewardFunctionWarning, match="expected a finite number of at most 3.403e"):
        scores = score([("huge", returns(value))], "zero")
    assert scores.per_function[:, 0].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert scores.failed[:, 0].tolist() == [False, False, True, False]


def exits_on_long(prompts, completions, **columns):
    if any(len(c) > 3 for c in completions):
        sys.exit(0)
    return [float(len(c)) for c in completions]


async def exits_on_long_async(prompts, completions, **columns):
    return exits_on_long(prompts, completions)


@pytest.mark.parametrize("function", [exits_on_long, exits_on_long_async], ids=["sync", "async"])
@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["no-timeout", "timeout"])
def test_sys_exit_in_a_reward_function_is_its_failure_not_the_end_of_the_fit(function, timeout_s):
    with pytest.raises(RewardFunctionError, match=r"raised SystemExit: 0 at sample 2; prompt='p2'"):
        score([("exits", function)], timeout_s=timeout_s)
    with pytest.warns(RewardFunctionWarning, match="raised SystemExit"):
        scores = score([("exits", function)], "zero", timeout_s=timeout_s)
    assert scores.per_function[:, 0].tolist() == [1.0, 0.0, 0.0, 2.0]
    assert scores.failed[:, 0].tolist() == [False, False, True, False]


# ---------------------------------------------------------------- timeouts


@pytest.fixture
def stuck():
    """A reward function that blocks until the test ends (its thread cannot be stopped)."""
    release = threading.Event()

    def stuck(prompts, completions, **columns):
        release.wait(30)
        return [1.0] * len(completions)

    yield stuck
    release.set()


def test_a_call_past_the_timeout_fails_every_sample_of_its_batch(stuck):
    start = time.monotonic()
    with pytest.warns(RewardFunctionWarning, match=r"'stuck' took longer than 0.2 s on a batch of 4 completions"):
        scores = score([("stuck", stuck), ("constant", lambda p, c, **k: [1.0] * len(c))], "zero", timeout_s=0.2)
    assert time.monotonic() - start < 5.0  # generous: 0.2 s plus a busy machine
    assert scores.failed[:, 0].all() and not scores.failed[:, 1].any()
    assert scores.per_function[:, 0].tolist() == [0.0] * 4


def test_under_raise_a_timeout_is_an_error_naming_the_function(stuck):
    with pytest.raises(RewardFunctionError, match=r"'stuck' took longer than 0.2 s .*rewards.execution.timeout_s"):
        score([("stuck", stuck)], timeout_s=0.2)


# ---------------------------------------------------------------- async functions


def test_async_functions_are_awaited_together():
    """Each waits for the other to have started: awaited one after the other, neither could end."""
    started = {"first": asyncio.Event(), "second": asyncio.Event()}

    def waiting_for(own: str, other: str):
        async def reward(prompts, completions, **columns):
            started[own].set()
            await started[other].wait()
            return [float(len(c)) for c in completions]

        return reward

    functions = [("first", waiting_for("first", "second")), ("second", waiting_for("second", "first"))]
    scores = score(functions, timeout_s=10.0)
    assert scores.per_function.tolist() == [[1.0, 1.0], [0.0, 0.0], [4.0, 4.0], [2.0, 2.0]]


def test_an_async_function_that_raises_on_a_sample_is_retried_per_sample():
    async def inverse(prompts, completions, **columns):
        return inverse_length(prompts, completions)

    with pytest.warns(RewardFunctionWarning, match="sample 1"):
        scores = score([("inverse", inverse)], "zero")
    assert scores.per_function[:, 0].tolist() == [1.0, 0.0, 0.25, 0.5]


def test_an_async_function_past_the_timeout_is_cancelled():
    async def slow(prompts, completions, **columns):
        await asyncio.sleep(30)

    with pytest.raises(RewardFunctionError, match=r"'slow' took longer than 0.2 s"):
        score([("slow", slow)], timeout_s=0.2)


def test_an_async_function_that_blocks_its_loop_times_out_and_the_next_call_gets_a_new_loop():
    async def blocking(prompts, completions, **columns):
        time.sleep(2.0)  # noqa: ASYNC251 - the mistake under test: it blocks the loop, and cannot be cancelled

    async def fine(prompts, completions, **columns):
        return [1.0] * len(completions)

    scorer = RewardScorer(RewardExecution(on_error="zero", timeout_s=0.2))
    with pytest.warns(RewardFunctionWarning, match="blocking its event loop"):
        assert scorer.score([("blocking", blocking)], PROMPTS, COMPLETIONS, {}).failed.all()
    assert scorer.score([("fine", fine)], PROMPTS, COMPLETIONS, {}).per_function[:, 0].tolist() == [1.0] * 4
    scorer.close()


# ---------------------------------------------------------------- worker processes

WORKER_REWARDS = """
import os
import sys
import time


def length_plus_answer(prompts, completions, answer, **columns):
    return [len(c) + 0.5 * float(a) for c, a in zip(completions, answer)]


def group_relative_length(prompts, completions, group_index, **columns):
    lengths = [len(c) for c in completions]
    means = {g: sum(n for n, h in zip(lengths, group_index) if h == g) / group_index.count(g) for g in group_index}
    return [n - means[g] for n, g in zip(lengths, group_index)]


def worker_pid(prompts, completions, **columns):
    return [float(os.getpid())] * len(completions)


def slow_on_slow(prompts, completions, **columns):
    if "slow" in completions:
        time.sleep(60)
    return [float(len(c)) for c in completions]


def exits_on_crash(prompts, completions, **columns):
    if "crash" in completions:
        os._exit(3)  # as a crash in native code would: no exception, the process is gone
    return [float(len(c)) for c in completions]


def calls_sys_exit(prompts, completions, **columns):
    if "exit" in completions:
        sys.exit(0)
    return [float(len(c)) for c in completions]


def refuse_to_load():
    raise ValueError("this value cannot be rebuilt here")


class Unloadable(float):
    # pickles in the worker, but raises when the trainer unpickles it

    def __reduce__(self):
        return refuse_to_load, ()


def unloadable_on_bad(prompts, completions, **columns):
    return [Unloadable(1.0) if c == "bad" else float(len(c)) for c in completions]


def unpicklable_on_bad(prompts, completions, **columns):
    return [(x for x in "generator") if c == "bad" else float(len(c)) for c in completions]
"""


@pytest.fixture(scope="module")
def worker_rewards(tmp_path_factory):
    """A reward module of the user's (importable from a directory on ``sys.path``, without torch)
    and a scorer with 2 worker processes, shared by the tests below (the workers start once)."""
    directory = tmp_path_factory.mktemp("worker_rewards")
    (directory / "containment_worker_rewards.py").write_text(textwrap.dedent(WORKER_REWARDS))
    sys.path.insert(0, str(directory))
    module = importlib.import_module("containment_worker_rewards")
    scorer = RewardScorer(RewardExecution(on_error="zero", timeout_s=1.0, workers=2))
    yield module, scorer
    scorer.close()
    sys.path.remove(str(directory))
    sys.modules.pop("containment_worker_rewards", None)


def test_worker_processes_give_the_scores_of_the_trainer_process_in_order(worker_rewards):
    module, pooled = worker_rewards
    functions = [(name, getattr(module, name)) for name in ("length_plus_answer", "group_relative_length")]
    completions, groups = ["a", "bbb", "cc", "dddddd", "", "e"], [0, 0, 1, 1, 2, 2]
    columns = {"answer": ["1", "1", "2", "2", "4", "4"]}
    in_process = score_completions(functions, ["p"] * 6, completions, columns, groups)
    assert torch.equal(pooled.score(functions, ["p"] * 6, completions, columns, groups).per_function, in_process)
    pids = pooled.score([("worker_pid", module.worker_pid)], ["p"] * 6, completions, {}, groups).per_function
    assert set(pids[:, 0].tolist()) <= {float(w.process.pid) for w in pooled._pool.workers} - {float(os.getpid())}


def test_a_worker_past_the_timeout_is_killed_and_replaced_and_fails_only_its_chunk(worker_rewards):
    module, pooled = worker_rewards
    pooled.score([("slow_on_slow", module.slow_on_slow)], ["p"] * 4, ["a", "b", "cc", "ddd"], {})  # workers up
    before = {w.process.pid for w in pooled._pool.workers}
    with pytest.warns(RewardFunctionWarning, match="took longer than 1 s"):
        scores = pooled.score([("slow_on_slow", module.slow_on_slow)], ["p"] * 4, ["a", "slow", "cc", "ddd"], {})
    assert scores.per_function[:, 0].tolist() == [0.0, 0.0, 2.0, 3.0]  # chunks of 2: the first timed out
    after = {w.process.pid for w in pooled._pool.workers}
    assert len(after) == 2 and len(after - before) == 1


def test_a_worker_that_dies_fails_only_its_chunk_and_is_replaced(worker_rewards):
    module, pooled = worker_rewards
    ended = r"'exits_on_crash' ended its worker process \(exit code 3\) on a batch of 2"
    with pytest.warns(RewardFunctionWarning, match=ended):
        scores = pooled.score([("exits_on_crash", module.exits_on_crash)], ["p"] * 4, ["a", "b", "crash", "ddd"], {})
    assert scores.per_function[:, 0].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert all(w.process.is_alive() for w in pooled._pool.workers)


def test_sys_exit_in_a_worker_fails_only_its_sample(worker_rewards):
    module, pooled = worker_rewards
    with pytest.warns(RewardFunctionWarning, match=r"'calls_sys_exit' raised SystemExit: 0 at sample 2"):
        scores = pooled.score([("calls_sys_exit", module.calls_sys_exit)], ["p"] * 4, ["a", "b", "exit", "ddd"], {})
    assert scores.per_function[:, 0].tolist() == [1.0, 1.0, 0.0, 3.0]


def test_a_worker_that_died_while_idle_is_replaced_before_the_next_call(worker_rewards):
    """As when the OOM killer or an operator ends it between steps: its pipe is broken, no task is lost."""
    module, pooled = worker_rewards
    functions = [("worker_pid", module.worker_pid)]
    before = set(pooled.score(functions, ["p"] * 4, ["a", "b", "c", "d"], {}).per_function[:, 0].tolist())
    for pid in before:
        os.kill(int(pid), signal.SIGKILL)
    for pid in before:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{int(pid)}/status"):
            time.sleep(0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no failure: the tasks were never lost
        scores = pooled.score(functions, ["p"] * 4, ["a", "b", "c", "d"], {})
    after = set(scores.per_function[:, 0].tolist())
    assert len(after) == 2 and not after & before and not scores.failed.any()


@pytest.mark.parametrize("function", ["unloadable_on_bad", "unpicklable_on_bad"])
def test_a_value_that_cannot_come_back_from_a_worker_fails_its_chunk_naming_the_function(worker_rewards, function):
    module, pooled = worker_rewards
    functions = [(function, getattr(module, function))]
    lost = rf"'{function}' returned a value that cannot be sent back from its worker process \(.*\) on a batch of 2"
    with pytest.warns(RewardFunctionWarning, match=lost):
        scores = pooled.score(functions, ["p"] * 4, ["a", "bad", "cc", "ddd"], {})
    assert scores.per_function[:, 0].tolist() == [0.0, 0.0, 2.0, 3.0]
    assert scores.failed[:, 0].tolist() == [True, True, False, False]


def test_a_function_that_cannot_reach_a_worker_is_a_config_error():
    with pytest.raises(ConfigError, match=r"rewards.execution.workers: reward function 'local' cannot be sent"):
        RewardScorer(RewardExecution(workers=2), [("local", lambda prompts, completions, **columns: [0.0])])


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"on_error": "ignore"}, "rewards.execution.on_error: 'ignore' is not one of raise, zero, skip_group."),
        ({"timeout_s": 0}, "rewards.execution.timeout_s: must be seconds > 0 or null, got 0."),
        ({"timeout_s": float("inf")}, "rewards.execution.timeout_s: must be seconds > 0 or null, got inf."),
        ({"workers": -1}, "rewards.execution.workers: must be an integer >= 0"),
    ],
    ids=["on_error", "timeout_s", "timeout_s_inf", "workers"],
)
def test_a_bad_value_is_a_config_error_naming_the_field(options, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        RewardExecution(**options)


def test_reward_execution_is_one_group_on_the_command_line():
    configs = [config_dir() / f"{name}.yaml" for name in ("trainer/cpu", "data/arithmetic", "variant/grpo")]
    args = [*(a for c in configs for a in ("--config", str(c))),
            "--model.model", "some/model", "--model.rewards.execution.on_error", "skip_group",
            "--model.rewards.execution.timeout_s", "30", "--model.rewards.execution.workers", "2"]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    assert cli.model.reward_scorer.execution == RewardExecution(on_error="skip_group", timeout_s=30.0, workers=2)
    assert cli.model.hparams.rewards["execution"] == {"on_error": "skip_group", "timeout_s": 30.0, "workers": 2}


# ---------------------------------------------------------------- skip_group in a fit


def length_reward(prompts, completions, **columns):
    return [float(len(c) % 3) for c in completions]


def fails_on_group_0(prompts, completions, group_index, **columns):
    """Raises on every batch holding group 0 (the first prompt of each step)."""
    if 0 in group_index:
        raise ValueError("group 0")
    return [1.0] * len(completions)


def always_fails(prompts, completions, **columns):
    raise ValueError("broken")


def test_skip_group_trains_on_the_other_groups(tiny_model_dir, tmp_path, one_torch_thread):
    module = make_module(
        tiny_model_dir,
        rewards={"funcs": [length_reward, fails_on_group_0], "execution": RewardExecution(on_error="skip_group")},
    )
    with pytest.warns(RewardFunctionWarning, match="'fails_on_group_0' raised ValueError: group 0 at the group of"):
        steps, trainer = fit(module, max_steps=2, root=tmp_path)
    assert trainer.global_step == 2 and sorted(steps) == [1, 2]
    for metrics in steps.values():  # 2 prompts a step: one group left out, the other trained on
        assert float(metrics["rewards/frac_groups_skipped"]) == 0.5
        assert float(metrics["rewards/fails_on_group_0/error_rate"]) == 0.5
        assert float(metrics["rewards/length_reward/error_rate"]) == 0.0
    assert module.last_rollout.num_groups == 1 and float(steps[2]["grad_norm"]) > 0


def test_a_step_whose_every_group_failed_counts_without_changing_a_weight(tiny_model_dir, tmp_path, one_torch_thread):
    module = make_module(tiny_model_dir, rewards={"funcs": [always_fails], "execution": {"on_error": "skip_group"}})
    with pytest.warns(RewardFunctionWarning):
        steps, trainer = fit(module, max_steps=2, root=tmp_path)
    assert trainer.global_step == 2 and float(steps[2]["rewards/frac_groups_skipped"]) == 1.0
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert all(torch.equal(value, original[name]) for name, value in module.policy.state_dict().items())


def answer_check_that_fails_on_7(prompts, completions, answer, **columns):
    """An accuracy function that raises on the prompt whose answer is 7."""
    if "7" in answer:
        raise ValueError("cannot parse")
    return [1.0] * len(completions)


@pytest.mark.parametrize("on_error", ["raise", "zero"])
def test_the_accuracy_function_fails_as_reward_execution_says(tiny_model_dir, on_error):
    module = make_module(
        tiny_model_dir,
        evaluation={"accuracy_func": answer_check_that_fails_on_7},
        rewards={"execution": RewardExecution(on_error=on_error)},
    )
    module.configure_model()
    rollout = module.generate({"prompt": ["3+4=", "1+2="], "answer": ["7", "3"]}, 2, module.val_sampling)
    module.score(rollout)
    if on_error == "raise":
        with pytest.raises(RewardFunctionError, match="'answer_check_that_fails_on_7' raised ValueError: cannot parse"):
            module.accuracy_scores(rollout)
        return
    with pytest.warns(RewardFunctionWarning, match="scored 0"):
        assert module.accuracy_scores(rollout).tolist() == [0.0, 0.0, 1.0, 1.0]
