from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.quickstart.tiny import (
    TEXT_ALPHABET,
    build_char_tokenizer,
    build_word_level_tokenizer,
    check_tokenizer_roundtrip,
    save_tiny_model,
    save_tokenizer,
    tiny_config,
    word_token_ids,
)

SAMPLE = "37+45=<answer>82</answer>"
QUESTION = "Which is larger, 27 or 82?"


@pytest.fixture(scope="module")
def char_tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def saved_dir(request, tmp_path_factory, char_tokenizer) -> Path:
    path = tmp_path_factory.mktemp(request.param)
    config = tiny_config(char_tokenizer, model_type=request.param, hidden_size=32, intermediate_size=64)
    return save_tiny_model(path, char_tokenizer, config, seed=0)


def test_char_tokenizer_one_token_per_character_and_special_word(char_tokenizer):
    tokens = char_tokenizer.convert_ids_to_tokens(char_tokenizer.encode(SAMPLE, add_special_tokens=False))
    assert tokens == ["3", "7", "+", "4", "5", "=", "<answer>", "8", "2", "</answer>"]
    assert char_tokenizer.decode(char_tokenizer.encode(" (1 - 2) * 3, 4.5 ")) == " (1 - 2) * 3, 4.5 "
    assert char_tokenizer.pad_token == "<pad>" and char_tokenizer.eos_token == "</s>"
    assert char_tokenizer.bos_token == "<s>" and char_tokenizer.unk_token == "<unk>"
    assert char_tokenizer.chat_template is None
    assert "<answer>" not in char_tokenizer.all_special_tokens


def test_special_words_survive_skip_special_tokens(char_tokenizer):
    ids = char_tokenizer.encode(SAMPLE, add_special_tokens=False) + [char_tokenizer.eos_token_id]
    assert char_tokenizer.decode(ids, skip_special_tokens=True) == SAMPLE


def test_autotokenizer_round_trip(saved_dir, char_tokenizer):
    loaded = AutoTokenizer.from_pretrained(saved_dir)
    ids = char_tokenizer.encode(SAMPLE, add_special_tokens=False)
    assert loaded.encode(SAMPLE, add_special_tokens=False) == ids
    assert loaded.decode(ids) == SAMPLE
    assert loaded.convert_ids_to_tokens(ids)[6] == "<answer>"
    assert loaded.convert_ids_to_tokens(ids)[9] == "</answer>"
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        assert getattr(loaded, name) == getattr(char_tokenizer, name)
    assert len(loaded) == len(char_tokenizer)


@pytest.fixture(scope="module")
def text_tokenizer(tmp_path_factory):
    """The quickstart model's tokenizer as a user's checkpoint gives it: saved, then ``AutoTokenizer``."""
    path = tmp_path_factory.mktemp("text_tokenizer")
    save_tokenizer(build_char_tokenizer(TEXT_ALPHABET), path)
    return AutoTokenizer.from_pretrained(path)


def test_text_alphabet_is_printable_ascii_newline_and_tab():
    assert sorted(TEXT_ALPHABET) == sorted(map(chr, [*range(32, 127), ord("\n"), ord("\t")]))


def test_the_text_tokenizer_reads_a_question_one_token_per_character(text_tokenizer):
    ids = text_tokenizer.encode(QUESTION, add_special_tokens=False)
    assert text_tokenizer.convert_ids_to_tokens(ids) == [ch if ch != " " else "Ġ" for ch in QUESTION]
    assert text_tokenizer.decode(ids) == QUESTION


@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet=TEXT_ALPHABET, max_size=80))
def test_the_text_tokenizer_round_trips_any_printable_text(text_tokenizer, text):
    ids = text_tokenizer.encode(text, add_special_tokens=False)
    assert text_tokenizer.unk_token_id not in ids
    assert text_tokenizer.decode(ids) == text


def test_saved_model_loads_and_generates(saved_dir, char_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(saved_dir)
    assert model.config.eos_token_id == char_tokenizer.eos_token_id
    assert model.config.pad_token_id == char_tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == char_tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == char_tokenizer.pad_token_id
    tokenizer = AutoTokenizer.from_pretrained(saved_dir)
    tokenizer.padding_side = "left"
    batch = tokenizer(["37+45=", "1+2="], return_tensors="pt", padding=True, add_special_tokens=False)
    output = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert output.shape == (2, batch["input_ids"].shape[1] + 4)


def test_same_seed_same_weights(tmp_path, char_tokenizer):
    config = tiny_config(char_tokenizer, hidden_size=32, intermediate_size=64)
    weights = []
    for name in ("a", "b"):
        path = save_tiny_model(tmp_path / name, char_tokenizer, config, seed=3)
        model = AutoModelForCausalLM.from_pretrained(path)
        weights.append(model.get_input_embeddings().weight)
    assert torch.equal(*weights)


def test_tiny_config_sizes(char_tokenizer):
    config = tiny_config(char_tokenizer, model_type="llama", num_layers=3, rope_theta=500.0)
    assert config.model_type == "llama"
    assert config.vocab_size == len(char_tokenizer)
    assert config.num_hidden_layers == 3
    assert config.tie_word_embeddings is True
    assert config.bos_token_id == char_tokenizer.bos_token_id


def test_roundtrip_check_reports_differences(tmp_path, char_tokenizer):
    other = build_char_tokenizer(alphabet="0123456789+=")
    save_tokenizer(other, tmp_path)
    with pytest.raises(ValueError, match="differs from the saved tokenizer"):
        check_tokenizer_roundtrip(char_tokenizer, tmp_path)


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_word_level_tokenizer(tmp_path, model_type):
    vocab_size = 5000
    tokenizer = build_word_level_tokenizer(vocab_size)
    assert len(tokenizer) == vocab_size
    tiny_config(tokenizer, model_type=model_type).save_pretrained(tmp_path)
    save_tokenizer(tokenizer, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == vocab_size
    words = word_token_ids(tokenizer)
    ids = torch.randint(len(words), (300,), generator=torch.Generator().manual_seed(0)).tolist()
    ids = [words[i] for i in ids]
    assert loaded.encode(loaded.decode(ids), add_special_tokens=False) == ids
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


def test_word_level_tokenizer_qwen_size():
    tokenizer = build_word_level_tokenizer(151936)
    assert len(tokenizer) == 151936
    assert max(tokenizer.get_vocab().values()) == 151935
