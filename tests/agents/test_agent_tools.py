"""Tools and tool calls: schemas, parsing, and every failure as a message the model reads, counted by kind."""

from __future__ import annotations

import json
import time

import pytest

from grpo_lightning.agents import (
    CalculatorEnvironment,
    ToolCall,
    ToolEnvironment,
    calculator,
    json_tag_calls,
    llama_json_calls,
    run_tool_call,
    tool_schema,
)
from grpo_lightning.agents.tool_calls import MAX_CALL_CHARS, resolve_tool_call_format
from grpo_lightning.errors import ConfigError


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    return "done"


def undocumented(a):
    return a


def test_a_typed_documented_function_gets_the_chat_template_schema():
    schema = tool_schema(add)
    assert schema["function"]["name"] == "add"
    assert schema["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first."}
    assert schema["function"]["parameters"]["required"] == ["a", "b"]


def test_a_tool_without_hints_or_docstring_is_refused_when_the_environment_is_built():
    with pytest.raises(ConfigError, match="tools: 'undocumented' has no schema"):
        ToolEnvironment([undocumented])


def test_json_tag_calls_reads_each_call_and_reports_the_unreadable_ones():
    text = (
        'Let me compute. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}'  # string arguments, unclosed tag
    )
    first, bad_json, no_name, last = json_tag_calls(text)
    assert first == ToolCall("add", {"a": 1, "b": 2})
    assert bad_json.error.startswith("the tool call is not valid JSON")
    assert no_name.error == 'a tool call must be a JSON object with a "name"'
    assert last == ToolCall("add", {"a": 3, "b": 4})
    assert json_tag_calls("The answer is 3.") == []


def test_llama_json_calls_read_the_turn_as_json_objects_and_an_answer_as_no_call():
    from grpo_lightning.agents.tool_calls import llama_json_calls

    one = '<|python_tag|>{"name": "calculator", "parameters": {"expression": "12 * 34"}}'
    assert llama_json_calls(one) == [ToolCall("calculator", {"expression": "12 * 34"})]
    two = '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}'
    assert llama_json_calls(two) == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("add", {"a": 3, "b": 4})]
    first, broken = llama_json_calls('{"name": "add", "parameters": {"a": 1}} {"name": ')
    assert first == ToolCall("add", {"a": 1}) and broken.error.startswith("the tool call is not valid JSON")
    assert llama_json_calls('{"parameters": {}}')[0].error == 'a tool call must be a JSON object with a "name"'
    assert llama_json_calls('{"name": "add", "parameters": [1, 2]}')[0].error == '"parameters" must be a JSON object'
    assert llama_json_calls('The answer is {"x": 1}.') == [] and llama_json_calls("408") == []
    assert resolve_tool_call_format("llama_json") is llama_json_calls


DEGENERATE = {
    "json_tags nested brackets": (json_tag_calls, "<tool_call>" + "[" * 5000),
    "json_tags nested objects": (json_tag_calls, '<tool_call>{"name": "add", "arguments": ' + '{"a": ' * 5000),
    "nested JSON in the arguments string": (json_tag_calls, "<tool_call>" + json.dumps({"name": "add", "arguments": "[" * 5000})),
    "llama_json nested brackets": (llama_json_calls, '{"name": "add", "parameters": ' + "[" * 5000 + "]" * 5000 + "}"),
    "llama_json nested JSON in the parameters": (llama_json_calls, json.dumps({"name": "add", "parameters": "{" * 5000})),
    "a call longer than the cap": (json_tag_calls, '<tool_call>{"name": "add", "arguments": {"a": "' + "9" * MAX_CALL_CHARS + '"}}'),
}


@pytest.mark.parametrize(("parse", "text"), DEGENERATE.values(), ids=DEGENERATE.keys())
def test_degenerate_json_is_one_call_that_cannot_be_read_never_an_exception(parse, text):
    (call,) = parse(text)
    assert call.error is not None and ("deeper than" in call.error or "longer than" in call.error)
    content, error = run_tool_call(call, {"add": add}, timeout=1.0)
    assert error == "bad_call" and content.startswith("Error: ")


