"""Bad data fails before training with the file and line, or the split and row, and the fix; prompts
too long for the model's context are refused, left-truncated or dropped as ``data.long_prompts`` says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import Dataset

from grpo_lightning.data import PromptDataModule
from grpo_lightning.data.checks import fit_prompts
from grpo_lightning.quickstart.tiny import build_char_tokenizer
from grpo_lightning.training.settings import check_datasets
from grpo_lightning.errors import ConfigError

GOOD = b'{"prompt": "1+1=", "answer": "2"}\n'


def setup_error(path: Path, **kwargs) -> str:
    """The message of the :class:`ConfigError` that loading ``path`` for a fit raises."""
    data = PromptDataModule(path=str(path), val_split=None, batch_size=1, **kwargs)
    with pytest.raises(ConfigError) as raised:
        data.setup("fit")
    return str(raised.value)


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# --- files ---------------------------------------------------------------------------------------


def test_a_malformed_jsonl_line_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD + b'{"prompt": "2+2=", "answer": \n' + GOOD)
    message = setup_error(path)
    assert str(path) in message and "line 2" in message and "not valid JSON" in message


def test_a_jsonl_line_that_is_not_an_object_names_the_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD + GOOD + b"[1, 2]\n")
    assert "line 3: a JSON list, not an object" in setup_error(path)


def test_blank_lines_of_a_jsonl_file_are_not_rows(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD + b"\n   \n" + GOOD)
    data = PromptDataModule(path=str(path), val_split=None, batch_size=1)
    data.setup("fit")
    assert len(data.train_dataset) == 2


@pytest.mark.parametrize(
    ("name", "latin1"),
    [("train.jsonl", GOOD + b'{"prompt": "caf\xe9", "answer": "2"}\n'), ("train.csv", b"prompt,answer\ncaf\xe9,2\n")],
)
def test_bytes_that_are_not_utf8_name_the_file_line_and_byte(tmp_path, name, latin1):
    path = tmp_path / name
    path.write_bytes(latin1)
    message = setup_error(path)
    assert str(path) in message and "line 2" in message and "0xe9" in message and "UTF-8" in message


def test_a_malformed_json_array_names_the_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[\n  {"prompt": "1+1=", "answer": "2"},\n  {"prompt": "2+2=" "answer": "4"}\n]\n')
    assert "line 3: not valid JSON" in setup_error(path)


def test_a_file_the_reader_refuses_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text('prompt,answer\n1+1=,2\n"2+2=,4\n')  # a quote never closed
    message = setup_error(path)
    assert str(path) in message and "could not be read as csv" in message


@pytest.mark.parametrize("name", ["train.jsonl", "train.json"])
def test_json_nested_too_deeply_to_read_names_the_file(tmp_path, name):
    """100,000 levels: past the recursion limit of Python's JSON reader, which raised RecursionError."""
    path = tmp_path / name
    deep = "[" * 100_000 + "]" * 100_000
    path.write_bytes(GOOD + b'{"prompt": "2+2=", "answer": ' + deep.encode() + b"}\n")
    message = setup_error(path)
    assert str(path) in message and "nested too deeply" in message
    if name == "train.jsonl":
        assert "line 2" in message


# --- rows ----------------------------------------------------------------------------------------


def test_an_empty_prompt_names_the_split_the_file_and_the_row(tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2"}] * 2 + [{"prompt": " ", "answer": "3"}]
    path = write_rows(tmp_path / "train.jsonl", rows)
    message = setup_error(path)
    assert f"split 'train' (file {str(path)!r}): row 2 (0-based) has an empty prompt in column 'prompt'" in message
    assert "fill in or remove" in message


def test_a_missing_prompt_is_named_with_how_many_rows_lack_one(tmp_path):
    rows = [{"question": "1+1=", "answer": "2"}, {"answer": "3"}, {"question": "", "answer": "4"}]
    message = setup_error(write_rows(tmp_path / "train.jsonl", rows), prompt_column="question")
    assert "row 1 (0-based) (and 1 more rows) has no prompt in column 'question'" in message


def test_a_chat_prompt_without_content_is_empty(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"},
            {"prompt": [{"role": "user", "content": ""}], "answer": "3"}]  # fmt: skip
    assert "row 1 (0-based) has an empty prompt" in setup_error(write_rows(tmp_path / "train.jsonl", rows))


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [
        ([1, 2, 3], "a list prompt (its message 0 is an int, not a chat message)"),
        ([{"content": "1+1="}], "a list prompt (its message 0 has no 'role')"),
        ([{"role": "user", "content": "hi"}, {"role": "user"}], "a list prompt (its message 1 has no text 'content')"),
        (7, "an int"),
    ],
    ids=["numbers", "no-role", "no-content", "number"],
)
def test_a_prompt_that_is_neither_text_nor_chat_messages_names_the_file_and_the_row(tmp_path, prompt, problem):
    """Checked with the rows, not in the chat template once the model is loaded."""
    path = write_rows(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": prompt, "answer": "2"}])
    message = setup_error(path)
    assert f"split 'train' (file {str(path)!r}): row 1 (0-based) has {problem} in column 'prompt'" in message


def test_well_formed_chat_prompts_pass_the_row_check(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}], "answer": "2"},
            {"prompt": [{"role": "user", "content": [{"type": "text", "text": "2+2="}]}], "answer": "4"}]  # fmt: skip
    data = PromptDataModule(path=str(write_rows(tmp_path / "train.jsonl", rows)), val_split=None, batch_size=1)
    data.setup("fit")
    assert len(data.train_dataset) == 2


