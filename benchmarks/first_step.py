"""The first step as a user meets it: seconds from the start of a new process to the end of its first
optimizer step, imports, loading and compilation included.

``run.py`` measures it for ours and TRL's in fresh processes (``--first-step``): ``cold`` with empty
compile caches (a new folder for each of :data:`CACHE_VARIABLES`), then ``warm``, a second process on
the caches the cold one filled. The clock is the parent's: from just before it starts the process to
the child's ``time.time()`` at the end of its first step (synchronised). The OS's file cache is warm
in both (the files were just written or read).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Where compiled code is kept between processes: Inductor's FX-graph and AOTAutograd caches, Triton's
#: kernels, and the project's own cache folder.
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "GRPO_LIGHTNING_CACHE")
#: Where a first step of ours goes, each phase ending at a mark the child records (``time.time()``):
#: the interpreter's start and the imports; the Trainer, module and data built; ``fit``'s setup up to
#: its training loop (the tokenizer and the models loaded, the strategy's setup, ``on_fit_start``);
#: the loop's start; the step itself.
PHASES = {"imports_s": "imports_end", "build_s": "fit_called", "setup_s": "train_start",
          "loop_start_s": "first_batch_start", "step_s": "first_step_end"}
#: What ``--first-step`` measures.
KINDS = {"both": ("cold", "warm"), "cold": ("cold",), "none": ()}


def cache_env(root: Path) -> dict[str, str]:
    """The environment of a process whose compile caches live under ``root`` (empty when new)."""
    env = dict(os.environ)
    for name in CACHE_VARIABLES:
        folder = root / name.lower()
        folder.mkdir(parents=True, exist_ok=True)
        env[name] = str(folder)
    return env


def timed_process(command: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """Run ``command`` (its last stdout line is a JSON object) and return that object and the
    ``time.time()`` just before the process started."""
    print("running:", " ".join(command), flush=True)
    launched = time.time()
    completed = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env)
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        sys.stdout.write(completed.stdout)
        raise SystemExit(f"{command[1]} failed with exit code {completed.returncode}")
    return json.loads(lines[-1]), launched


def first_step_s(child: dict[str, Any], launched: float) -> float:
    """Seconds from the process's launch to the end of its first optimizer step."""
    return child["first_step_end_time"] - launched


def first_step_phases(child: dict[str, Any], launched: float) -> dict[str, float]:
    """Seconds of each of :data:`PHASES` in a child's first step, from its launch; they add up to :func:`first_step_s`."""
    marks = {**child["first_step_marks"], "first_step_end": child["first_step_end_time"]}
    phases, previous = {}, launched
    for name, mark in PHASES.items():
        phases[name] = round(marks[mark] - previous, 3)
        previous = marks[mark]
    return phases


def ours_command(argv: list[str], workdir: str) -> list[str]:
    """``run.py`` with the parent's arguments, as a child that trains one step on the parent's files."""
    return [sys.executable, str(Path(__file__).with_name("run.py")), *argv, "--workdir", workdir, "--first-step-child"]


def measure_ours(argv: list[str], workdir: str, kinds: tuple[str, ...], cache_root: Path) -> dict[str, float]:
    """``first_step_s`` (cold) and ``first_step_warm_s`` of ours, each from its own process, with
    their phases (``first_step_cold_phases``, ``first_step_warm_phases``: :func:`first_step_phases`)."""
    figures = {}
    env = cache_env(cache_root)
    for kind in kinds:
        child, launched = timed_process(ours_command(argv, workdir), env)
        figures["first_step_s" if kind == "cold" else "first_step_warm_s"] = first_step_s(child, launched)
        figures[f"first_step_{kind}_phases"] = first_step_phases(child, launched)
    return figures
