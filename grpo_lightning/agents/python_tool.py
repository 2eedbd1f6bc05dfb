"""A tool that runs the model's Python code in the code-execution sandbox (:mod:`grpo_lightning.rewards.code_execution`)."""

from __future__ import annotations

from functools import lru_cache

from grpo_lightning.rewards.code_execution import CodeExecutionReward

#: Wall-clock seconds a program may run: under ``ToolEnvironment``'s default ``tool_timeout`` (5 s),
#: so that the sandbox, not the tool's timeout, stops it and the model reads what it printed.
PYTHON_TIMEOUT_S = 3.0
#: Characters of a program's output the model reads.
PYTHON_OUTPUT_CHARS = 2000


@lru_cache(maxsize=1)
def sandbox() -> CodeExecutionReward:
    """The sandbox runner, made once (it checks the backend on first use)."""
    return CodeExecutionReward(timeout_s=PYTHON_TIMEOUT_S, memory_mb=512, max_output_bytes=PYTHON_OUTPUT_CHARS * 4)


def python(code: str) -> str:
    """Run a Python program in a sandbox (no network, no files outside its folder) and return what it prints.

    Args:
        code: the program; it must print the values it wants to see.
    """
    run = sandbox().run("stdio", code)
    output = run.output.decode("utf-8", errors="replace")[:PYTHON_OUTPUT_CHARS]
    if run.status is None:
        return f"{output}\n(stopped: over {PYTHON_TIMEOUT_S:g} s or too much output)"
    return output if run.status == 0 else f"{output}\n(exit status {run.status})"
