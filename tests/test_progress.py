"""A long loop's progress on a stream that is not a terminal (a log): plain lines with steps done, total and ETA."""

from __future__ import annotations

import io

from grpo_lightning.progress import step_progress


def run_loop(steps: int, stop_after: int | None = None) -> list[str]:
    log = io.StringIO()  # not a terminal, as stderr redirected to a file
    with step_progress("warm start", steps, stream=log, every_s=0.0) as advance:
        for step in range(1, steps + 1):
            sum(range(1000))  # a real, short step
            advance(step)
            if step == stop_after:
                break
    return log.getvalue().splitlines()


def test_a_loop_in_a_log_prints_plain_lines_of_steps_done_of_the_total_with_an_eta():
    lines = run_loop(5)
    assert lines[0].startswith("warm start: 1/5 steps, 0:00:00 elapsed, ETA ")
    assert any(line.startswith("warm start: 3/5 steps, ") and ", ETA 0:00:0" in line for line in lines)
    assert all("\r" not in line and "\x1b" not in line for line in lines)  # no bar drawing in a log


def test_the_last_line_says_the_loop_is_done():
    assert run_loop(5)[-1].startswith("warm start: 5/5 steps in ") and run_loop(5)[-1].endswith(", done")


def test_a_loop_that_stops_early_says_where_it_stopped():
    assert run_loop(5, stop_after=2)[-1].startswith("warm start: stopped after 2 of at most 5 steps")
