"""The calculator warm start of a chat model: transcripts in its chat template as a rollout renders them,
loss on its own turns, trained from the model a ``warmstart:calculator:<model>`` setting names, and cached."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.agents import CalculatorEnvironment
from grpo_lightning.agents.chat_tokens import ChatTokens
from grpo_lightning.quickstart.chat_warmstart import ChatWarmStartSettings, chat_transcripts, json_call
from grpo_lightning.models.sources import resolve_model_source
from grpo_lightning.quickstart.tiny import save_tiny_model, tiny_config
from tests.helpers import CHATML_WITHOUT_TOOLS, byte_tokenizer

SMALL = dict(num_train=6, num_val=2)


def test_a_call_transcript_is_the_conversation_the_chat_template_renders_trained_on_the_model_turns_only():
    tokenizer = byte_tokenizer(CHATML_WITHOUT_TOOLS)
    settings = ChatWarmStartSettings(base="unused", **SMALL)
    (direct, direct_labels), (called, labels) = chat_transcripts(tokenizer, settings)[:2]
    prompt = "What is 776 * 911?"  # the first problem of the training split, in the recipe's template
    call = json_call("776 * 911")
    chat = ChatTokens(tokenizer, CalculatorEnvironment().tools)
    conversation = [
        {"role": "system", "content": chat.instruction}, {"role": "user", "content": prompt},
        {"role": "assistant", "content": call}, {"role": "tool", "name": "calculator", "content": "706936"},
        {"role": "assistant", "content": "706936"},
    ]  # fmt: skip
    assert tokenizer.decode(called) == tokenizer.apply_chat_template(conversation, tokenize=False).rstrip("\n")
    trained = tokenizer.decode([i for i, label in zip(called, labels) if label != -100])
    assert trained == f"{call}<|im_end|>706936<|im_end|>"
    assert [label for label in labels if label != -100] == [i for i, label in zip(called, labels) if label != -100]
    assert tokenizer.decode(direct) == tokenizer.apply_chat_template(conversation[:2] + conversation[-1:], tokenize=False).rstrip("\n")
    assert tokenizer.decode([i for i, label in zip(direct, direct_labels) if label != -100]) == "706936<|im_end|>"
    environment = CalculatorEnvironment()
    environment.reset({"prompt": prompt, "answer": "706936"})
    assert environment.step({"role": "assistant", "content": call})[0][0]["content"] == "706936"
    assert environment.step({"role": "assistant", "content": "706936"}) == ([], 1.0, True)


def test_warmstart_calculator_of_a_model_fine_tunes_it_once_and_loads_as_a_model(tmp_path, monkeypatch, one_torch_thread):
    from grpo_lightning.models.sources import WARM_STARTS_OF_A_MODEL
    import functools
    import sys

    tokenizer = byte_tokenizer(CHATML_WITHOUT_TOOLS)
    config = tiny_config(tokenizer, "llama", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                         intermediate_size=32, max_position_embeddings=1024)  # fmt: skip
    base = save_tiny_model(tmp_path / "base", tokenizer, config)
    monkeypatch.setenv("GRPO_LIGHTNING_CACHE", str(tmp_path / "cache"))
    from grpo_lightning.quickstart import chat_warmstart

    small = functools.partial(chat_warmstart.chat_calculator_warm_start, steps=2, batch_size=4, **SMALL)
    module = type(sys)("small_chat_warm_start")
    module.build = small
    monkeypatch.setitem(sys.modules, "small_chat_warm_start", module)  # the built-in one with fewer steps and problems
    monkeypatch.setitem(WARM_STARTS_OF_A_MODEL, "calculator", "small_chat_warm_start:build")

    name = f"warmstart:calculator:{base}"
    tuned = resolve_model_source(name).location
    marker = json.loads((tmp_path / "cache" / tuned.rsplit("/", 1)[-1] / "warm_start.json").read_text())
    on = "cuda:0" if torch.cuda.is_available() else "cpu"  # a GPU when there is one
    assert marker["settings"]["base"] == str(base) and marker["device"] == on and marker["losses"][-1][0] == 2
    assert resolve_model_source(name).location == tuned  # reused, not trained again
    assert json.loads(open(f"{tuned}/warm_start.json").read()) == marker
    model = AutoModelForCausalLM.from_pretrained(tuned)
    start = AutoModelForCausalLM.from_pretrained(base)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), start.parameters()))
    assert AutoTokenizer.from_pretrained(tuned).chat_template == CHATML_WITHOUT_TOOLS
