"""accuracy_reward with math-verify (the ``math`` extra) and without it, on answers that are hard to compare."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from grpo_lightning.rewards import accuracy_reward, answers_match, math_verifier

needs_math_verify = pytest.mark.skipif(not math_verifier.available(), reason="needs pip install -e '.[math]'")

# (completion, answer column, reward with math-verify, reward without it)
CASES = [
    (r"so \boxed{\frac{1}{2}}", "0.5", 1.0, 1.0),
    (r"<answer>\frac{1}{2}</answer>", r"\frac{1}{2}", 1.0, 1.0),
    (r"\boxed{\sqrt{\frac{1}{4}}}", "1/2", 1.0, 0.0),
    ("the total is 1,234", "1234", 1.0, 1.0),
    ("<answer>1,234</answer>", "1234", 1.0, 1.0),
    ("<answer>-3</answer>", "-3", 1.0, 1.0),
    ("we get 10-3", "-3", 0.0, 0.0),  # the last number is 3: a subtraction, not a negative number
    ("<answer>Paris</answer>", "paris", 1.0, 1.0),
    ("<answer>Paris</answer>", "London", 0.0, 0.0),
    ("<answer>AB</answer>", "BA", 0.0, 0.0),  # words, not the product a*b
    (r"\boxed{\{1,2\}}", "{2,1}", 1.0, 0.0),
    (r"\boxed{\{1,3\}}", "{1,2}", 0.0, 0.0),
    (r"\boxed{(0,1]}", "(0, 1]", 1.0, 0.0),
    (r"\boxed{[0,1)}", "(0,1]", 0.0, 0.0),
    (r"\boxed{10\text{ cm}}", "10", 1.0, 0.0),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0, 0.0),
    (r"<answer>$x = 3$</answer>", "3", 1.0, 0.0),
    (r"\boxed{\frac{1}{3}}", "0.5", 0.0, 0.0),
    (r"\boxed{2\pi}", "6.28", 0.0, 0.0),
    ("<answer>81</answer>", "82", 0.0, 0.0),
    ("I am not sure.", "5", 0.0, 0.0),
    ("<answer></answer>", r"\frac{1}{2}", 0.0, 0.0),
]


@pytest.fixture
def without_math_verify(monkeypatch):
    """A ``None`` entry in ``sys.modules`` makes ``import math_verify`` fail: this simulates an install
    without the ``math`` extra."""
    monkeypatch.setitem(sys.modules, "math_verify", None)
    assert not math_verifier.available()


@needs_math_verify
def test_math_verify_gives_the_expected_verdict_on_each_case():
    completions, answers, expected = zip(*[(c, a, verdict) for c, a, verdict, _ in CASES])
    assert accuracy_reward(["p"] * len(CASES), list(completions), answer=list(answers)) == list(expected)


def test_without_math_verify_the_fallback_gives_its_verdict_on_each_case(without_math_verify):
    completions, answers, expected = zip(*[(c, a, verdict) for c, a, _, verdict in CASES])
    assert accuracy_reward(["p"] * len(CASES), list(completions), answer=list(answers)) == list(expected)


@pytest.mark.parametrize("math_verify_installed", [True, False])
def test_a_missing_reference_is_not_applicable(math_verify_installed, monkeypatch):
    if not math_verify_installed:
        monkeypatch.setitem(sys.modules, "math_verify", None)  # as if the extra were not installed
    assert accuracy_reward(["p", "p"], [r"\boxed{\frac{1}{2}}", "nothing"], answer=[None, None]) == [None, None]


def test_plain_numbers_never_reach_math_verify(monkeypatch):
    def fail(predicted, reference):
        raise AssertionError(f"math-verify asked about {predicted!r} and {reference!r}")

    monkeypatch.setattr(math_verifier, "equivalent", fail)
    assert answers_match("1,234", "1234") and answers_match(r"\frac{3}{4}", "0.75")
    assert not answers_match("81", "82") and answers_match("Paris", "paris")


@needs_math_verify
def test_the_reward_works_from_a_worker_thread():
    math_verifier.stop()  # the thread starts the child itself
    rewards = []

    def score():
        rewards.append(accuracy_reward(["p", "p"], [r"\boxed{\{2,1\}}", r"\boxed{\{3\}}"], answer=["{1,2}"] * 2))

    worker = threading.Thread(target=score)
    worker.start()
    worker.join()
    assert rewards == [[1.0, 0.0]]


@needs_math_verify
def test_a_comparison_past_the_deadline_is_a_mismatch_and_the_next_one_works(monkeypatch):
    monkeypatch.setattr(math_verifier, "DEADLINE_SECONDS", 1.0)
    start = time.monotonic()
    assert accuracy_reward(["p"], [r"\boxed{10^{10^{10}}}"], answer=["5"]) == [0.0]  # hangs without a deadline
    assert time.monotonic() - start < 30
    assert accuracy_reward(["p"], [r"\boxed{\sqrt{\frac{1}{4}}}"], answer=["1/2"]) == [1.0]


def test_answers_are_given_to_math_verify_as_latex():
    assert math_verifier.as_latex(r" \frac{1}{2} ") == r"$\frac{1}{2}$"
    assert math_verifier.as_latex(r"it is $\frac{1}{2}$") == r"it is $\frac{1}{2}$"
    assert math_verifier.as_latex(r"\$18") == r"$\$18$"  # an escaped dollar is text, not a delimiter


def test_money_as_math_writes_it_matches_the_bare_number():
    """MATH's references write money as ``\$18.90``: a correct ``18.90`` scores, with or without math-verify."""
    for predicted, reference in (("18", r"\$18"), (r"\$18", "18"), ("18.90", r"\$18.90"), (r"\$ 18", "18")):
        assert answers_match(predicted, reference), (predicted, reference)
    assert not answers_match("19", r"\$18")


