"""A reward function: 1.0 when the completion gives the right answer as <answer>N</answer>."""

import re

ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def exact_answer(prompts, completions, answer, **kw):
    """One score per completion; ``answer`` is the dataset's answer column, one value per completion."""
    scores = []
    for completion, expected in zip(completions, answer):
        found = ANSWER.search(completion)
        scores.append(1.0 if found and found.group(1) == str(expected).strip() else 0.0)
    return scores
