"""A user's mistake is one ``error: ...`` line naming the field and the fix, without a traceback.

The CLI runs in this process (``main(..., report_errors=True)``, what the command line calls), as
Python would run it: an exception that escapes is printed as a traceback with exit status 1. One
test runs ``python -m grpo_lightning.cli`` itself, for what only a new process shows.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass

import pytest

from grpo_lightning.cli.app import main
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()
BASE = [
    "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
    "--config", str(CONFIGS / "variant/grpo.yaml"), "--config", str(CONFIGS / "model/tiny.yaml"),
]  # fmt: skip


@dataclass
class Finished:
    returncode: int
    stderr: str


@pytest.fixture
def run_fit(monkeypatch):
    """``run_fit(*args, model=..., base=BASE)``: ``grpo-lightning fit`` with the shipped configs and ``args``,
    in this process, with the command line's error reporting; its exit status and stderr."""
    monkeypatch.setenv("GRPO_LIGHTNING_TRACEBACK", "")

    def run(*args: str, model: str, base: list[str] = BASE) -> Finished:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                main(["fit", *base, "--model.model", model, *args], report_errors=True)
                code = 0
            except SystemExit as exited:
                code = exited.code if isinstance(exited.code, int) else int(exited.code is not None)
            except Exception:  # what the interpreter does with an exception that escapes
                traceback.print_exc()
                code = 1
        return Finished(code, stderr.getvalue())

    return run


def error_line(done) -> str:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "Namespace(" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_the_command_line_prints_one_error_line_and_exits_with_status_2(tiny_model_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRPO_LIGHTNING_TRACEBACK": ""}
    command = [sys.executable, "-m", "grpo_lightning.cli", "fit", *BASE, "--model.model", tiny_model_dir,
               "--model.sampling.group_size", "1"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    line = error_line(done)
    assert "group_size" in line and "at least 2" in line and "got 1" in line, line
    # Its imports' objects were frozen (grpo_lightning.import_pause) and unfrozen at exit: none is reported leaked.
    assert "leaked" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.sampling.group_size", "1"], ["group_size", "at least 2", "got 1"]),
        (["--model.sampling.max_new_tokens", "0"], ["max_new_tokens", "at least 1", "got 0"]),
        (["--model.rewards.funcs", "[my_rewards.missing.reward]"], ["rewards.funcs[0]", "my_rewards.missing.reward", "importable"]),
        (["--model.optim.learning_rate", "-1"], ["learning_rate", "-1", "--model.optim.learning_rate"]),
        (["--model.group_sise", "4"], ["--model.group_sise", "did you mean --model.sampling.group_size?"]),
        (["--trainer.max_stepz", "4"], ["--trainer.max_stepz", "did you mean --trainer.max_steps?"]),
    ],
    ids=["group_size", "max_new_tokens", "reward_path", "learning_rate", "near_miss_option", "near_miss_trainer"],
)
def test_a_bad_setting_is_one_line(args, expected, tiny_model_dir, run_fit):
    line = error_line(run_fit(*args, model=tiny_model_dir))
    for part in expected:
        assert part in line, line


def test_an_unknown_variant_lists_the_valid_ones(tiny_model_dir, run_fit):
    line = error_line(run_fit("--model", "grpo_lightning.variants.Nope", model=tiny_model_dir))
    assert "grpo_lightning.variants.Nope" in line
    for name in ("GRPO", "DrGRPO", "DAPO", "RLOO", "GSPO"):
        assert f"grpo_lightning.variants.{name}" in line


def test_a_misspelt_variant_suggests_the_nearest(tiny_model_dir, run_fit):
    line = error_line(run_fit("--model", "grpo_lightning.variants.DAAPO", model=tiny_model_dir))
    assert "Did you mean grpo_lightning.variants.DAPO?" in line


@pytest.mark.parametrize("path", ["variants.DAPO", "variants.dapo.DAPO"])
def test_a_presets_former_class_path_is_refused_naming_the_new_one(path, tiny_model_dir, run_fit):
    """The presets were a top-level package, ``variants``, before 0.1.0."""
    line = error_line(run_fit("--model", path, model=tiny_model_dir))
    assert line.startswith(f"error: {path!r}: its module has moved; write {'grpo_lightning.' + path!r}.")


def test_a_config_file_with_a_former_class_path_is_refused_naming_the_new_one(tiny_model_dir, tmp_path, run_fit):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  class_path: variants.GRPO\n")
    line = error_line(run_fit("--config", str(old), model=tiny_model_dir))
    assert line.startswith("error: 'variants.GRPO': its module has moved; write 'grpo_lightning.variants.GRPO'.")


def test_a_missing_data_file_names_the_path(tiny_model_dir, tmp_path, run_fit):
    missing = str(tmp_path / "missing.jsonl")
    done = run_fit("--data", "grpo_lightning.data.PromptDataModule", "--data.path", missing, model=tiny_model_dir)
    line = error_line(done)
    assert "data.path" in line and missing in line


def test_a_missing_model_directory_names_the_field(tmp_path, monkeypatch, run_fit):
    monkeypatch.chdir(tmp_path)
    line = error_line(run_fit(model="./nope"))
    assert "model" in line and "./nope" in line


