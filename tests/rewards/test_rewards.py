"""Tests for the reward functions and how completions are scored with them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from grpo_lightning.rewards import (
    RewardFunctionError,
    RewardModel,
    accuracy_reward,
    answers_match,
    extract_answer,
    majority_vote_reward,
    r1_format_reward,
    resolve_reward_function,
    score_completions,
    weighted_reward,
)
from grpo_lightning.rewards.accuracy import parse_number

# --- extract_answer ------------------------------------------------------------------------------


def test_extract_answer_takes_the_last_answer_tag():
    assert extract_answer("<answer>1</answer> wait <answer> 42 </answer> 7") == "42"


def test_extract_answer_spans_lines_inside_answer_tags():
    assert extract_answer("<answer>\nx = 3\n</answer>") == "x = 3"


def test_extract_answer_reads_the_last_boxed_with_nested_braces():
    assert extract_answer(r"first \boxed{1} then \boxed{\frac{1}{2}} done 9") == r"\frac{1}{2}"


def test_extract_answer_falls_back_to_the_last_number():
    assert extract_answer("so 10-3 gives 7, or maybe -2.5 and then 1,234.") == "1234"


def test_extract_answer_keeps_negative_signs_but_not_subtraction():
    assert extract_answer("the result is -12") == "-12"
    assert extract_answer("we get 10-3") == "3"


def test_extract_answer_returns_none_without_any_answer():
    assert extract_answer("no digits here") is None


def test_extract_answer_ignores_unbalanced_boxed():
    assert extract_answer(r"\boxed{5 and 6") == "6"


# --- answers_match -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicted", "reference"),
    [("82", "82"), ("82.0", "82"), ("0.75", "3/4"), (r"\frac{3}{4}", "0.75"), ("1,234", "1234"),
     (" $5$ ", "5"), ("-7", "-7.0"), ("1000000.0000001", "1000000"), ("42", 42)],
)
def test_answers_match_compares_numbers_by_value(predicted, reference):
    assert answers_match(predicted, reference)


@pytest.mark.parametrize(("predicted", "reference"), [("81", "82"), ("0.7", "3/4"), ("1.001", "1"), (None, "1"),
                                                    ("66681335", "66681336"), ("999999", "1000000"), ("1e7", "10000001")])
def test_answers_match_rejects_different_numbers(predicted, reference):
    assert not answers_match(predicted, reference)


@pytest.mark.parametrize(("text", "value"), [("3 1/2", 3.5), ("-3 1/2", -3.5), ("1 000 000", 1e6), ("5 / 2", 2.5),
                                            ("- 5", -5.0), ("$ 18", 18.0), ("1 2", None), ("12 000 00", None)])
def test_spaces_in_a_number_are_read_as_written(text, value):
    """A mixed number is its sum, thousands may be spaced, and two numbers are no number: the spaces
    were dropped, so "3 1/2" read 31/2 and "1 2" read 12."""
    assert parse_number(text) == value


def test_whole_numbers_match_exactly_however_large():
    """A product of two 4-digit numbers off by one is wrong, though within 1e-6 of the reference:
    the tolerance is for decimals (0.3333333 for 1/3), not for whole answers."""
    from grpo_lightning.data.arithmetic import make_arithmetic_dataset
    from grpo_lightning.rewards.consistency import majority_answer

    rows = make_arithmetic_dataset(digits=4, operations="*", num_train=50, num_val=0, seed=0)["train"]
    off_by_one = [str(int(answer) + 1) for answer in rows["answer"]]
    assert not any(answers_match(wrong, right) for wrong, right in zip(off_by_one, rows["answer"]))
    assert all(answers_match(right, right) for right in rows["answer"])
    assert answers_match("0.3333333", "1/3") and answers_match("2.9999999", "3")
    assert majority_answer([66681335.0, 66681336.0, 66681336.0]) == 66681336.0  # two answers, not one of three


def test_answers_match_compares_text_after_normalizing_case_and_spaces():
    assert answers_match("  New   York ", "new york")
    assert not answers_match("Paris", "London")


# --- parse_number --------------------------------------------------------------------------------

#: Text made of what numbers are written with, so most examples reach the float conversion.
NUMBER_LIKE = st.text(alphabet="0123456789eE+-./,_ $\\frac{}", max_size=40)
HUGE = ["9" * 309, "-" + "9" * 400, "1e400", "-1e400", "1" * 5000, "1e99999999999", "1e00000000000099999999999"]


#: Numbers near and past a float's range, as a model may write them.
LARGE_NUMBERS = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.builds("{}e{}".format, st.integers(-99, 99), st.integers(-1000, 1000)),
    st.builds("{}/{}".format, st.integers(min_value=10**300, max_value=10**320), st.integers(1, 10**9)),
)


@settings(max_examples=300, deadline=1000, database=None, derandomize=True)
@given(st.one_of(st.text(max_size=60), NUMBER_LIKE, LARGE_NUMBERS))
@example("1e400")
@example("9" * 309)
@example(r"\frac{1e400}{1}")
def test_parse_number_never_raises_and_gives_a_finite_float_or_none(text):
    """``deadline``: an exponent such as ``1e99999999999`` must not be expanded digit by digit."""
    number = parse_number(text)
    assert number is None or isinstance(number, float) and math.isfinite(number)


@pytest.mark.parametrize("text", HUGE)
def test_a_number_no_float_holds_is_no_number(text):
    """It raised OverflowError (309 digits, 1e400), or hung expanding the exponent."""
    assert parse_number(text) is None


def test_a_nonzero_number_too_small_for_a_float_is_not_zero():
    assert parse_number("1e-400") is None and parse_number("0e-400") == 0.0


@pytest.mark.parametrize("text", HUGE)
def test_accuracy_and_majority_votes_score_numbers_no_float_holds_as_text(text):
    completions = [f"<answer>{text}</answer>", f"<answer>{text}</answer>", "<answer>7</answer>"]
    assert accuracy_reward(["p"] * 3, completions, [text, "7", "7"]) == [1.0, 0.0, 1.0]
    assert majority_vote_reward(["p"] * 3, completions, group_index=[0, 0, 0]) == [1.0, 1.0, -0.1]


# --- accuracy_reward -----------------------------------------------------------------------------


def test_accuracy_reward_scores_each_completion_against_its_answer():
    completions = ["<answer>82</answer>", "it is 81", r"\boxed{82}", "nothing"]
    assert accuracy_reward(["p"] * 4, completions, answer=["82"] * 4) == [1.0, 0.0, 1.0, 0.0]


def test_accuracy_reward_reads_the_last_message_of_a_conversation():
    completion = [{"role": "assistant", "content": "<answer>5</answer>"}]
    assert accuracy_reward([[{"role": "user", "content": "2+3="}]], [completion], answer=["5"]) == [1.0]


def test_accuracy_reward_is_not_applicable_without_a_reference():
    assert accuracy_reward(["p"], ["<answer>5</answer>"], answer=[None]) == [None]


# --- r1_format_reward ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion",
    ["<think>add</think><answer>5</answer>", "<think>\nmulti\nline\n</think>\n\n<answer>5</answer>\n"],
)
def test_r1_format_reward_accepts_think_then_answer(completion):
    assert r1_format_reward(["p"], [completion]) == [1.0]


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>5</answer>",
        "<think>a</think>",
        "intro <think>a</think><answer>5</answer>",
        "<think>a</think><answer>5</answer> trailing text",
        "<answer>5</answer><think>a</think>",
        "<think>a</think><think>b</think><answer>5</answer>",
        "<think>a</think><answer>5</answer><answer>6</answer>",
    ],
)
def test_r1_format_reward_rejects_other_layouts(completion):
    assert r1_format_reward(["p"], [completion]) == [0.0]


# --- resolve_reward_function ---------------------------------------------------------------------


class LengthReward:
    def __call__(self, prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]


def test_resolve_accepts_an_import_path():
    assert resolve_reward_function("grpo_lightning.rewards.accuracy_reward") == ("accuracy_reward", accuracy_reward)


def test_resolve_names_a_callable_instance_after_its_class():
    name, function = resolve_reward_function(LengthReward())
    assert name == "LengthReward" and function(["p"], ["abc"]) == [3.0]


def test_resolve_reports_an_unknown_path_with_field_error_and_example():
    with pytest.raises(ValueError) as error:
        resolve_reward_function("no_such_package.reward", field="rewards.funcs[1]")
    message = str(error.value)
    assert "rewards.funcs[1]='no_such_package.reward'" in message
    assert "No module named 'no_such_package'" in message
    assert "grpo_lightning.rewards.accuracy_reward" in message


def test_resolve_reports_a_missing_attribute():
    with pytest.raises(ValueError, match=r"'grpo_lightning\.rewards\.nope'.*AttributeError"):
        resolve_reward_function("grpo_lightning.rewards.nope")


def test_resolve_refuses_a_class_and_shows_the_instance_syntax():
    with pytest.raises(ValueError, match=r"is a class; pass an instance as \{\"class_path\": .*RewardModel"):
        resolve_reward_function("grpo_lightning.rewards.RewardModel")


def test_resolve_refuses_a_non_callable():
    with pytest.raises(ValueError, match=r"rewards.funcs\[0\]='math\.pi'.*not callable"):
        resolve_reward_function("math.pi")


# --- score_completions ---------------------------------------------------------------------------


def test_score_completions_stacks_one_column_per_function():
    functions = [("length", LengthReward()), ("accuracy", accuracy_reward)]
    scores = score_completions(functions, ["p", "p"], ["<answer>1</answer>", "x"], {"answer": ["1", "1"]})
    assert scores.dtype == torch.float32 and scores.shape == (2, 2)
    assert scores.tolist() == [[18.0, 1.0], [1.0, 0.0]]


def test_score_completions_passes_extra_columns_but_not_prompt_aliases():
    received = {}

    def spy(prompts, completions, **columns):
        received.update(columns)
        return [0.0] * len(completions)

    score_completions([("spy", spy)], ["p"], ["c"], {"prompt": ["p"], "answer": ["a"], "level": [3]})
    assert received == {"answer": ["a"], "level": [3]}


def test_reward_functions_written_as_trls_get_prompts_and_completions_by_name():
    def length(completions, **kwargs):  # TRL's documentation's first example
        return [float(len(c)) for c in completions]

    def matches(completions, ground_truth, **kwargs):  # and its reference-based one
        return [float(c == truth) for c, truth in zip(completions, ground_truth)]

    def prompted(prompts, **kwargs):
        return [float(len(p)) for p in prompts]

    functions = [("length", length), ("matches", matches), ("prompted", prompted),
                 ("positional", lambda p, c, **k: [float(len(p + c)) for p, c in zip(p, c)])]  # fmt: skip
    scores = score_completions(functions, ["p", "qq"], ["abc", "x"], {"ground_truth": ["abc", "y"]})
    assert scores.tolist() == [[3.0, 1.0, 1.0, 4.0], [1.0, 0.0, 2.0, 3.0]]


def test_score_completions_turns_none_into_nan():
    scores = score_completions([("partial", lambda p, c, **k: [1.0, None])], ["p", "q"], ["a", "b"], {})
    assert scores[0, 0] == 1.0 and math.isnan(scores[1, 0])


def test_a_function_that_scores_nothing_is_named_in_a_warning():
    with pytest.warns(UserWarning, match=r"reward function 'nothing' returned None for every completion"):
        scores = score_completions([("nothing", lambda p, c, **k: [None, None])], ["p", "q"], ["a", "b"], {})
    assert scores.isnan().all()


def test_a_reward_module_in_the_working_directory_imports_without_pythonpath(tmp_path, monkeypatch):
    (tmp_path / "my_task_rewards.py").write_text("def exact(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    name, function = resolve_reward_function("my_task_rewards.exact")
    assert name == "exact" and function(["p"], ["c"]) == [1.0]


def test_a_raising_function_is_reported_with_its_name_and_failing_sample():
    def fragile(prompts, completions, **kwargs):
        return [1.0 / len(c) for c in completions]

    with pytest.raises(RewardFunctionError) as error:
        score_completions([("fragile", fragile)], ["p0", "p1", "p2"], ["ok", "", "ok"], {})
    message = str(error.value)
    assert "'fragile'" in message and "ZeroDivisionError" in message and "sample 1" in message
    assert "prompt='p1'" in message
    assert isinstance(error.value.__cause__, ZeroDivisionError)


def test_a_long_sample_is_shortened_in_the_error():
    def broken(prompts, completions, **kwargs):
        raise KeyError("boom")

    with pytest.raises(RewardFunctionError, match=r"sample 0.*x{10,}\.\.\.'"):
        score_completions([("broken", broken)], ["x" * 500], ["c"], {})


def test_a_wrong_length_return_is_reported_with_what_was_expected():
    with pytest.raises(RewardFunctionError, match=r"'short' returned 1 values for 3 completions; expected a list of 3"):
        score_completions([("short", lambda p, c, **k: [1.0])], ["p"] * 3, ["c"] * 3, {})


def test_a_non_numeric_return_is_reported():
    with pytest.raises(RewardFunctionError, match=r"'texty' returned str 'good' for sample 0"):
        score_completions([("texty", lambda p, c, **k: ["good"])], ["p"], ["c"], {})


def test_a_scalar_return_is_reported():
    with pytest.raises(RewardFunctionError, match=r"'scalar' returned float '1.0'; expected a list"):
        score_completions([("scalar", lambda p, c, **k: 1.0)], ["p"], ["c"], {})


def test_a_column_of_the_wrong_length_is_rejected():
    with pytest.raises(ValueError, match=r"column 'answer' has 1 values for 2 completions"):
        score_completions([("accuracy", accuracy_reward)], ["p", "p"], ["a", "b"], {"answer": ["1"]})


# --- weighted_reward -----------------------------------------------------------------------------


def test_weighted_reward_sums_weighted_scores_and_skips_nan():
    per_function = torch.tensor([[1.0, 2.0], [float("nan"), 2.0], [float("nan"), float("nan")]])
    assert weighted_reward(per_function, torch.tensor([1.0, 0.5])).tolist() == [2.0, 1.0, 0.0]


def test_weighted_reward_rejects_mismatched_weights():
    with pytest.raises(ValueError, match=r"weights \[F\]"):
        weighted_reward(torch.zeros(2, 3), torch.ones(2))


# --- RewardModel ---------------------------------------------------------------------------------

WORDS = ["the", "answer", "is", "good", "bad", "42", "7", "<answer>", "</answer>", "hello", "world"]


def save_tiny_reward_model(directory: Path) -> None:
    """Save a random 1-layer Llama reward model with a word-level tokenizer.

    A Llama config is used because AutoTokenizer in transformers 5 replaces the saved tokenizer of a
    ``qwen2`` checkpoint with ``Qwen2Tokenizer``, which rebuilds its own pre-tokenizer and encodes
    differently (a word-level vocabulary even encodes to nothing).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    vocabulary = {token: index for index, token in enumerate(["<unk>", "<eos>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>").save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=len(vocabulary), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_labels=1, eos_token_id=1,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(directory)


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("reward_model")
    save_tiny_reward_model(directory)
    return str(directory)


def test_saved_tokenizer_round_trips_through_auto_tokenizer(reward_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reward_model_path)
    assert tokenizer("the answer is 42")["input_ids"] == [2, 3, 4, 7]


def test_reward_model_loads_nothing_until_called(reward_model_path):
    model = RewardModel(reward_model_path)
    assert model.model is None and model.__name__ == "reward_model"


def test_reward_model_scores_match_a_direct_forward_pass(reward_model_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    prompts, completions = ["the answer is ", "hello "], ["42", "world good bad 7"]
    scores = RewardModel(reward_model_path, batch_size=1, device="cpu")(prompts, completions)

    tokenizer = AutoTokenizer.from_pretrained(reward_model_path)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_path).eval()
    with torch.no_grad():
        encoded = [tokenizer(p + c, return_tensors="pt") for p, c in zip(prompts, completions)]
        expected = [model(**inputs).logits[0, 0].item() for inputs in encoded]
    assert scores == pytest.approx(expected, abs=1e-5)


def test_a_chat_prompt_is_scored_through_the_chat_template_with_the_completion_as_the_reply(tmp_path):
    """A rollout's completions are text, its prompts chat messages: the reply is the assistant's turn
    of the template (the template was never applied, so the model read the bare contents run together)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    save_tiny_reward_model(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    tokenizer.chat_template = "<eos>{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(tmp_path)
    prompt = [{"role": "system", "content": "hello"}, {"role": "user", "content": "the answer is"}]
    scores = RewardModel(str(tmp_path), device="cpu")([prompt, prompt], ["42", "bad"])

    model = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    expected = []
    for reply in ("42", "bad"):
        text = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": reply}], tokenize=False)
        assert text == "<eos>system hello user the answer is assistant " + reply + " "
        with torch.no_grad():
            expected.append(model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item())
    assert scores == pytest.approx(expected, abs=1e-5)
    # without a template (here: no tokenizer loaded yet), one message a line
    assert RewardModel(str(tmp_path))._render(prompt, "42") == ("hello\nthe answer is\n42", False)


def test_reward_model_scores_do_not_depend_on_batch_padding(reward_model_path):
    prompts, completions = ["the answer is ", "hello "], ["42", "world good bad 7 the answer is 42"]
    one_by_one = RewardModel(reward_model_path, batch_size=1, device="cpu")(prompts, completions)
    batched = RewardModel(reward_model_path, batch_size=2, device="cpu")(prompts, completions)
    assert batched == pytest.approx(one_by_one, abs=1e-5)


def test_reward_model_uses_eos_as_padding_when_no_pad_token(reward_model_path):
    model = RewardModel(reward_model_path, device="cpu")
    model(["hello "], ["world"])
    assert model.tokenizer.pad_token == "<eos>" and model.model.config.pad_token_id == 1


def test_reward_model_reports_a_tokenizer_that_encodes_text_to_nothing(tmp_path):
    # A qwen2 checkpoint makes AutoTokenizer load Qwen2Tokenizer instead of the saved word-level one.
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    save_tiny_reward_model(tmp_path)
    config = Qwen2Config(
        vocab_size=len(WORDS) + 2, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_labels=1,
    )
    Qwen2ForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"turned text 'hello world' into no tokens.*AutoTokenizer"):
        RewardModel(str(tmp_path), device="cpu")(["hello "], ["world"])


def test_reward_model_rejects_an_unknown_dtype():
    with pytest.raises(ValueError, match=r"dtype='float64'.*one of"):
        RewardModel("unused", dtype="float64")
