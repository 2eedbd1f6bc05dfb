"""``trainer.max_time`` counts from the process start (loading and validation included) and ends a fit
within one step of the budget; the fit's summary says where the time went."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from grpo_lightning.runtime import time_budget
from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.errors import ConfigError
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.runtime.time_budget import TimeBudget, budget_seconds

CONFIGS = config_dir()

SLOW_FUNCTIONS = '''
import time

def slow_reward(prompts, completions, **columns):
    time.sleep(0.4)
    return [float(len(c) % 3) for c in completions]

def slow_accuracy(prompts, completions, **columns):
    time.sleep(1.0)
    return [0.0] * len(completions)
'''


@pytest.fixture
def slow_functions(tmp_path, monkeypatch):
    """A module of a reward and an accuracy function that sleep (a slow step, a slow validation)."""
    (tmp_path / "slow_functions.py").write_text(SLOW_FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))


def fit(tiny_model_dir, tmp_path, *extra: str, monkeypatch=None) -> GRPOLightningCLI:
    """``grpo-lightning fit`` of the tiny model on one-prompt batches, 1000 steps unless stopped; with
    ``monkeypatch``, read from ``sys.argv`` as on the command line."""
    args = [
        "fit",
        "--config",
        str(CONFIGS / "trainer/cpu.yaml"),
        "--config",
        str(CONFIGS / "data/arithmetic.yaml"),
        "--config",
        str(CONFIGS / "variant/grpo.yaml"),
        "--model.model",
        tiny_model_dir,
        "--model.sampling.group_size",
        "2",
        "--model.sampling.max_new_tokens",
        "2",
        "--data.batch_size",
        "1",
        "--data.num_train",
        "1000",
        "--data.num_val",
        "8",
        "--data.val_batch_size",
        "1",
        "--trainer.max_steps",
        "1000",
        "--trainer.val_check_interval",
        "1000",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
        "--trainer.callbacks.dirpath",
        str(tmp_path / "ckpt"),
        *extra,
    ]
    if monkeypatch is None:
        return GRPOLightningCLI(args=args)
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args])
    return GRPOLightningCLI()


def the_budget(cli) -> TimeBudget:
    (budget,) = [c for c in cli.trainer.callbacks if isinstance(c, TimeBudget)]
    return budget


def test_max_time_counts_the_time_before_the_fit_and_stops_within_a_step(
    tiny_model_dir, tmp_path, slow_functions, monkeypatch, one_torch_thread, capsys
):
    """On the command line the clock starts with the process, here 2 s before the trainer is built (as
    imports would take), so loading and setting up count: a 10 s budget leaves less than 8 s of 0.4 s
    steps, where Lightning's timer, counting from the start of training, would train 10 s."""
    monkeypatch.setattr(time_budget, "process_start_time", lambda: time.time() - 2.0)
    cli = fit(
        tiny_model_dir,
        tmp_path,
        "--model.rewards.funcs",
        "[slow_functions.slow_reward]",
        "--validate_before_fit",
        "false",
        "--trainer.max_time",
        "00:00:00:10",
        monkeypatch=monkeypatch,
    )
    budget = the_budget(cli)
    assert budget.budget == 10.0
    assert cli.trainer.global_step >= 1
    assert 10.0 <= budget.ended - budget.start <= 10.0 + 0.4 + 1.5  # one 0.4 s step over at most, and slack
    assert budget.ended - budget.train_started < 8.0 + 0.4 + 1.0  # Lightning's timer: 10 s of training and more
    assert "since process start (max_time 10s)" in capsys.readouterr().out


