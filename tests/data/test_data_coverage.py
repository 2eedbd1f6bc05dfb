"""A prompt that loses characters to the tokenizer is named in one warning when a fit starts; a
tokenizer that reads every character (a byte-level BPE) raises none."""

from __future__ import annotations

import json
import warnings

import pytest
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from grpo_lightning.data.coverage import (
    SAMPLED_PROMPTS,
    lost_characters,
    lost_prompt_characters,
    read_back,
    sampled_rows,
    warn_lost_characters,
)
from grpo_lightning.data.arithmetic import make_arithmetic_dataset
from grpo_lightning.rollout.generation import format_prompt

QUESTION = "Which is larger, 27 or 82?"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2's byte alphabet, as SmolLM2's and Qwen2's) with a chat template's
    special tokens, built with the ``tokenizers`` library."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={symbol: i for i, symbol in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def word_tokenizer() -> PreTrainedTokenizerFast:
    """Whole words, and ``[UNK]`` for any other: what an unknown token loses."""
    backend = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "what": 1, "is": 2, "2+2?": 3}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


BYTE_LEVEL = byte_level_tokenizer()


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_tiny_models_tokenizer_drops_the_letters_of_a_question(tiny_tokenizer):
    [read] = read_back(tiny_tokenizer, [QUESTION])
    assert read == "  , 27  82"
    assert lost_characters(QUESTION, read) == "Whicslargeo?"


def test_the_tiny_models_tokenizer_reads_the_arithmetic_prompts_whole(tiny_tokenizer):
    prompts = make_arithmetic_dataset(num_train=200, num_val=10, operations="+-*")["train"]["prompt"]
    assert lost_prompt_characters(prompts, tiny_tokenizer, str) == []


def test_an_unknown_token_loses_its_characters():
    tokenizer = word_tokenizer()
    [(row, text, read, lost)] = lost_prompt_characters(["what is 2+2?", "what is 3+3?"], tokenizer, str, [7, 8])
    assert (row, read, lost) == (8, "what is", "3+?")


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=60))
def test_a_byte_level_tokenizer_loses_nothing_of_any_text(text):
    tokenizer = BYTE_LEVEL
    assert lost_prompt_characters([text], tokenizer, lambda p: format_prompt(tokenizer, p, True)) == []
    assert lost_prompt_characters([text], tokenizer, str) == []


def test_harmless_differences_are_not_losses():
    assert lost_characters("  a\tb\n\nc  ", "a b c") == ""  # whitespace
    assert lost_characters("ﬁ ½", "fi 1⁄2") == ""  # compatibility forms (NFKC)
    assert lost_characters("a-b", "a b") == "-"


def test_a_large_split_is_read_from_evenly_spread_rows(tiny_tokenizer):
    rows = sampled_rows(100_000)
    assert len(rows) == SAMPLED_PROMPTS and rows[0] == 0 and rows[-1] == 99_999
    assert sampled_rows(5) == [0, 1, 2, 3, 4]
    prompts = ["1+1="] * 100_000
    prompts[99_999] = QUESTION
    formatted = []
    split = Dataset.from_dict({"prompt": prompts})
    with pytest.warns(UserWarning, match=f"1 of {SAMPLED_PROMPTS} prompts checked in the train split.* row 99999,"):
        warn_lost_characters({"train": split}, "prompt", tiny_tokenizer, lambda p: formatted.append(p) or p)
    assert len(formatted) == SAMPLED_PROMPTS


def test_one_warning_names_the_split_row_and_lost_characters(tiny_tokenizer):
    train, val = Dataset.from_dict({"prompt": ["1+1=", QUESTION]}), Dataset.from_dict({"prompt": [QUESTION]})
    with pytest.warns(UserWarning) as caught:
        assert warn_lost_characters({"train": train, "val": val}, "prompt", tiny_tokenizer, str)
    [warning] = caught
    message = str(warning.message)
    assert "1 of 2 prompts checked in the train split" in message
    assert f"row 1, {QUESTION!r}, reaches it as '  , 27  82' (lost: 'Whicslargeo?')" in message
    assert "docs/bring_your_own" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_lost_characters({"train": train.select([0]), "val": None}, "prompt", tiny_tokenizer, str)


def test_a_fit_on_the_tiny_model_warns_once_about_a_question_it_cannot_read(tiny_model_dir, tmp_path, one_torch_thread):
    from grpo_lightning.cli.app import main

    rows = [{"prompt": QUESTION, "answer": "82"}, {"prompt": "12+30=", "answer": "42"}] * 2
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = [
        "fit", "--config", "trainer/cpu", "--model", "GRPO", "--model.model", tiny_model_dir,
        "--model.rewards.funcs", "[grpo_lightning.rewards.accuracy_reward]", "--model.sampling.group_size", "2",
        "--model.sampling.max_new_tokens", "2", "--data", "PromptDataModule", "--data.path", str(tmp_path),
        "--data.batch_size", "2", "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.callbacks.dirpath", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(args)
    lossy = [str(w.message) for w in caught if "loses characters" in str(w.message)]
    assert len(lossy) == 1, lossy
    assert "2 of 4 prompts checked in the train split" in lossy[0] and "row 0" in lossy[0]
