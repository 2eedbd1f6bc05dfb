"""Tests for the arithmetic task and the prompt data modules."""

from __future__ import annotations

import logging

import json
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict

from grpo_lightning.data import ArithmeticDataModule, PromptDataModule, format_target, make_arithmetic_dataset

ROWS = [{"question": f"q{i}", "solution": str(i), "level": i % 3} for i in range(10)]


def write_jsonl(path: Path, rows: list[dict] = ROWS) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def module(path: Path | str, **kwargs) -> PromptDataModule:
    defaults = {"prompt_column": "question", "answer_column": "solution", "val_split": None, "batch_size": 4}
    return PromptDataModule(path=str(path), **{**defaults, **kwargs})


# --- arithmetic task -------------------------------------------------------------------------


def test_arithmetic_dataset_has_requested_splits_sizes_and_columns():
    data = make_arithmetic_dataset(num_train=50, num_val=10)
    assert set(data) == {"train", "validation"}
    assert (len(data["train"]), len(data["validation"])) == (50, 10)
    assert data["train"].column_names == ["prompt", "answer"]


def test_arithmetic_answers_are_correct_for_every_operation():
    data = make_arithmetic_dataset(num_train=300, num_val=0, operations="+-*")
    for prompt, answer in zip(data["train"]["prompt"], data["train"]["answer"]):
        assert prompt.endswith("=")
        assert eval(prompt[:-1]) == int(answer)


def test_arithmetic_subtraction_never_goes_negative():
    data = make_arithmetic_dataset(num_train=200, num_val=0, operations="-")
    assert all(int(answer) >= 0 for answer in data["train"]["answer"])


def test_arithmetic_operands_stay_within_digit_range():
    data = make_arithmetic_dataset(num_train=200, num_val=0, digits=1, operations="+*")
    for prompt in data["train"]["prompt"]:
        operands = prompt[:-1].replace("*", "+").split("+")
        assert all(0 <= int(operand) <= 9 for operand in operands)


def test_arithmetic_dataset_is_deterministic_for_a_seed():
    first = make_arithmetic_dataset(num_train=40, num_val=10, seed=3)
    second = make_arithmetic_dataset(num_train=40, num_val=10, seed=3)
    other = make_arithmetic_dataset(num_train=40, num_val=10, seed=4)
    assert list(first["train"]["prompt"]) == list(second["train"]["prompt"])
    assert list(first["validation"]["prompt"]) == list(second["validation"]["prompt"])
    assert list(first["train"]["prompt"]) != list(other["train"]["prompt"])


@pytest.mark.parametrize("digits", [1, 2])  # 1: nearly the whole space is drawn; 2: a small part of it
def test_arithmetic_validation_prompts_are_disjoint_from_training(digits):
    data = make_arithmetic_dataset(num_train=110, num_val=40, digits=digits, operations="+-")
    assert not set(data["train"]["prompt"]) & set(data["validation"]["prompt"])


def test_arithmetic_can_use_the_whole_problem_space():
    data = make_arithmetic_dataset(num_train=90, num_val=10, digits=1, operations="+")
    prompts = list(data["train"]["prompt"]) + list(data["validation"]["prompt"])
    assert len(set(prompts)) == 100


def test_arithmetic_rejects_sizes_beyond_the_problem_space():
    with pytest.raises(ValueError, match=r"exceeds the 100 distinct problems.*lower num_train"):
        make_arithmetic_dataset(num_train=95, num_val=10, digits=1, operations="+")


def test_arithmetic_rejects_unknown_operations():
    with pytest.raises(ValueError, match=r"operations='/'.*'\+-\*'"):
        make_arithmetic_dataset(operations="/")


def test_format_target_wraps_answer_in_tags():
    assert format_target("82") == "<answer>82</answer>"


# --- loading through PromptDataModule ----------------------------------------------------------


def test_constructing_a_data_module_does_not_touch_the_filesystem(tmp_path):
    data = module(tmp_path / "does_not_exist.jsonl")
    assert data.train_dataset is None


def test_loads_a_jsonl_file_as_the_train_split(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"))
    data.setup("fit")
    assert len(data.train_dataset) == 10


def test_loads_a_json_array_file(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(ROWS))
    data = module(path)
    data.setup("fit")
    assert list(data.train_dataset["question"]) == [row["question"] for row in ROWS]


def test_loads_a_csv_file(tmp_path):
    path = tmp_path / "rows.csv"
    Dataset.from_list(ROWS).to_csv(str(path), index=False)
    data = module(path)
    data.setup("fit")
    assert len(data.train_dataset) == 10


def test_loads_a_parquet_file(tmp_path):
    path = tmp_path / "rows.parquet"
    Dataset.from_list(ROWS).to_parquet(str(path))
    data = module(path)
    data.setup("fit")
    assert list(data.train_dataset["solution"])[3] == "3"


def test_loads_a_saved_dataset_dict_with_validation(tmp_path):
    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:3])}).save_to_disk(str(tmp_path))
    data = module(tmp_path, val_split="test")
    data.setup("fit")
    assert (len(data.train_dataset), len(data.val_dataset)) == (10, 3)


