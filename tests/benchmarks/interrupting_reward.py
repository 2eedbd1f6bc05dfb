"""A reward for the resume tests of ``benchmarks/parity.py``: ``length_parity_reward`` that, on its Nth call
in a process, sends a signal to that process when ``PARITY_TEST_SIGNAL=SIGNAL:N`` says so (SIGTERM: the
driver's request to stop; SIGKILL: a kill in the middle of step N). One call a step on both sides."""

from __future__ import annotations

import os
import signal

from tests.helpers import length_parity_reward

calls = 0


def interrupting_reward(prompts: list, completions: list, **columns) -> list[float]:
    global calls
    calls += 1
    name, _, at = os.environ.get("PARITY_TEST_SIGNAL", "").partition(":")
    if name and calls == int(at):
        os.kill(os.getpid(), getattr(signal, name))
    return length_parity_reward(prompts, completions)
