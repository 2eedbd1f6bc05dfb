"""Rewards that see the group: the ``group_index`` keyword, the self-consistency vote, the reasoning
length reward, and the shipped reward configs in real fits."""

from __future__ import annotations

import pytest

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.rewards import (
    RewardFunctionError,
    accepts_group_index,
    group_indices,
    majority_vote_reward,
    reasoning_length_reward,
    score_completions,
)
from tests.helpers import length_parity_reward

CONFIGS = config_dir()


def answers(*values: str | None) -> list[str]:
    return [f"<answer>{value}</answer>" if value is not None else "no answer here" for value in values]


def vote_rewards(completions: list[str], group_index: list[int]) -> list[float]:
    return majority_vote_reward(["p"] * len(completions), completions, group_index=group_index)


# --- majority_vote_reward ------------------------------------------------------------------------


def test_the_majority_answer_earns_one_and_the_others_minus_a_tenth():
    assert vote_rewards(answers("7", "3", "7", "5"), [0, 0, 0, 0]) == [1.0, -0.1, 1.0, -0.1]


def test_a_tie_goes_to_the_answer_seen_first():
    assert vote_rewards(answers("3", "7", "7", "3"), [0, 0, 0, 0]) == [1.0, -0.1, -0.1, 1.0]


def test_a_completion_without_an_answer_does_not_vote_and_earns_minus_a_tenth():
    # Two "no answer" completions would outvote the single "4" if they voted.
    assert vote_rewards(answers(None, None, "4", "5"), [0, 0, 0, 0]) == [-0.1, -0.1, 1.0, -0.1]
    assert vote_rewards(answers(None, None), [0, 0]) == [-0.1, -0.1]


def test_numbers_vote_by_value():
    assert vote_rewards(answers("0.50", "1", ".5", "1/2"), [0, 0, 0, 0]) == [1.0, -0.1, 1.0, 1.0]


def test_each_group_votes_on_its_own():
    completions = answers("1", "2", "2", "9", "9", "1")
    assert vote_rewards(completions, [0, 0, 0, 1, 1, 1]) == [-0.1, 1.0, 1.0, 1.0, 1.0, -0.1]
    assert vote_rewards(completions, [0] * 6) == [1.0, -0.1, -0.1, -0.1, -0.1, 1.0]  # one group: "1" ties first


def test_the_vote_needs_the_group_of_each_completion():
    with pytest.raises(ValueError, match="majority_vote_reward needs group_index"):
        majority_vote_reward(["p"], ["<answer>1</answer>"])
    with pytest.raises(ValueError, match="got 1 group indices for 2 completions"):
        majority_vote_reward(["p", "p"], answers("1", "1"), group_index=[0])


# --- reasoning_length_reward ---------------------------------------------------------------------


def r1(think: str) -> str:
    return f"<think>{think}</think>\n<answer>4</answer>"


def test_reasoning_length_is_the_thought_length_over_a_thousand_capped_at_one():
    completions = [r1("x" * 900), r1("y" * 2000), r1("")]
    assert reasoning_length_reward(["p"] * 3, completions) == [pytest.approx(0.9), 1.0, 0.0]


def test_reasoning_length_is_zero_outside_the_r1_format():
    completions = ["x" * 900 + "<answer>4</answer>", "<think>" + "x" * 900 + "</think> trailing words", "x" * 2000]
    assert reasoning_length_reward(["p"] * 3, completions) == [0.0, 0.0, 0.0]


def test_reasoning_length_reads_the_last_message_of_a_conversation():
    conversation = [{"role": "assistant", "content": r1("z" * 500)}]
    assert reasoning_length_reward(["p"], [conversation]) == [0.5]


# --- the group_index keyword ---------------------------------------------------------------------


def test_group_indices_follow_the_rollout_layout():
    assert group_indices(6, 3) == [0, 0, 0, 1, 1, 1]
    assert group_indices(4, 1) == [0, 1, 2, 3]


