"""The answer shares behind ``answer_collapse``: answers compared as the vote compares them, over
every completion of a validation."""

from grpo_lightning.evaluation.answer_spread import answer_key, answer_shares, prompt_answers, reference_key


def test_an_answer_is_the_extracted_one_as_a_number_else_the_text_with_whitespace_collapsed():
    assert answer_key("<answer>0.50</answer>") == answer_key("so it is .5") == reference_key(" 1/2 ") == 0.5
    assert answer_key("  I do not\n know ") == "I do not know"
    assert reference_key("Paris") == answer_key("<answer>Paris</answer>") == "paris"


def test_the_shares_are_over_every_completion_of_prompts_of_several_samples():
    references = ["1", "1", "2", "2", "3", "3", "4", "4"]  # 4 prompts, 2 completions each
    completions = ["1", "1", "7", "7", "7", "7", "7", "4"]
    assert prompt_answers(references, completions, samples=2)[1] == (2.0, [7.0, 7.0])
    assert answer_shares(prompt_answers(references, completions, samples=2)) == {
        "top_answer_share": 5 / 8,
        "reference_top_answer_share": 2 / 8,
    }


def test_the_top_share_groups_numbers_as_the_vote_does():
    """``1/3``, ``0.3333333`` and ``0.33333333`` are one answer for ``maj@n``, and so for the share."""
    completions = ["<answer>1/3</answer>", "<answer>0.3333333</answer>", "<answer>0.33333333</answer>", "<answer>5</answer>"]
    shares = answer_shares(prompt_answers(["1/3"] * 4, completions, samples=4))
    assert shares["top_answer_share"] == 3 / 4
    big = ["<answer>66681335</answer>", "<answer>66681336</answer>", "<answer>text</answer>", "<answer>TEXT</answer>"]
    assert answer_shares(prompt_answers(["1"] * 4, big, samples=4))["top_answer_share"] == 2 / 4  # the two texts
