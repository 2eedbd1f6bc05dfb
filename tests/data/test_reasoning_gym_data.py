"""reasoning-gym's tasks as a data module: seeded rows carrying what the task's scorer needs, validation
prompts that are never training prompts, and a fit through the real CLI on its config."""

from __future__ import annotations

import warnings

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym", reason="needs the reasoning extra (pip install 'grpo-lightning[reasoning]')")

from grpo_lightning.cli.app import GRPOLightningCLI  # noqa: E402
from grpo_lightning.cli.resources import config_dir  # noqa: E402
from grpo_lightning.data import ReasoningGymDataModule, make_reasoning_gym_dataset  # noqa: E402
from grpo_lightning.errors import ConfigError  # noqa: E402
from grpo_lightning.rewards import reasoning_gym_correct, reasoning_gym_reward  # noqa: E402
from grpo_lightning.rewards.reasoning_gym import entry_from_json  # noqa: E402

CONFIGS = config_dir()
#: One-digit sums of two terms: 200 problems, so a second seed alone would repeat training prompts.
SMALL_SPACE = {"min_terms": 2, "max_terms": 2, "max_digits": 1}


def test_validation_prompts_are_never_training_prompts_even_in_a_small_problem_space():
    splits = make_reasoning_gym_dataset("chain_sum", SMALL_SPACE, num_train=100, num_val=40, chat=False)
    train, validation = set(splits["train"]["prompt"]), splits["validation"]["prompt"]
    assert len(validation) == 40 and len(set(validation)) == 40
    assert not train & set(validation)


def test_the_same_arguments_give_the_same_rows_and_another_seed_other_ones():
    first = make_reasoning_gym_dataset("basic_arithmetic", num_train=20, num_val=5, seed=3)
    again = make_reasoning_gym_dataset("basic_arithmetic", num_train=20, num_val=5, seed=3)
    other = make_reasoning_gym_dataset("basic_arithmetic", num_train=20, num_val=5, seed=4)
    for split in ("train", "validation"):
        assert first[split].to_list() == again[split].to_list()
    assert first["train"]["prompt"] != other["train"]["prompt"]