def test_a_function_with_a_group_index_parameter_gets_the_groups():
    seen = {}

    def by_group(prompts, completions, group_index):
        seen["group_index"] = group_index
        return [float(g) for g in group_index]

    scores = score_completions([("by_group", by_group)], ["p"] * 4, ["c"] * 4, {}, group_index=[0, 0, 1, 1])
    assert seen["group_index"] == [0, 0, 1, 1]
    assert scores[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_a_function_without_group_index_or_kwargs_is_called_as_before():
    def plain(prompts, completions, answer):
        return [float(a == c) for a, c in zip(answer, completions)]

    assert not accepts_group_index(plain)
    scores = score_completions([("plain", plain)], ["p", "p"], ["1", "2"], {"answer": ["1", "1"]}, group_index=[0, 0])
    assert scores[:, 0].tolist() == [1.0, 0.0]


def test_a_lambda_with_kwargs_gets_the_groups():
    spy = lambda prompts, completions, **kwargs: [float(g) for g in kwargs["group_index"]]
    scores = score_completions([("spy", spy)], ["p"] * 3, ["c"] * 3, {}, group_index=[2, 2, 5])
    assert scores[:, 0].tolist() == [2.0, 2.0, 5.0]


def test_without_groups_no_function_gets_group_index_and_a_column_of_that_name_is_dropped():
    seen = []
    spy = lambda prompts, completions, **kwargs: seen.append(kwargs) or [0.0] * len(completions)
    score_completions([("spy", spy)], ["p"], ["c"], {"group_index": [9], "answer": ["1"]})
    assert seen == [{"answer": ["1"]}]


def test_group_index_of_the_wrong_length_is_rejected():
    with pytest.raises(ValueError, match="got 1 group_index values for 2 completions"):
        score_completions([("spy", lambda p, c, **k: [0.0, 0.0])], ["p", "p"], ["a", "b"], {}, group_index=[0])


def test_a_signature_is_inspected_once_per_function(monkeypatch):
    import inspect

    calls = []
    signature = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda f, *a, **k: calls.append(f) or signature(f, *a, **k))

    def once(prompts, completions, group_index):
        return [0.0] * len(completions)

    for _ in range(3):
        score_completions([("once", once)], ["p"] * 2, ["c"] * 2, {}, group_index=[0, 0])
    assert calls.count(once) == 1


def test_an_error_in_a_group_aware_function_names_it_and_the_sample():
    def picky(prompts, completions, group_index):
        return [1.0 / g for g in group_index]

    with pytest.raises(RewardFunctionError) as error:
        score_completions([("picky", picky)], ["p0", "p1"], ["c0", "c1"], {}, group_index=[1, 0])
    assert "'picky'" in str(error.value) and "ZeroDivisionError" in str(error.value) and "sample 1" in str(error.value)


def test_the_module_scores_training_and_evaluation_rollouts_with_their_groups(make_module, make_rollout):
    from grpo_lightning.variants import GRPO

    seen: list[list[int]] = []

    def groups_seen(prompts, completions, group_index):
        seen.append(list(group_index))
        return [0.0] * len(completions)

    module = make_module(
        GRPO,
        rewards={"funcs": [length_parity_reward]},
        evaluation={"accuracy_func": groups_seen},
        sampling={"group_size": 3},
    )
    rollout = make_rollout(module, ["1+1=", "2+2="])
    module.accuracy_scores(rollout)  # not a reward function: evaluation scores it on its own
    module.reward_functions = [("groups_seen", groups_seen)]
    make_rollout(module, ["1+1=", "2+2="])
    assert seen == [[0, 0, 0, 1, 1, 1]] * 2


# --- the shipped reward configs in real fits -----------------------------------------------------


def fit(tiny_model_dir: str, tmp_path, rewards_config: str):
    return GRPOLightningCLI(
        args=[
            "fit",
            "--config",
            str(CONFIGS / "trainer/cpu.yaml"),
            "--config",
            str(CONFIGS / "data/arithmetic.yaml"),
            "--config",
            str(CONFIGS / "variant/grpo.yaml"),
            "--config",
            str(CONFIGS / "model/tiny.yaml"),
            "--config",
            str(CONFIGS / "rewards" / rewards_config),
            "--model.model",
            tiny_model_dir,
            "--trainer.max_steps",
            "2",
            "--data.batch_size",
            "2",
            "--model.sampling.group_size",
            "4",
            "--model.sampling.max_new_tokens",
            "6",
            "--trainer.limit_val_batches",
            "0",
            "--validate_before_fit",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
        ]
    )


def test_a_label_free_fit_with_the_majority_vote_config(tiny_model_dir, tmp_path, one_torch_thread):
    cli = fit(tiny_model_dir, tmp_path, "majority_vote.yaml")
    assert [name for name, _ in cli.model.reward_functions] == ["majority_vote_reward"]
    assert cli.trainer.global_step == 2
    mean = float(cli.trainer.callback_metrics["rewards/majority_vote_reward/mean"])
    assert -0.1 <= mean <= 1.0


def test_a_fit_with_the_r1_rewards_and_weights(tiny_model_dir, tmp_path, one_torch_thread):
    cli = fit(tiny_model_dir, tmp_path, "r1.yaml")
    names = [name for name, _ in cli.model.reward_functions]
    assert names == ["accuracy_reward", "r1_format_reward", "reasoning_length_reward"]
    assert cli.model.reward_weights.tolist() == pytest.approx([1.0, 0.1, 0.01])
    assert cli.trainer.global_step == 2
    assert {f"rewards/{name}/mean" for name in names} <= set(cli.trainer.callback_metrics)