@pytest.mark.parametrize(
    "content",
    [
        "<tool_call>" + "[" * 5000,
        "<tool_call>" + json.dumps({"name": "calculator", "arguments": "[" * 5000}),
        "<tool_call>" + "x" * 10**6,
        '<tool_call>{"name": "calculator", "arguments": {"expression": "\\ud800 + 1"}}</tool_call>',
        "\ud800" + "[" * 5000,
        '<tool_call>{"name": "calculator", "arguments": {"expression": "' + "(" * 5000 + '1"}}</tool_call>',
        "The answer is 42.",
        "x" * 10**6,
    ],
    ids=["nested brackets", "nested JSON in the arguments", "a huge string", "a lone surrogate in JSON", "a lone surrogate",
         "nested parentheses", "a final answer", "a huge final answer"],
)
@pytest.mark.parametrize("reset", [True, False], ids=["after reset", "without reset"])
def test_the_calculator_environment_answers_any_turn(content, reset):
    environment = CalculatorEnvironment()
    if reset:
        environment.reset({"prompt": "What is 2 + 40?", "answer": "42"})
    replies, reward, done = environment.step({"role": "assistant", "content": content})
    assert (replies and replies[0]["content"].startswith("Error: ")) or done
    if done:  # a final answer: scored against the row's answer, or left to the reward functions without one
        assert reward == (float(content == "The answer is 42.") if reset else None)


def test_a_tool_call_format_is_a_name_an_import_path_or_a_callable():
    assert resolve_tool_call_format("json_tags") is json_tag_calls
    assert resolve_tool_call_format("grpo_lightning.agents.think_expression_calls")("<think>2*3</think>") == [
        ToolCall("calculator", {"expression": "2*3"})
    ]
    with pytest.raises(ConfigError, match="tool_call_format: 'no_such_format' does not import"):
        resolve_tool_call_format("no_such_format")


@pytest.mark.parametrize(
    ("call", "kind", "says"),
    [
        (ToolCall("", error="the tool call is not valid JSON (x)"), "bad_call", "not valid JSON"),
        (ToolCall("multiply", {"a": 1}), "unknown_tool", "there is no tool 'multiply'; the tools are add, slow"),
        (ToolCall("add", {"a": 1, "c": 2}), "bad_arguments", "wrong arguments for add"),
        (ToolCall("add", {"a": 1, "b": None}), "tool_exception", "add raised TypeError"),
        (ToolCall("slow", {"seconds": 5}), "timeout", "slow took longer than 0.05 s"),
    ],
)
def test_each_failure_becomes_a_message_and_its_kind(call, kind, says):
    content, error = run_tool_call(call, {"add": add, "slow": slow}, timeout=0.05)
    assert error == kind
    assert content.startswith("Error: ") and says in content


def test_a_successful_call_returns_the_result_as_text():
    assert run_tool_call(ToolCall("add", {"a": 2, "b": 40}), {"add": add}, timeout=1.0) == ("42", None)


def test_the_tool_environment_answers_calls_counts_errors_and_ends_at_a_turn_without_one():
    environment = ToolEnvironment([add], max_tool_calls=2)
    assert environment.reset({"prompt": "What is 2 + 40?"}) == [{"role": "user", "content": "What is 2 + 40?"}]
    three = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>' * 2 + "<tool_call>oops</tool_call>"
    replies, reward, done = environment.step({"role": "assistant", "content": three})
    assert [r["content"] for r in replies] == ["42", "42", "Error: at most 2 tool calls per turn."]
    assert replies[0]["role"] == "tool" and (reward, done) == (None, False)
    assert environment.tool_calls == 3 and environment.tool_errors == {"bad_call": 1}
    assert environment.step({"role": "assistant", "content": "42"}) == ([], None, True)


def test_the_calculator_evaluates_arithmetic_only():
    assert calculator("123 * (45 + 6)") == "6273"
    assert calculator("7 / 2") == "3.5"
    assert calculator("-3*-3") == "9"
    for refused in ("__import__('os')", "2**10", "[1]"):
        with pytest.raises(ValueError, match="only numbers"):
            calculator(refused)
    with pytest.raises(ValueError, match="too large"):
        calculator("*".join(["99999999999"] * 4))


def test_the_python_tool_runs_code_in_the_sandbox_and_returns_what_it_prints():
    from grpo_lightning.agents import python

    assert tool_schema(python)["function"]["parameters"]["required"] == ["code"]
    assert python("print(6 * 7)") == "42\n"
    assert python("print('partial')\nraise SystemExit(3)") == "partial\n\n(exit status 3)"