@needs_math_verify
def test_a_child_started_in_the_background_is_the_one_the_first_comparison_uses():
    math_verifier.stop()
    math_verifier.start_in_background()  # returns without waiting for the child's imports
    child = math_verifier._child
    assert child is not None and child.poll() is None and not math_verifier._ready
    math_verifier.start_in_background()  # one runs already: no second child
    assert math_verifier._child is child
    assert answers_match(r"\sqrt{\frac{1}{4}}", "1/2")
    assert math_verifier._child is child and math_verifier._ready


@needs_math_verify
def test_the_child_imports_from_the_package_bytecode_cache_where_it_keeps_one(tmp_path, monkeypatch):
    # As on an image that forbids bytecode and ships its packages without it (the GPU image): the
    # package keeps its own cache (grpo_lightning.bytecode), and the child, which runs this module's
    # file alone, is pointed at it instead of compiling sympy from source in every process.
    from grpo_lightning import bytecode

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(bytecode, "_own_folder", str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path))
    math_verifier.stop()
    try:
        assert answers_match(r"\sqrt{\frac{1}{4}}", "1/2")
        assert list(tmp_path.rglob("math_verify/**/*.pyc")) and list(tmp_path.rglob("sympy/**/*.pyc"))
    finally:
        math_verifier.stop()  # the next test's child starts without the cache


def test_without_math_verify_nothing_starts_in_the_background(without_math_verify):
    math_verifier.stop()
    math_verifier.start_in_background()
    assert math_verifier._child is None


@pytest.mark.parametrize("reward_is_accuracy", [True, False])
def test_a_fit_whose_rewards_compare_answers_starts_math_verify_at_setup(reward_is_accuracy, make_module, monkeypatch):
    from grpo_lightning.training import module as training_module
    from grpo_lightning.variants import GRPO

    started = []
    monkeypatch.setattr(math_verifier, "start_in_background", lambda: started.append(True))
    funcs = ["grpo_lightning.rewards.accuracy_reward"] if reward_is_accuracy else ["tests.helpers.length_parity_reward"]
    module = make_module(GRPO, configure=False, rewards={"funcs": funcs},
                         evaluation={"accuracy_func": funcs[0]})  # fmt: skip
    monkeypatch.setattr(training_module, "check_before_loading", lambda *args: None)  # needs a Trainer
    module.setup("fit")
    assert started == ([True] if reward_is_accuracy else [])