def test_a_slow_validation_before_the_fit_stops_at_the_budget(
    tiny_model_dir, tmp_path, slow_functions, monkeypatch, one_torch_thread, capsys, caplog
):
    """Validation before the first step would take 8 s (eight 1 s batches): a 6 s budget stops it, and
    no training step starts after it. Called from Python, the budget counts from the CLI's creation
    (this process started long before)."""
    caplog.set_level(logging.INFO)
    created = time.time()
    cli = fit(tiny_model_dir, tmp_path, "--model.evaluation.accuracy_func", "slow_functions.slow_accuracy",
              "--trainer.max_time", "00:00:00:06")  # fmt: skip
    budget = the_budget(cli)
    assert budget.start >= created
    assert budget.validation_stopped
    assert cli.trainer.global_step == 0
    assert budget.ended - budget.start <= 6.0 + 1.0 + 1.5  # one 1 s validation batch over at most, and slack
    assert "validation stops" in caplog.text and "no step is taken" in caplog.text
    out = capsys.readouterr().out
    assert "start-up and loading" in out and ", validation " in out


def test_without_max_time_the_fit_only_accounts_for_its_time(tiny_model_dir, tmp_path, one_torch_thread, capsys):
    cli = fit(tiny_model_dir, tmp_path, "--trainer.max_steps", "2", "--validate_before_fit", "false")
    assert cli.trainer.global_step == 2 and the_budget(cli).budget is None
    out = capsys.readouterr().out
    assert "since start: start-up and loading" in out and "first batch (compilation included)" in out
    assert "1 more batch " in out


def test_process_start_time_counts_the_interpreter_s_start_and_imports():
    code = ("import time; time.sleep(1.0); from grpo_lightning.runtime.time_budget import process_start_time; "
            "print(time.time() - process_start_time())")  # fmt: skip
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.0 <= age < 60.0


def test_the_account_splits_loading_validation_the_first_step_and_the_others():
    budget = TimeBudget("00:00:03:00", start=1000.0)  # an origin of the caller's: "since start"
    budget.train_started, budget.validating_before_training = 1100.0, 30.0  # 70 s loading, 30 s validating first
    budget.first_step_started, budget.first_step_ended = 1101.0, 1161.0
    budget.steps, budget.validating, budget.ended = 11, 40.0, 1191.0  # 10 s validating later: 20 s for 10 steps
    assert budget.summary() == (
        "3m11s since start (max_time 3m00s): start-up and loading 1m10s, validation 40s, "
        "first batch (compilation included) 1m00s, 10 more batches 20s"
    )


def test_the_account_names_later_steps_that_compiled(monkeypatch):
    """A step after the first that compiles a graph (a shape the cache had not seen: 7 s of a
    one-minute SmolLM2 fit on a GPU) is counted apart; a step that only runs compiled code is not.
    Dynamo's eager backend stands in for Inductor: what counts is that a graph is traced."""
    now = [100.0]
    monkeypatch.setattr(time_budget, "time", SimpleNamespace(time=lambda: now[0]))
    budget = TimeBudget(start=0.0)
    budget.train_started = 100.0
    double = torch.compile(lambda x: 2 * x, backend="eager")
    for shape, seconds in ((2, 5.0), (2, 0.5), (3, 7.0), (3, 0.5)):  # the first step compiles; the third meets a new shape
        budget.on_train_batch_start(None, None, None, 0)
        double(torch.ones(shape))
        now[0] += seconds
        budget.on_train_batch_end(None, None, None, None, 0)
    budget.ended = now[0]
    assert (budget.compiling_steps, budget.compiling_steps_seconds) == (1, 7.0)
    assert budget.summary().endswith(
        "first batch (compilation included) 5s, 3 more batches 8s (7s of them in 1 batch that compiled)"
    )


@pytest.mark.parametrize(("value", "seconds"), [
    ("00:00:03:00", 180.0), ("01:02:03:04", 93784.0), (timedelta(minutes=2), 120.0), ({"seconds": 7}, 7.0),
    (12, 12.0), (None, None),
])  # fmt: skip
def test_max_time_is_read_as_lightning_reads_it(value, seconds):
    assert budget_seconds(value) == seconds


def test_a_max_time_that_is_no_duration_is_an_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"trainer\.max_time: '3 minutes'.*DD:HH:MM:SS"):
        budget_seconds("3 minutes")