def test_a_task_that_does_not_repeat_itself_for_its_seed_is_warned_of():
    """reasoning-gym's list_functions draws from an unseeded source: two runs would train on other problems."""
    with pytest.warns(UserWarning, match="data.task='list_functions' gives other problems each time for the same task_seed"):
        ReasoningGymDataModule(task="list_functions", num_train=4, num_val=0, batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a task that repeats itself: no warning
        ReasoningGymDataModule(task="gcd", num_train=4, num_val=0, batch_size=2)


def test_each_row_carries_the_task_its_options_and_reasoning_gyms_entry():
    row = make_reasoning_gym_dataset("chain_sum", SMALL_SPACE, num_train=3, num_val=1, seed=5)["train"][1]
    expected = reasoning_gym.create_dataset("chain_sum", seed=5, size=3, **SMALL_SPACE)[1]
    assert entry_from_json(row["entry"]) == expected  # the difficulty ranges stay tuples
    assert row["answer"] == expected["answer"] and row["task"] == "chain_sum"
    assert reasoning_gym_reward([row["prompt"]], [f"<answer>{row['answer']}</answer>"], entry=[row["entry"]],
                                task=[row["task"]], task_config=[row["task_config"]]) == [1.0]  # fmt: skip


def test_a_task_with_many_right_answers_has_no_reference_answer_but_its_entry():
    """propositional_logic's scorer checks a conclusion against the premises: there is no one answer."""
    row = make_reasoning_gym_dataset("propositional_logic", num_train=1, num_val=1)["train"][0]
    assert row["answer"] is None and entry_from_json(row["entry"])["metadata"]["premises"]


def test_chat_prompts_are_the_system_prompt_then_the_question_and_plain_ones_text():
    question = reasoning_gym.create_dataset("chain_sum", seed=0, size=1)[0]["question"]
    chat = make_reasoning_gym_dataset("chain_sum", num_train=1, num_val=1)["train"][0]["prompt"]
    assert chat == [{"role": "system", "content": reasoning_gym.utils.SYSTEM_PROMPTS["default"]},
                    {"role": "user", "content": question}]  # fmt: skip
    plain = make_reasoning_gym_dataset("chain_sum", num_train=1, num_val=1, chat=False, system_prompt="Be brief.")
    assert plain["train"][0]["prompt"] == f"Be brief.\n\n{question}"
    bare = make_reasoning_gym_dataset("chain_sum", num_train=1, num_val=1, chat=False, system_prompt=None)
    assert bare["train"][0]["prompt"] == question


def test_rows_carry_how_an_untagged_answer_is_read_and_a_wrong_value_is_an_error():
    rows = make_reasoning_gym_dataset("chain_sum", num_train=2, num_val=1, untagged_answer="last_number")["train"]
    assert rows["untagged_answer"] == ["last_number", "last_number"]
    columns = {key: rows[key] for key in ("entry", "task", "task_config", "untagged_answer")}
    assert reasoning_gym_correct(rows["prompt"], [f"It is {a}." for a in rows["answer"]], **columns) == [1.0, 1.0]
    with pytest.raises(ConfigError, match=r"data.untagged_answer='last': give one of whole, last_number"):
        ReasoningGymDataModule("chain_sum", num_train=2, num_val=1, untagged_answer="last")


def test_an_unknown_task_is_an_error_suggesting_the_nearest():
    with pytest.raises(ConfigError, match=r"data.task='chain_summ' is not a reasoning-gym task; did you mean chain_sum"):
        ReasoningGymDataModule(task="chain_summ")


def test_an_option_the_task_lacks_is_an_error_listing_its_fields():
    with pytest.raises(ConfigError, match=r"data.task_config=.*'max_term'.*its fields: .*max_terms"):
        ReasoningGymDataModule(task="chain_sum", task_config={"max_term": 3})


def test_too_few_unseen_validation_problems_is_an_error_naming_num_val():
    with pytest.raises(ConfigError, match=r"data.num_val=150: .* lower --data.num_val"):
        make_reasoning_gym_dataset("chain_sum", SMALL_SPACE, num_train=100, num_val=150)


def test_a_cli_fit_on_its_config_trains_and_validates_with_reasoning_gyms_scorer(tiny_model_dir, tmp_path,
                                                                                one_torch_thread):
    args = [
        "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "variant/grpo.yaml"),
        "--config", str(CONFIGS / "data/reasoning_gym.yaml"),
        "--data", "grpo_lightning.data.ReasoningGymDataModule", "--data.task", "chain_sum",
        "--data.chat", "false", "--data.system_prompt", "null",  # the tiny model has no chat template
        "--model.model", tiny_model_dir, "--model.sampling.group_size", "2", "--model.sampling.max_new_tokens", "4",
        "--model.evaluation.max_new_tokens", "4",
        "--data.batch_size", "2", "--data.num_train", "4", "--data.num_val", "2", "--data.val_batch_size", "2",
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
        "--trainer.callbacks.dirpath", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert not [w for w in caught if "not scored by its own scorer" in str(w.message)]
    assert cli.model.accuracy_function[1] is reasoning_gym_correct
    assert [function for _, function in cli.model.reward_functions] == [reasoning_gym_reward]
    assert "val/accuracy" in cli.trainer.callback_metrics


def test_a_run_scoring_the_task_otherwise_is_warned_of_with_both_options(tiny_model_dir, tmp_path, one_torch_thread):
    args = [
        "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "variant/grpo.yaml"),
        "--data", "grpo_lightning.data.ReasoningGymDataModule", "--data.task", "chain_sum", "--data.chat", "false",
        "--data.system_prompt", "null", "--data.num_train", "2", "--data.num_val", "2", "--data.val_batch_size", "2",
        "--model.model", tiny_model_dir, "--model.evaluation.max_new_tokens", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger.init_args.save_dir", str(tmp_path),
    ]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)  # accuracy_reward for the rewards and val/accuracy
    with pytest.warns(UserWarning, match=r"task 'chain_sum' is not scored by its own scorer in --model.rewards.funcs "
                                         r"nor --model.evaluation.accuracy_func; give .*reasoning_gym_reward.*reasoning_gym_correct"):
        cli.trainer.validate(cli.model, datamodule=cli.datamodule)
