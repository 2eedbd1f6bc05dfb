"""The calculator recipe's warm start: transcripts tokenised as rollouts are, loss on the model's turns, cached."""

from __future__ import annotations

import json

import pytest

from grpo_lightning.quickstart import calculator_warmstart
from grpo_lightning.quickstart.calculator_warmstart import (
    CalculatorWarmStartSettings,
    calculator_transcript,
    calculator_warm_start,
    call_opening_rates,
)
from grpo_lightning.errors import ConfigError
from grpo_lightning.quickstart.tiny import DEFAULT_ALPHABET, build_char_tokenizer

TINY = dict(steps=2, num_train=40, num_val=4, batch_size=8, hidden_size=16, intermediate_size=32)


def test_a_call_transcript_trains_the_call_and_the_answer_never_the_tool_reply():
    tokenizer = build_char_tokenizer()
    ids, labels = calculator_transcript(tokenizer, "123*456=", "56088", call=True)
    assert tokenizer.decode(ids) == "123*456=<think>123*456</think></s>56088<answer>56088</answer></s>"
    trained = [i for i, label in zip(ids, labels) if label != -100]
    assert [label for label in labels if label != -100] == trained
    assert tokenizer.decode(trained) == "<think>123*456</think></s><answer>56088</answer></s>"


def test_a_direct_transcript_answers_at_once():
    tokenizer = build_char_tokenizer()
    ids, labels = calculator_transcript(tokenizer, "123*456=", "56088", call=False)
    assert tokenizer.decode(ids) == "123*456=<answer>56088</answer></s>"
    assert labels[: len("123*456=")] == [-100] * len("123*456=") and -100 not in labels[len("123*456=") :]


def test_the_warm_start_is_reused_for_the_same_settings_and_redone_for_others(tmp_path):
    first = calculator_warm_start(tmp_path / "a", **TINY)
    written = (first / "warm_start.json").stat().st_mtime_ns
    assert calculator_warm_start(tmp_path / "a", **TINY) == first
    assert (first / "warm_start.json").stat().st_mtime_ns == written
    calculator_warm_start(tmp_path / "a", **{**TINY, "call_fraction": 0.5})
    assert json.loads((first / "warm_start.json").read_text())["settings"]["call_fraction"] == 0.5


def test_a_tokenizer_with_another_alphabet_trains_again(monkeypatch):
    key = CalculatorWarmStartSettings().cache_key()
    monkeypatch.setattr(calculator_warmstart, "build_char_tokenizer", lambda: build_char_tokenizer(DEFAULT_ALPHABET + "abc"))
    assert CalculatorWarmStartSettings().cache_key() != key


@pytest.mark.parametrize("call_fraction", [0.0, 0.1, 0.25, 0.5, 0.8, 1.0])
def test_opening_tokens_are_calls_call_fraction_of_the_time_while_half_the_batch_or_more_are_call_transcripts(call_fraction):
    share, kept = call_opening_rates(call_fraction)
    assert share >= 0.5 and 0.0 <= kept <= 1.0
    assert share * kept / (share * kept + 1 - share) == pytest.approx(call_fraction)


def test_a_call_fraction_outside_zero_to_one_is_refused():
    with pytest.raises(ConfigError, match="call_fraction"):
        call_opening_rates(1.5)