def test_loads_a_saved_single_dataset_as_the_train_split(tmp_path):
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path))
    data = module(tmp_path)
    data.setup("fit")
    assert len(data.train_dataset) == 10


def test_a_subclass_can_provide_data_by_overriding_load():
    class InMemory(PromptDataModule):
        def load(self) -> DatasetDict:
            return DatasetDict({"train": Dataset.from_list(ROWS)})

    data = InMemory(prompt_column="question", answer_column=None, val_split=None, batch_size=2)
    data.setup("fit")
    assert len(data.train_dataset) == 10


# --- batches -------------------------------------------------------------------------------------


def test_train_batches_hold_every_column_as_lists_plus_aliases(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"))
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert set(batch) == {"question", "solution", "level", "prompt", "answer"}
    assert all(isinstance(values, list) and len(values) == 4 for values in batch.values())
    assert batch["prompt"] == batch["question"] and batch["answer"] == batch["solution"]


def test_train_loader_drops_the_last_partial_batch(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"))
    data.setup("fit")
    assert [len(batch["prompt"]) for batch in data.train_dataloader()] == [4, 4]


def test_train_shuffle_is_determined_by_seed(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl")

    def first_epoch(seed: int) -> list[str]:
        data = module(path, seed=seed)
        data.setup("fit")
        return [prompt for batch in data.train_dataloader() for prompt in batch["prompt"]]

    assert first_epoch(1) == first_epoch(1)
    assert first_epoch(1) != first_epoch(2)


def test_validation_keeps_order_batch_size_and_max_samples(tmp_path, caplog):
    DatasetDict({"train": Dataset.from_list(ROWS), "validation": Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path))
    data = module(tmp_path, val_split="validation", val_batch_size=3, max_val_samples=7)
    with caplog.at_level(logging.INFO):
        data.setup("fit")
    assert f"data: validating on the first 7 of {len(ROWS)} rows (data.max_val_samples; null for all)." in caplog.text
    batches = list(data.val_dataloader())
    assert [len(batch["prompt"]) for batch in batches] == [3, 3, 1]
    assert [p for batch in batches for p in batch["prompt"]] == [f"q{i}" for i in range(7)]


def test_without_val_split_the_validation_loader_is_empty(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"))
    data.setup("fit")
    assert data.val_dataset is None and data.val_dataloader() == []


def test_without_answer_column_batches_have_no_answer_alias(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"), answer_column=None)
    data.setup("fit")
    assert "answer" not in next(iter(data.train_dataloader()))


def test_state_dict_round_trips_the_seed():
    source, target = PromptDataModule(seed=7), PromptDataModule(seed=0)
    target.load_state_dict(source.state_dict())
    assert target.seed == 7


def test_arithmetic_data_module_serves_the_arithmetic_task():
    data = ArithmeticDataModule(digits=1, num_train=20, num_val=5, batch_size=4, val_batch_size=5, task_seed=1)
    data.setup("fit")
    train_batch = next(iter(data.train_dataloader()))
    val_batch = next(iter(data.val_dataloader()))
    assert len(train_batch["prompt"]) == 4 and len(val_batch["prompt"]) == 5
    assert val_batch["prompt"] == list(make_arithmetic_dataset(20, 5, digits=1, seed=1)["validation"]["prompt"])


# --- configuration errors --------------------------------------------------------------------------


def test_missing_train_split_lists_splits_and_names_the_field(tmp_path):
    DatasetDict({"training": Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=r"data\.train_split='train'.*\['training'\].*set --data\.train_split"):
        module(tmp_path).setup("fit")


def test_missing_val_split_suggests_choosing_a_split_or_null(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"), val_split="validation")
    with pytest.raises(ValueError, match=r"data\.val_split='validation'.*\['train'\].*--data\.val_split null"):
        data.setup("fit")


def test_missing_prompt_column_lists_columns_and_names_the_field(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"), prompt_column="prompt")
    with pytest.raises(ValueError, match=r"data\.prompt_column='prompt'.*'question'.*set --data\.prompt_column"):
        data.setup("fit")


def test_missing_answer_column_suggests_a_column_or_null(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"), answer_column="answer")
    with pytest.raises(ValueError, match=r"data\.answer_column='answer'.*'solution'.*--data\.answer_column null"):
        data.setup("fit")


def test_empty_split_is_rejected():
    class WithEmptyValidation(PromptDataModule):
        def load(self) -> DatasetDict:
            empty = Dataset.from_dict({"prompt": [], "answer": []})
            return DatasetDict({"train": Dataset.from_dict({"prompt": ["a"], "answer": ["b"]}), "validation": empty})

    with pytest.raises(ValueError, match=r"'validation' \(data\.val_split\) has no rows.*set --data\.val_split"):
        WithEmptyValidation(batch_size=1).setup("fit")


def test_batch_size_below_one_is_rejected_at_construction():
    with pytest.raises(ValueError, match=r"data\.batch_size=0.*set --data\.batch_size"):
        PromptDataModule(batch_size=0)


def test_train_split_smaller_than_batch_size_is_rejected(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"), batch_size=11)
    with pytest.raises(ValueError, match=r"data\.batch_size=11.*10 rows.*set --data\.batch_size to at most 10"):
        data.setup("fit")


def test_unset_path_asks_for_data_path():
    with pytest.raises(ValueError, match=r"data\.path is not set; set --data\.path"):
        PromptDataModule().setup("fit")


def test_unsupported_file_extension_lists_supported_ones(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_text("hello")
    with pytest.raises(ValueError, match=r"data\.path=.*'\.txt'.*'\.jsonl'"):
        module(path).setup("fit")


# --- bringing your own files -----------------------------------------------------------------------


def test_a_folder_of_split_files_gives_train_and_validation(tmp_path):
    write_jsonl(tmp_path / "train.jsonl")
    write_jsonl(tmp_path / "validation.jsonl", ROWS[:3])
    data = module(tmp_path, val_split="auto")
    data.setup("fit")
    assert len(data.train_dataset) == len(ROWS) and len(data.val_dataset) == 3


def test_val_path_loads_a_separate_validation_file(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"), val_path=str(write_jsonl(tmp_path / "v.jsonl", ROWS[:2])))
    data.val_split = "auto"
    data.setup("fit")
    assert list(data.val_dataset["question"]) == ["q0", "q1"]


def test_auto_validation_without_a_validation_split_trains_without_one(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"), val_split="auto")
    with pytest.warns(UserWarning, match=r"no validation split.*--data\.val_path"):
        data.setup("fit")
    assert data.val_split is None and data.val_dataloader() == []


def test_a_missing_local_file_is_never_looked_up_on_the_hub(tmp_path, monkeypatch):
    import grpo_lightning.data.datamodule as datamodule

    monkeypatch.setattr(datamodule, "load_dataset", lambda *a, **k: pytest.fail("looked up on the hub"))
    for path in ("data/train.jsonl", str(tmp_path / "nope"), "./rows", "a/b/c"):
        with pytest.raises(ValueError, match=r"data\.path=.*no such file or folder"):
            module(path).setup("fit")


def test_an_empty_file_says_it_has_no_rows(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"data\.path=.*empty\.jsonl' is empty: it has no rows"):
        module(tmp_path / "empty.jsonl").setup("fit")


def test_a_folder_without_data_files_says_what_it_expects(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"data\.path=.*neither data files named by split.*train\.jsonl"):
        module(tmp_path).setup("fit")


def test_test_path_loads_the_test_split_and_a_missing_one_names_the_fix(tmp_path):
    data = module(write_jsonl(tmp_path / "rows.jsonl"), test_path=str(write_jsonl(tmp_path / "t.jsonl", ROWS[:2])))
    data.setup("test")
    assert list(data.test_dataset["question"]) == ["q0", "q1"] and len(list(data.test_dataloader())) == 1
    with pytest.raises(ValueError, match=r"data\.test_split='test' is not a split.*--data\.test_path"):
        module(tmp_path / "rows.jsonl").setup("test")


def test_arithmetic_template_writes_instruction_prompts_for_the_same_problems():
    terse = make_arithmetic_dataset(num_train=20, num_val=5, seed=1)
    worded = make_arithmetic_dataset(num_train=20, num_val=5, seed=1, template="What is {a} {op} {b}? Reply with only the number.")
    first = terse["train"][0]
    a, b = first["prompt"][:-1].split("+")
    assert worded["train"][0] == {"prompt": f"What is {a} + {b}? Reply with only the number.", "answer": first["answer"]}
    assert list(worded["validation"]["answer"]) == list(terse["validation"]["answer"])


@pytest.mark.parametrize(("template", "message"), [("{x}+{b}", "cannot be filled"), ("{a} plus one", "must contain {a} and {b}")])
def test_arithmetic_template_errors_name_the_field(template, message):
    with pytest.raises(ValueError, match=f"^template=.*{message}"):
        make_arithmetic_dataset(num_train=5, num_val=0, template=template)


def test_a_template_without_the_operation_is_refused_for_several_operations():
    """"Compute 3 and 4" for both 3+4 and 3*4: one prompt, two answers, and validation prompts in training."""
    with pytest.raises(ValueError, match=r"^template='Compute \{a\} and \{b\}: ' does not write the operation.*add \{op\}"):
        make_arithmetic_dataset(num_train=50, num_val=20, digits=1, operations="+*", template="Compute {a} and {b}: ")
    rows = make_arithmetic_dataset(num_train=50, num_val=20, digits=1, operations="+", template="Add {a} and {b}: ")
    assert len(set(rows["train"]["prompt"]) | set(rows["validation"]["prompt"])) == 70  # one operation: no {op} needed


def test_arithmetic_datamodule_passes_its_template_on():
    module = ArithmeticDataModule(num_train=4, num_val=2, template="Compute {a}{op}{b}.")
    assert all(p.startswith("Compute ") and p.endswith(".") for p in module.load()["train"]["prompt"])
