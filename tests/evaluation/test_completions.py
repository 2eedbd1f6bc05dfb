"""Completion tables: a CLI fit writes Markdown tables of what the model wrote to TensorBoard on the
scheduled steps, and every trained completion to JSONL in the format the report reads."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.cli.app import GRPOLightningCLI, main
from grpo_lightning.evaluation.completions import (
    CompletionLog,
    completion_records,
    completion_table,
    is_table_step,
    keep_steps_before,
    markdown_cell,
    prompt_text,
    shorten,
)
from grpo_lightning.errors import ConfigError
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.rollout.types import Rollout

CONFIGS = config_dir()
BASE = ["--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml")]
KEYS = {"step", "group", "prompt", "completion", "rewards", "reward", "advantage", "truncated"}
WEIGHTS = (1.0, 0.5)


def parity_reward(prompts, completions, **columns):
    """Differs within most groups, so most advantages are not 0."""
    return [float(len(c) % 2) for c in completions]


def sometimes_none_reward(prompts, completions, **columns):
    """No score (``null``) for completions of a length divisible by 3."""
    return [None if len(c) % 3 == 0 else float(len(c)) for c in completions]


# ---------------------------------------------------------------- a real fit through the CLI


@pytest.fixture(scope="module")
def fit_logs(tiny_model_dir, tmp_path_factory, one_torch_thread) -> Path:
    """The version directory of a 3-step GRPO fit: 2 prompts x 3 completions a step, a table of
    step 0 (the first steps) and of step 2 (every 3 steps), every completion to JSONL."""
    root = tmp_path_factory.mktemp("completions")
    names = f"[{__name__}.parity_reward, {__name__}.sometimes_none_reward]"
    main(
        [
            "fit",
            *BASE,
            "--config",
            str(CONFIGS / "variant/grpo.yaml"),
            "--model.model",
            tiny_model_dir,
            "--model.rewards.funcs",
            names,
            "--model.rewards.weights",
            str(list(WEIGHTS)),
            "--model.sampling.group_size",
            "3",
            "--model.sampling.max_new_tokens",
            "4",
            "--data.batch_size",
            "2",
            "--data.num_train",
            "8",
            "--data.num_val",
            "2",
            "--trainer.max_steps",
            "3",
            "--trainer.limit_val_batches",
            "0",
            "--validate_before_fit",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(root),
            "--trainer.logger.init_args.save_dir",
            str(root),
            "--trainer.callbacks.dirpath",
            str(root / "ckpt"),
            "--completions.first_steps",
            "1",
            "--completions.every_n_steps",
            "3",
            "--completions.jsonl",
            "true",
        ]
    )
    return root / "grpo" / "version_0"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_fit_writes_tables_to_tensorboard_at_the_scheduled_steps(fit_logs):
    events = EventAccumulator(str(fit_logs), size_guidance={"tensors": 0})
    events.Reload()
    summaries = events.Tensors("completions/text_summary")
    tables = {event.step: event.tensor_proto.string_val[0].decode() for event in summaries}
    # beside the metrics of the same update, logged at the optimizer steps taken after it
    rewards = {event.step for event in events.Scalars("reward")} if "reward" in events.Tags()["scalars"] else None
    assert sorted(tables) == [1, 3] and (rewards is None or {1, 3} <= rewards)
    lines = tables[3].splitlines()
    assert lines[0] == "6 of 6 completions (2 prompts x 3)"
    assert lines[2] == "| prompt | completion | parity\\_reward | sometimes\\_none\\_reward | reward | advantage |"
    assert len(lines) == 4 + 6 and all(line.count(" | ") == 5 for line in lines[4:])


def test_the_jsonl_file_holds_every_completion_of_every_step_in_the_report_format(fit_logs):
    rows = read_jsonl(fit_logs / "completions.jsonl")
    assert len(rows) == 3 * 2 * 3  # steps x prompts x group_size
    assert all(set(row) == KEYS for row in rows)
    assert [row["step"] for row in rows] == [step for step in range(3) for _ in range(6)]
    assert [row["group"] for row in rows] == [group for _ in range(3) for group in range(2) for _ in range(3)]
    assert all(set(row["rewards"]) == {"parity_reward", "sometimes_none_reward"} for row in rows)
    assert all(isinstance(row["prompt"], str) and "+" in row["prompt"] for row in rows)
    assert all(isinstance(row["completion"], str) and isinstance(row["truncated"], bool) for row in rows)
    for row in rows:
        nulls = len(row["completion"]) % 3 == 0
        assert (row["rewards"]["sometimes_none_reward"] is None) == nulls
        scores = [row["rewards"][name] or 0.0 for name in ("parity_reward", "sometimes_none_reward")]
        assert row["reward"] == pytest.approx(sum(w * s for w, s in zip(WEIGHTS, scores)))


def test_each_groups_advantages_are_its_normalised_rewards(fit_logs):
    rows = read_jsonl(fit_logs / "completions.jsonl")
    for start in range(0, len(rows), 3):
        group = rows[start : start + 3]
        rewards = [row["reward"] for row in group]
        mean, std = statistics.mean(rewards), statistics.stdev(rewards)
        advantages = [row["advantage"] for row in group]
        assert sum(advantages) == pytest.approx(0.0, abs=1e-5)
        assert advantages == pytest.approx([(r - mean) / (std + 1e-4) for r in rewards], abs=1e-5)


# ---------------------------------------------------------------- options


def test_the_options_are_one_group_on_the_command_line_with_tables_on_and_jsonl_off():
    args = [*BASE, "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", "some/model"]
    cli = GRPOLightningCLI(args=args, run=False)
    (log,) = [c for c in cli.trainer.callbacks if isinstance(c, CompletionLog)]
    assert (log.every_n_steps, log.first_steps, log.max_rows, log.max_chars, log.jsonl) == (50, 5, 16, 400, False)
    cli = GRPOLightningCLI(args=[*args, "--completions.jsonl", "out/c.jsonl", "--completions.max_rows", "0"], run=False)
    (log,) = [c for c in cli.trainer.callbacks if isinstance(c, CompletionLog)]
    assert (log.jsonl, log.max_rows) == ("out/c.jsonl", 0)


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("every_n_steps", "0", "completions.every_n_steps: must be 1 or more (got 0)"),
        ("first_steps", "-1", "completions.first_steps: must be 0 or more"),
        ("max_rows", "-2", "completions.max_rows"),
        ("max_chars", "3", "completions.max_chars: must be at least 8"),
    ],
)
def test_a_wrong_option_is_one_line_naming_it(option, value, words, capsys):
    args = [*BASE, "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", "some/model"]
    with pytest.raises(SystemExit) as done:
        main(["fit", *args, f"--completions.{option}", value], report_errors=True)
    assert done.value.code == 2
    assert words in capsys.readouterr().err


def test_an_empty_jsonl_path_is_an_error():
    with pytest.raises(ConfigError, match="completions.jsonl: give true, false or a file path"):
        CompletionLog(jsonl="")


# ---------------------------------------------------------------- the pieces, by hand


def test_the_schedule_is_the_first_steps_then_every_n():
    steps = [s for s in range(200) if is_table_step(s, every_n_steps=50, first_steps=5)]
    assert steps == [0, 1, 2, 3, 4, 49, 99, 149, 199]
    assert [s for s in range(7) if is_table_step(s, every_n_steps=3, first_steps=0)] == [2, 5]
    assert [s for s in range(4) if is_table_step(s, every_n_steps=1, first_steps=0)] == [0, 1, 2, 3]


def test_a_markdown_cell_shows_the_text_as_written_on_one_line():
    assert markdown_cell("a|b") == "a\\|b"
    assert markdown_cell("line 1\nline 2\r\nline 3") == "line 1<br>line 2<br>line 3"
    assert markdown_cell("<think>x & y</think>") == "&lt;think&gt;x &amp; y&lt;/think&gt;"
    assert markdown_cell("\\boxed{3*4}") == "\\\\boxed{3\\*4}"
    assert markdown_cell("a_b `c` [d]") == "a\\_b \\`c\\` \\[d\\]"


def test_long_texts_keep_their_start_and_end_around_an_ellipsis():
    assert shorten("abcdef", 6) == "abcdef"
    assert shorten("abcdefghij", 8) == "abcd…hij"
    assert len(shorten("x" * 1000, 400)) == 400


def test_a_chat_prompt_is_its_last_user_message():
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": [{"type": "text", "text": "2+2="}]},
    ]
    assert prompt_text(chat) == "2+2="
    assert prompt_text(chat[:2]) == "1+1="
    assert prompt_text("3+3=") == "3+3="


def hand_rollout() -> Rollout:
    """2 prompts x 2 completions, two reward functions, the second without a score for one."""
    return Rollout(
        group_size=2, prompt_ids=torch.zeros(4, 1), prompt_mask=torch.ones(4, 1),
        completion_ids=torch.zeros(4, 2), completion_mask=torch.ones(4, 2),
        truncated=torch.tensor([False, True, False, False]),
        prompts=["1+1=", "1+1=", *[[{"role": "system", "content": "s"}, {"role": "user", "content": "a|b"}]] * 2],
        completions=["2", "11", "x\ny", "z"],
        rewards=torch.tensor([1.5, 0.0, 1.0, 0.0]),
        reward_per_function=torch.tensor([[1.0, 1.0], [0.0, float("nan")], [1.0, 0.0], [0.0, 0.0]]),
    )  # fmt: skip


def test_records_give_each_completion_its_scores_with_null_for_none():
    rows = completion_records(hand_rollout(), torch.tensor([0.7, -0.7, 0.7, -0.7]), ["acc", "fmt"], step=4)
    assert rows[1] == {
        "step": 4, "group": 0, "prompt": "1+1=", "completion": "11", "rewards": {"acc": 0.0, "fmt": None},
        "reward": 0.0, "advantage": pytest.approx(-0.7), "truncated": True,
    }  # fmt: skip
    assert [row["group"] for row in rows] == [0, 0, 1, 1] and rows[2]["prompt"] == "a|b"
    assert len(completion_records(hand_rollout(), torch.zeros(4), ["acc", "fmt"], step=0, limit=3)) == 3


def test_the_table_has_a_row_per_completion_shown_and_blank_cells_for_none():
    rows = completion_records(hand_rollout(), torch.tensor([0.7, -0.7, 0.7, -0.7]), ["acc", "fmt"], step=0, limit=3)
    table = completion_table(rows, ["acc", "fmt"], max_chars=20, total=4, group_size=2).splitlines()
    assert table == [
        "3 of 4 completions (2 prompts x 2)",
        "",
        "| prompt | completion | acc | fmt | reward | advantage |",
        "|---|---|---|---|---|---|",
        "| 1+1= | 2 | 1 | 1 | 1.5 | 0.7 |",
        "| 1+1= | 11 | 0 |  | 0 | -0.7 |",
        "| a\\|b | x<br>y | 1 | 0 | 1 | 0.7 |",
    ]


def test_a_resumed_fit_keeps_the_lines_of_the_steps_before_its_checkpoint(tmp_path):
    path = tmp_path / "completions.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"step": 2, "cut')
    keep_steps_before(path, 2)
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'
    keep_steps_before(path, 0)
    assert path.read_text() == ""


# ---------------------------------------------------------------- the callback with stand-in trainers


class TextExperiment:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        assert tag == "completions"
        self.steps.append(global_step)


def stand_ins(tmp_path, loggers_write: bool = True):
    """A trainer with a text-capable logger and a logger without ``add_text``, and a module."""
    experiment = TextExperiment()
    trainer = SimpleNamespace(
        global_step=0, is_global_zero=True, log_every_n_steps=1,
        loggers=[SimpleNamespace(experiment=object(), save_dir=str(tmp_path)), SimpleNamespace(experiment=experiment)],
        _logger_connector=SimpleNamespace(should_update_logs=loggers_write),
    )  # fmt: skip
    module = SimpleNamespace(last_rollout=None, last_advantages=None, reward_functions=[("acc", None), ("fmt", None)])
    return trainer, module, experiment


def run_batch(log: CompletionLog, trainer, module, rollout: Rollout | None, optimizer_steps: int = 1) -> None:
    """One training batch: an update on ``rollout`` of ``optimizer_steps`` steps, or none (``None``)."""
    log.on_train_batch_start(trainer, module, None, 0)
    if rollout is not None:
        module.last_rollout, module.last_advantages = rollout, torch.zeros(len(rollout))
        trainer.global_step += optimizer_steps
    log.on_train_batch_end(trainer, module, None, None, 0)


def test_a_batch_without_update_logs_nothing_and_loggers_without_text_are_skipped(tmp_path):
    trainer, module, experiment = stand_ins(tmp_path)
    log = CompletionLog(jsonl=True, first_steps=10)
    log.on_train_start(trainer, module)
    for rollout in (None, hand_rollout(), None, None, hand_rollout()):
        run_batch(log, trainer, module, rollout)
    assert experiment.steps == [1, 2]
    assert [row["step"] for row in read_jsonl(tmp_path / "completions.jsonl")] == [0] * 4 + [1] * 4


def test_tables_come_only_with_logged_metrics_and_the_jsonl_file_gets_every_step(tmp_path):
    trainer, module, experiment = stand_ins(tmp_path, loggers_write=False)
    log = CompletionLog(jsonl=str(tmp_path / "sub" / "all.jsonl"))
    log.on_train_start(trainer, module)
    run_batch(log, trainer, module, hand_rollout())
    assert experiment.steps == []
    assert len(read_jsonl(tmp_path / "sub" / "all.jsonl")) == 4


def test_tables_every_n_steps_that_logging_skips_are_warned_about(tmp_path):
    trainer, module, _ = stand_ins(tmp_path)
    trainer.log_every_n_steps = 20
    with pytest.warns(UserWarning, match="every 60 steps here; give a multiple of 20"):
        CompletionLog(every_n_steps=30).on_train_start(trainer, module)


def test_an_update_of_several_optimizer_steps_has_a_table_when_one_of_them_is_scheduled(tmp_path):
    trainer, module, experiment = stand_ins(tmp_path)
    log = CompletionLog(every_n_steps=8, first_steps=0)
    log.on_train_start(trainer, module)
    for _ in range(5):  # updates at steps 0-3, 4-7, 8-11, 12-15, 16-19
        run_batch(log, trainer, module, hand_rollout(), optimizer_steps=4)
    assert experiment.steps == [8, 16]  # steps 7 and 15 scheduled; each table at its update's logged step
