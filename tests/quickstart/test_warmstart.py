import json
import os
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.data.arithmetic import make_arithmetic_dataset
from grpo_lightning.quickstart.tiny import TEXT_ALPHABET, build_char_tokenizer
from grpo_lightning.quickstart.accuracy import generation_metrics, greedy_accuracy
from grpo_lightning.quickstart.cached_build import MARKER_FILE, default_cache_dir, environment, read_marker, reproducible_cpu
from grpo_lightning.quickstart.warmstart import (
    WORDED_EVERY,
    WORDED_TEMPLATES,
    WarmStartSettings,
    main,
    supervised_batch_tensors,
    training_prompts,
    warm_start,
)

FAST = dict(
    num_train=256,
    num_val=16,
    num_dev=32,
    target_accuracy=None,
    steps=40,
    batch_size=16,
    hidden_size=32,
    intermediate_size=64,
    log_every=10,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_LIGHTNING_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fast_dir(cache):
    return warm_start(**FAST)


def test_default_cache_dir(cache, monkeypatch):
    assert default_cache_dir() == cache
    monkeypatch.delenv("GRPO_LIGHTNING_CACHE")
    assert default_cache_dir().name == "grpo_lightning"


def test_labels_cover_only_the_completion():
    tokenizer = build_char_tokenizer()
    input_ids, attention_mask, labels = supervised_batch_tensors(tokenizer, ["1+2=", "37+45="], ["3", "82"])
    completion = tokenizer.encode("<answer>82</answer>", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert labels[1][labels[1] != -100].tolist() == completion
    assert input_ids[1].tolist() == tokenizer.encode("37+45=", add_special_tokens=False) + completion
    assert (labels[0, :4] == -100).all() and (labels[0][attention_mask[0] == 0] == -100).all()
    assert attention_mask.sum(dim=1).tolist() == [4 + 4, 6 + 5]


def test_warm_start_writes_loadable_dir(fast_dir, cache):
    assert fast_dir.parent == cache and fast_dir.name.startswith("warmstart-")
    assert (fast_dir / MARKER_FILE).exists()
    tokenizer = AutoTokenizer.from_pretrained(fast_dir)
    model = AutoModelForCausalLM.from_pretrained(fast_dir)
    assert model.config.vocab_size == len(tokenizer)
    answer_id = tokenizer.convert_tokens_to_ids("<answer>")
    assert tokenizer.encode("<answer>", add_special_tokens=False) == [answer_id]
    question = "Which is larger, 27 or 82?\n"  # the model reads what a user writes
    assert tokenizer.decode(tokenizer.encode(question, add_special_tokens=False)) == question


def test_a_warm_start_first_says_what_it_builds_and_where_then_its_steps_of_the_total(cache, capsys):
    model_dir = warm_start(**FAST)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"Building the quickstart's tiny model in {model_dir} (at most 40 training steps")
    assert any(line.startswith("warm start: 40/40 steps in ") and line.endswith(", done") for line in lines)


def test_supervised_loss_decreases(fast_dir):
    losses = [loss for _, loss in read_marker(fast_dir)["losses"]]
    assert len(losses) == 4
    assert losses[-1] < 0.7 * losses[0]


def test_second_call_hits_cache(fast_dir):
    marker_time = (fast_dir / MARKER_FILE).stat().st_mtime_ns
    started = time.perf_counter()
    assert warm_start(**FAST) == fast_dir
    assert time.perf_counter() - started < 1.0
    assert (fast_dir / MARKER_FILE).stat().st_mtime_ns == marker_time


def test_different_settings_different_dir(fast_dir):
    settings = WarmStartSettings(**{k: v for k, v in FAST.items() if k != "log_every"})
    assert settings.cache_key() != WarmStartSettings(**{**vars(settings), "seed": 1}).cache_key()
    assert settings.cache_key() != WarmStartSettings(**{**vars(settings), "learning_rate": 1e-3}).cache_key()
    other = warm_start(**{**FAST, "steps": 10})
    assert other != fast_dir and other.parent == fast_dir.parent


def test_interrupted_run_is_redone(tmp_path):
    target = tmp_path / "model"
    settings = {**FAST, "steps": 10}
    warm_start(target, **settings)
    (target / MARKER_FILE).unlink()
    started = time.time()
    warm_start(target, **settings)
    assert (target / MARKER_FILE).stat().st_mtime >= started


def test_explicit_dir_with_other_settings_is_retrained(tmp_path):
    target = tmp_path / "model"
    warm_start(target, **{**FAST, "steps": 10})
    warm_start(target, **{**FAST, "steps": 12})
    assert json.loads((target / MARKER_FILE).read_text())["settings"]["steps"] == 12


def test_stops_at_target_dev_accuracy(tmp_path):
    record = read_marker(warm_start(tmp_path / "m", **{**FAST, "target_accuracy": 0.0, "eval_every": 5}))
    assert record["stopped_at"] == 5
    assert record["dev_accuracy"] == [[5, record["dev_accuracy"][0][1]]]


def test_default_split_matches_default_task_split():
    """The default warm start never trains on the default validation prompts."""
    default = make_arithmetic_dataset()
    settings = WarmStartSettings()
    train, dev = settings.train_and_dev()
    assert settings.dataset()["validation"]["prompt"] == default["validation"]["prompt"]
    assert not set(train["prompt"]) & set(default["validation"]["prompt"])


def test_one_training_row_in_four_is_a_question_in_words():
    """The same problems, some written in words: the model learns to read text and answer it."""
    settings = WarmStartSettings(num_train=100, num_val=10, num_dev=20)
    train, _ = settings.train_and_dev()
    prompts = training_prompts(settings, len(train))
    terse = [row for row, prompt in enumerate(prompts) if prompt == train["prompt"][row]]
    assert terse == [row for row in range(len(train)) if row % WORDED_EVERY != WORDED_EVERY - 1]
    tokenizer = build_char_tokenizer(TEXT_ALPHABET)
    for row in range(WORDED_EVERY - 1, len(prompts), WORDED_EVERY):
        a, b = train["prompt"][row].removesuffix("=").split("+")
        template = WORDED_TEMPLATES[(row // WORDED_EVERY) % len(WORDED_TEMPLATES)]
        assert prompts[row] == template.format(a=a, b=b)
        assert tokenizer.decode(tokenizer.encode(prompts[row], add_special_tokens=False)) == prompts[row]


def test_dev_rows_are_held_out():
    settings = WarmStartSettings(num_train=100, num_val=10, num_dev=20)
    train, dev = settings.train_and_dev()
    validation = settings.dataset()["validation"]
    assert len(train) == 80 and len(dev) == 20
    assert not set(train["prompt"]) & (set(dev["prompt"]) | set(validation["prompt"]))


def test_training_is_deterministic(tmp_path):
    settings = {**FAST, "steps": 10}
    first = read_marker(warm_start(tmp_path / "a", **settings))["losses"]
    second = read_marker(warm_start(tmp_path / "b", **settings))["losses"]
    assert first == second


def test_training_does_not_depend_on_the_thread_count(tmp_path):
    settings = {**FAST, "steps": 10}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = read_marker(warm_start(tmp_path / "a", **settings))["losses"]
        torch.set_num_threads(3)
        second = read_marker(warm_start(tmp_path / "b", **settings))["losses"]
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)
    assert first == second
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_reproducible_cpu_restores_the_callers_settings():
    threads = torch.get_num_threads()
    with reproducible_cpu():
        assert torch.get_num_threads() == 1
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() == threads
    assert not torch.are_deterministic_algorithms_enabled()


def test_marker_records_what_the_result_depends_on(fast_dir):
    recorded = read_marker(fast_dir)["environment"]
    assert recorded == environment()
    assert recorded["torch"] == torch.__version__
    assert recorded["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert recorded["threads"] == 1


def test_accuracy_helpers(fast_dir):
    settings = WarmStartSettings(num_train=FAST["num_train"], num_val=FAST["num_val"])
    validation = settings.dataset()["validation"]
    greedy = greedy_accuracy(fast_dir, validation, num_samples=8)
    sampled = greedy_accuracy(fast_dir, validation, temperature=1.0, num_samples=8)
    assert 0.0 <= greedy <= 1.0 and 0.0 <= sampled <= 1.0
    metrics = generation_metrics(fast_dir, validation, num_samples=8)
    assert set(metrics) == {"accuracy", "format_rate"} and metrics["accuracy"] == greedy


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--hidden-size" in capsys.readouterr().out


def test_cli_runs(tmp_path, capsys):
    args = ["--output-dir", str(tmp_path / "cli"), "--steps", "5", "--num-train", "64", "--num-val", "8"]
    main(args + ["--num-dev", "8", "--hidden-size", "32", "--intermediate-size", "64", "--batch-size", "8"])
    out = capsys.readouterr().out
    assert f"model: {tmp_path / 'cli'}" in out
    assert "greedy accuracy:" in out and "sampled accuracy (T=1):" in out
    assert f"torch {torch.__version__}" in out and "cpu_capability" in out


def test_the_quickstart_says_what_it_does_before_importing_the_trainer(tmp_path):
    # the trainer's import is made to fail, to stop the quickstart right after its slowest first step
    stop_at_the_import = "import sys; sys.modules['grpo_lightning.cli.app'] = None; from grpo_lightning.quickstart import main; main([])"
    env = {**os.environ, "GRPO_LIGHTNING_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", stop_at_the_import], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("grpo-lightning-quickstart: importing the trainer, then warm-starting a tiny model")
    assert f"cached in {tmp_path / 'cache'}" in first
