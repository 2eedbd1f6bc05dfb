"""docs/bring_your_own, as a user runs it: the README's fit command, from the folder it says, on
the quickstart's cached warm start; greedy validation accuracy on validation.jsonl rises.

The margin: gains of greedy ``val/accuracy`` (100 prompts) after 200 steps, with this test's
command, ``--seed_everything`` 0, 1, 2, on each CPU kernel path (``ATEN_CPU_CAPABILITY``; each
path ends the warm start elsewhere, see test_learning.py), 2026-11-27, 2-core AMD EPYC, on the
warm start before its model read letters:

    AVX-512 (native): +0.36, +0.34           mean 0.35, std 0.014, mean - 3 std 0.31
    AVX2:             +0.15, +0.20, +0.20    mean 0.18, std 0.029, mean - 3 std 0.10
    scalar (default): +0.09, +0.06, +0.10    mean 0.08, std 0.021, mean - 3 std 0.02

The margin is the worst path's mean - 3 std: 0.02 (two more problems right of the hundred). Within
one machine the run is deterministic. The fit takes about 30 s (AVX-512) to 70 s. On the warm start
that reads printable ASCII and saw sums in words (a392bc3, AVX-512, seed 0): +0.26 (0.30 -> 0.56);
the other paths are not re-measured on it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.quickstart.warmstart import warm_start

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "docs" / "bring_your_own" / "README.md"
STEPS = 200
MARGIN = 0.02


@pytest.fixture(scope="module")
def warm_model_dir() -> str:
    return str(warm_start())


def readme_command() -> tuple[Path, list[str]]:
    """The folder the README's commands run in (its ``cd`` line) and its ``grpo-lightning fit`` command."""
    lines = README.read_text().splitlines()
    folder = next(line.split(maxsplit=1)[1] for line in lines if line.startswith("cd "))
    fit = next(line for line in lines if line.startswith("grpo-lightning fit "))
    return REPO_ROOT / folder, shlex.split(fit)


def test_the_readme_fit_raises_validation_accuracy(warm_model_dir, tmp_path):
    folder, command = readme_command()
    assert command[-2:] == ["--model.model", "$MODEL"]
    executable = shutil.which("grpo-lightning", path=str(Path(sys.executable).parent))
    program = [executable] if executable else [sys.executable, "-m", "grpo_lightning.cli"]
    command = [*program, *command[1:-1], warm_model_dir]
    command += [
        f"--trainer.max_steps={STEPS}",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks=[]",  # no progress bar, no checkpoints: the test reads the logs only
        f"--trainer.log_every_n_steps={STEPS}",  # training metrics at the end only (host time); validation's every time
    ]  # every fit validates before its first step: val/accuracy at step 0 is the warm start's
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same numbers on 1 or 2 threads, faster on a busy CPU
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"fit: {time.perf_counter() - start:.0f} s")

    (log_dir,) = (tmp_path / "bring_your_own").glob("version_*")
    events = EventAccumulator(str(log_dir))
    events.Reload()
    accuracy = [(event.step, event.value) for event in events.Scalars("val/accuracy")]
    (first_step, before), (last_step, after) = accuracy[0], accuracy[-1]
    assert first_step == 0 and last_step == STEPS, accuracy  # optimizer steps: the last validation ends the fit
    print(f"val/accuracy {before:.2f} -> {after:.2f} (margin {MARGIN})")
    assert after >= before + MARGIN, accuracy
    assert re.search(r"prompts: plain text is sent as it is", done.stderr + done.stdout)


def test_make_data_writes_the_shipped_rows_which_the_quickstart_model_reads_whole(tmp_path):
    """make_data.py reproduces both tasks' files, and the quickstart model's tokenizer loses no
    character of the task in words (``larger/``)."""
    from grpo_lightning.data.coverage import lost_prompt_characters
    from grpo_lightning.quickstart.tiny import TEXT_ALPHABET, build_char_tokenizer

    folder = README.parent
    subprocess.run([sys.executable, str(folder / "make_data.py")], cwd=tmp_path, check=True, timeout=60)
    files = ["train.jsonl", "validation.jsonl", "larger/train.jsonl", "larger/validation.jsonl"]
    for name in files:
        assert (tmp_path / name).read_text() == (folder / name).read_text(), name
    prompts = [json.loads(line)["prompt"] for name in files[2:] for line in (folder / name).read_text().splitlines()]
    assert len(prompts) == len(set(prompts)) == 500 and prompts[0].startswith("Which is larger, ")
    assert lost_prompt_characters(prompts, build_char_tokenizer(TEXT_ALPHABET), str) == []
