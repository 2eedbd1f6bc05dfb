"""Guess the number: a multi-step game with higher/lower feedback, scored by the guesses used."""

from __future__ import annotations

import hashlib
from typing import Any

from grpo_lightning.agents.messages import Message
from grpo_lightning.rewards.accuracy import extract_answer, parse_number


class GuessNumberEnvironment:
    """A secret integer in ``[low, high]``, the same for every trajectory of a task (drawn from a
    hash of the row's prompt and ``seed``). Each model turn is one guess, its answer
    (:func:`~grpo_lightning.rewards.accuracy.extract_answer`); the environment replies ``higher``,
    ``lower`` or ``invalid`` (no number). A right guess at the ``k``-th turn ends the episode with
    reward ``1 - (k - 1) / max_guesses``; ``max_guesses`` wrong ones end it with reward 0.

    Args:
        low, high: the range of the secret.
        max_guesses: guesses per episode.
        opening: the first message, with ``{low}`` and ``{high}`` (prompts of models with a small
            vocabulary, like the quickstart's, use symbols only).
        higher, lower, invalid: the replies (the quickstart's tiny model can write ``+`` and ``-`` only).
        seed: changes every task's secret.
    """

    def __init__(
        self,
        low: int = 0,
        high: int = 15,
        max_guesses: int = 4,
        opening: str = "I am thinking of a whole number from {low} to {high}. Guess it: reply with <answer>N</answer>.",
        higher: str = "higher",
        lower: str = "lower",
        invalid: str = "invalid",
        seed: int = 0,
    ) -> None:
        if low > high or max_guesses < 1:
            raise ValueError(f"need low <= high and max_guesses >= 1, got low={low}, high={high}, max_guesses={max_guesses}")
        self.low, self.high, self.max_guesses, self.seed = low, high, max_guesses, seed
        self.opening, self.replies = opening, {"higher": higher, "lower": lower, "invalid": invalid}
        self.secret, self.guesses = low, 0

    def reset(self, row: dict[str, Any]) -> list[Message]:
        digest = hashlib.blake2b(f"{self.seed}|{row['prompt']}".encode(), digest_size=8).digest()
        self.secret = self.low + int.from_bytes(digest, "little") % (self.high - self.low + 1)
        self.guesses = 0
        return [{"role": "user", "content": self.opening.format(low=self.low, high=self.high)}]

    def step(self, message: Message) -> tuple[list[Message], float | None, bool]:
        self.guesses += 1
        answer = extract_answer(message["content"])
        guess = parse_number(answer) if answer is not None else None
        if guess == self.secret:
            return [], 1.0 - (self.guesses - 1) / self.max_guesses, True
        if self.guesses >= self.max_guesses:
            return [], 0.0, True
        reply = "invalid" if guess is None else "higher" if guess < self.secret else "lower"
        return [{"role": "user", "content": self.replies[reply]}], None, False