def test_a_validation_set_is_checked_like_the_training_split(tmp_path):
    train = write_rows(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    extra = write_rows(tmp_path / "extra.jsonl", [{"question": "1+2=", "answer": "3"}])
    data = PromptDataModule(path=str(train), val_split=None, batch_size=1, val_sets={"extra": str(extra)})
    with pytest.raises(ConfigError) as raised:
        data.setup("fit")
    message = str(raised.value)
    assert "data.prompt_column='prompt'" in message and "data.val_sets.extra" in message
    assert "available columns: ['question', 'answer']" in message


def test_a_validation_set_of_several_splits_without_validation_is_refused(tmp_path):
    """A folder of train.jsonl and test.jsonl (or a saved dataset of train and test) named as a validation
    set: no split is guessed, since the first could be the training split."""
    from datasets import Dataset, DatasetDict

    train = write_rows(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    bench = tmp_path / "bench"
    bench.mkdir()
    write_rows(bench / "train.jsonl", [{"prompt": "TRAIN", "answer": "1"}])
    write_rows(bench / "test.jsonl", [{"prompt": "TEST", "answer": "1"}])
    saved = tmp_path / "saved"
    DatasetDict({"train": Dataset.from_list([{"prompt": "TRAIN", "answer": "1"}]),
                 "test": Dataset.from_list([{"prompt": "TEST", "answer": "1"}])}).save_to_disk(str(saved))  # fmt: skip
    for folder in (bench, saved):
        data = PromptDataModule(path=str(train), val_split=None, batch_size=1, val_sets={"bench": str(folder)})
        with pytest.raises(ConfigError, match=r"data.val_sets.bench=.* has the splits \['test', 'train'\] and none "
                                              r"named 'validation'.*point data.val_sets.bench at that split's own file"):
            data.setup("validate")
        # so are val_path and test_path (which took the training split here)
        data = PromptDataModule(path=str(train), val_path=str(folder), batch_size=1)
        with pytest.raises(ConfigError, match=r"data.val_path=.* has the splits \['test', 'train'\] and none named "
                                              "'validation'"):  # fmt: skip
            data.setup("validate")
        data = PromptDataModule(path=str(train), test_path=str(saved / "train"), val_split=None, batch_size=1)
        data.setup("test")  # one split: taken
        assert data.test_dataset["prompt"] == ["TRAIN"]
    data = PromptDataModule(path=str(train), test_path=str(bench), val_split=None, batch_size=1)
    data.setup("test")  # its test split
    assert data.test_dataset["prompt"] == ["TEST"]
    # its own file, a folder with a validation split, or a folder of one split are taken
    write_rows(bench / "validation.jsonl", [{"prompt": "VALIDATION", "answer": "1"}])
    for path, prompt in ((bench / "test.jsonl", "TEST"), (bench, "VALIDATION")):
        data = PromptDataModule(path=str(train), val_split=None, batch_size=1, val_sets={"bench": str(path)})
        data.setup("validate")
        assert data.extra_val_datasets["bench"]["prompt"] == [prompt]


# --- prompts longer than the model's context ------------------------------------------------------

CONTEXT, MAX_NEW_TOKENS = 32, 8  # 24 tokens of prompt fit; the tokenizer has one token per character
LONG = "1234567890" * 3  # 30 tokens


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def prompt_data(tmp_path: Path, prompts: list, long_prompts: str = "error", batch_size: int = 2) -> PromptDataModule:
    rows = [{"question": prompt, "answer": "0"} for prompt in prompts]
    data = PromptDataModule(path=str(write_rows(tmp_path / "train.jsonl", rows)), prompt_column="question",
                            val_split=None, batch_size=batch_size, long_prompts=long_prompts)  # fmt: skip
    data.setup("fit")
    return data


def check(data: PromptDataModule, tokenizer) -> None:
    """What the module does when the fit starts, with prompts as they are (no chat template)."""
    check_datasets(data, tokenizer, str, CONTEXT, MAX_NEW_TOKENS, group_size=2, minibatch_size=None)


def test_a_fit_whose_devices_loaded_other_training_prompts_is_refused(tmp_path):
    """Each device trains on its share of one order of the rows, so the rows must be the same on all.
    The two ranks are a stand-in (their gather returns both digests): a run of two processes whose data
    differs by process needs a task that does so, and the sweep and strategy tests run two processes."""
    import torch
    from types import SimpleNamespace

    from grpo_lightning.training.settings import check_same_rows_on_every_device, rows_digest

    data = prompt_data(tmp_path, ["1+1=", "2+2="])
    other = rows_digest(data.train_dataset.select([1, 0]), "question")  # the same prompts in another order
    assert other != rows_digest(data.train_dataset, "question")

    def trainer(second_rank: int) -> SimpleNamespace:
        gather = lambda mine: torch.stack([mine, torch.tensor([second_rank])])  # noqa: E731
        return SimpleNamespace(world_size=2, strategy=SimpleNamespace(root_device=torch.device("cpu"), all_gather=gather))

    check_same_rows_on_every_device(trainer(rows_digest(data.train_dataset, "question")), data.train_dataset, "question")
    with pytest.raises(ConfigError, match="data: the processes of this fit loaded other training prompts .rank 0's "
                                          "differ from rank 1's.*set PYTHONHASHSEED=0"):  # fmt: skip
        check_same_rows_on_every_device(trainer(other), data.train_dataset, "question")


def test_a_prompt_too_long_for_the_context_is_an_error_by_default(tmp_path, tokenizer):
    data = prompt_data(tmp_path, ["1+1=", LONG, "2+2="])
    with pytest.raises(ConfigError) as raised:
        check(data, tokenizer)
    message = str(raised.value)
    assert "1 of 3 prompts of the train split are longer than 24 tokens" in message
    assert "row 1, has 30" in message and "--data.long_prompts truncate" in message and "max_new_tokens" in message


def test_truncate_keeps_the_end_of_a_long_prompt_and_warns_with_the_count(tmp_path, tokenizer):
    data = prompt_data(tmp_path, ["1+1=", LONG, "2+2="], long_prompts="truncate")
    with pytest.warns(UserWarning, match="cut 1 of 3 prompts of the train split"):
        check(data, tokenizer)
    assert data.train_dataset["question"] == ["1+1=", LONG[-24:], "2+2="]


def test_skip_drops_the_long_prompts_and_warns_with_the_count(tmp_path, tokenizer):
    data = prompt_data(tmp_path, ["1+1=", LONG, "2+2=", LONG + "0"], long_prompts="skip")
    with pytest.warns(UserWarning, match="dropped 2 of 4 prompts of the train split"):
        check(data, tokenizer)
    assert data.train_dataset["question"] == ["1+1=", "2+2="]


def test_skip_that_leaves_less_than_a_batch_is_an_error(tmp_path, tokenizer):
    data = prompt_data(tmp_path, ["1+1=", LONG, LONG], long_prompts="skip")
    with pytest.raises(ConfigError, match="data.batch_size=2 is larger than the 1 training prompts left"):
        check(data, tokenizer)


def test_truncating_a_chat_keeps_its_other_messages_and_the_end_of_the_last(tokenizer):
    def format_chat(messages):  # a template of its own: "(" and ")" around each message
        return "".join(f"({message['content']})" for message in messages)

    chat = [{"role": "system", "content": "0"}, {"role": "user", "content": LONG}]
    dataset = Dataset.from_dict({"prompt": [chat]})
    with pytest.warns(UserWarning, match="cut 1 of 1 prompts"):
        fitted = fit_prompts(dataset, "prompt", tokenizer, format_chat, CONTEXT, MAX_NEW_TOKENS, "truncate", "val")
    (kept,) = fitted["prompt"]
    assert kept[0] == chat[0] and LONG.endswith(kept[1]["content"])
    assert len(format_chat(kept)) == CONTEXT - MAX_NEW_TOKENS  # (0)(...) fills the 24 tokens exactly


def test_a_max_new_tokens_that_fills_the_context_is_an_error(tmp_path, tokenizer):
    data = prompt_data(tmp_path, ["1+1=", "2+2="])
    with pytest.raises(ConfigError, match="sampling.max_new_tokens: 32 leaves no room for a prompt"):
        check_datasets(data, tokenizer, str, CONTEXT, CONTEXT, group_size=2, minibatch_size=None)


def test_long_prompts_takes_only_error_truncate_or_skip():
    with pytest.raises(ConfigError, match="data.long_prompts: must be one of 'error', 'truncate', 'skip'"):
        PromptDataModule(long_prompts="cut")
