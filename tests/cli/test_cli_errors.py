"""A user's mistake is one ``error: ...`` line naming the field and the fix, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()
BASE = [
    "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
    "--config", str(CONFIGS / "variant/grpo.yaml"), "--config", str(CONFIGS / "model/tiny.yaml"),
]  # fmt: skip


def run_fit(*args: str, model: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRPO_LIGHTNING_TRACEBACK": ""}
    command = [sys.executable, "-m", "grpo_lightning.cli", "fit", *BASE, "--model.model", model, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "Namespace(" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


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
def test_a_bad_setting_is_one_line(args, expected, tiny_model_dir):
    line = error_line(run_fit(*args, model=tiny_model_dir))
    for part in expected:
        assert part in line, line


def test_an_unknown_variant_lists_the_valid_ones(tiny_model_dir):
    line = error_line(run_fit("--model", "variants.Nope", model=tiny_model_dir))
    assert "variants.Nope" in line
    for name in ("variants.GRPO", "variants.DrGRPO", "variants.DAPO", "variants.RLOO", "variants.GSPO"):
        assert name in line


def test_a_misspelt_variant_suggests_the_nearest(tiny_model_dir):
    assert "Did you mean variants.DAPO?" in error_line(run_fit("--model", "variants.DAAPO", model=tiny_model_dir))


def test_a_missing_data_file_names_the_path(tiny_model_dir, tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    done = run_fit("--data", "grpo_lightning.data.PromptDataModule", "--data.path", missing, model=tiny_model_dir)
    line = error_line(done)
    assert "data.path" in line and missing in line


def test_a_missing_model_directory_names_the_field(tmp_path):
    line = error_line(run_fit(model="./nope", cwd=tmp_path))
    assert "model" in line and "./nope" in line


def test_verbose_shows_the_traceback(tiny_model_dir):
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