def test_verbose_shows_the_traceback(tiny_model_dir, run_fit):
    done = run_fit("--model.sampling.group_size", "1", "--verbose", model=tiny_model_dir)
    assert done.returncode != 0
    assert "Traceback" in done.stderr
    assert "sampling.group_size: must be at least 2" in done.stderr


def test_the_environment_variable_shows_the_traceback(tiny_model_dir, monkeypatch):
    from grpo_lightning.cli.app import _wants_traceback

    monkeypatch.setenv("GRPO_LIGHTNING_TRACEBACK", "1")
    assert _wants_traceback([])
    monkeypatch.setenv("GRPO_LIGHTNING_TRACEBACK", "0")
    assert not _wants_traceback([]) and _wants_traceback(["--verbose"])


class UnreachableEnvironment:
    """An environment whose every episode fails: its server cannot be reached."""

    def reset(self, row):
        raise ConnectionError("the game server\nis down")

    def step(self, message):
        return [], 0.0, True


def test_a_fit_whose_environment_keeps_raising_stops_with_one_line_naming_it_and_its_error(tiny_model_dir, run_fit):
    environment = f'{{"name": "{__name__}.UnreachableEnvironment", "max_turns": 2}}'
    line = error_line(run_fit("--model.environment", environment, "--trainer.max_steps", "1", model=tiny_model_dir))
    assert f"environment: {__name__}.UnreachableEnvironment raised in" in line, line
    assert "reset raised ConnectionError: the game server is down" in line and "environment.max_error_fraction" in line


# --- options spelt in full, keys that do not exist, TRL's names ----------------------------------


def test_an_abbreviated_option_is_one_line_naming_the_full_one(tiny_model_dir):
    """argparse would take ``--trainer.max_step`` as ``--trainer.max_steps`` (and run the fit)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRPO_LIGHTNING_TRACEBACK": ""}
    command = [sys.executable, "-m", "grpo_lightning.cli", "fit", *BASE, "--model.model", tiny_model_dir,
               "--trainer.max_step", "2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [error_line(done)], done.stderr[-3000:]
    assert error_line(done).startswith("error: --trainer.max_step: no such option; did you mean --trainer.max_steps?")


def test_an_abbreviated_field_of_a_group_is_refused_naming_the_full_one(tiny_model_dir, run_fit):
    line = error_line(run_fit("--model.optim.learning_rat", "1e-4", model=tiny_model_dir))
    assert line.startswith('error: model.optim: no field "learning_rat"; did you mean "learning_rate"?'), line


@pytest.mark.parametrize("where", ["yaml", "command_line"])
def test_a_misspelt_field_of_a_group_names_the_group_and_the_nearest_field(where, tiny_model_dir, tmp_path, run_fit):
    config = tmp_path / "typo.yaml"
    config.write_text("model:\n  init_args:\n    sampling:\n      group_sise: 8\n")
    given = ["--config", str(config)] if where == "yaml" else ["--model.sampling.group_sise", "8"]
    line = error_line(run_fit(*given, model=tiny_model_dir))
    assert line.startswith('error: model.sampling: no field "group_sise"; did you mean "group_size"?'), line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.sampling.num_generations", "4"], "--model.sampling.num_generations: no such option; "
                                                    "TRL's num_generations is --model.sampling.group_size here"),
        (["--model.max_completion_length", "16"], "TRL's max_completion_length is --model.sampling.max_new_tokens"),
        (["--model.loss.loss_type", "dr_grpo"], "dr_grpo: --model dr_grpo"),
        (["--model.importance_sampling_level", "sequence"], "sequence: --model gspo"),
        (["--per_device_train_batch_size", "4"], "--per_device_train_batch_size: no such option; TRL's "
                                                 "per_device_train_batch_size is --data.batch_size here"),
    ],
    ids=["num_generations", "max_completion_length", "loss_type", "importance_sampling_level", "batch_size"],
)
def test_a_trl_name_is_answered_with_ours(args, expected, tiny_model_dir, run_fit):
    line = error_line(run_fit(*args, model=tiny_model_dir))
    assert expected in line, line


# --- checks before the model loads -------------------------------------------------------------


@pytest.fixture
def weightless_model_dir(tiny_model_dir, tmp_path) -> str:
    """The tiny model's config and tokenizer without its weights: an error about them would mean a load was tried."""
    folder = tmp_path / "weightless"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    return str(folder)


def test_a_fit_without_a_variant_is_one_line_before_the_model_loads(weightless_model_dir, run_fit):
    without_variant = ["--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
                       "--config", str(CONFIGS / "model/tiny.yaml")]  # fmt: skip
    line = error_line(run_fit(model=weightless_model_dir, base=without_variant))
    assert "model: GroupPolicyOptimization names no advantage and no aggregation" in line, line
    assert "--model GRPO" in line and "--model.advantage NAME" in line


def test_chat_prompts_for_a_tokenizer_without_a_chat_template_are_one_line_before_the_model_loads(
    weightless_model_dir, tmp_path, run_fit
):
    data = tmp_path / "chat.jsonl"
    data.write_text('{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}\n' * 4)
    done = run_fit("--data", "grpo_lightning.data.PromptDataModule", "--data.path", str(data), model=weightless_model_dir)
    line = error_line(done)
    assert "data.path: its prompts are chat messages" in line and "no chat template" in line, line
    assert "--model.policy.tokenizer" in line
