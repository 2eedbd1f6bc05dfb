"""A fit killed with SIGKILL, in the middle of a step or while writing a checkpoint, resumed from its
last checkpoint in a new process, ends with the weights and logs, for every step after the resume
point, of one uninterrupted fit (exactly: atol 0).

Each fit is a real process (``FIT`` below, a CPU fit of the tiny model with
:class:`~grpo_lightning.runtime.checkpoint_io.AtomicCheckpointIO` and a checkpoint every step). To kill it at
a known point, the script, told by ``PAUSE`` (the test's own switch, not the library's), writes a
``paused`` file there and sleeps until the test kills it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import pytest
import torch

from grpo_lightning.runtime.checkpoint_io import damage

ROOT = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 4
KILLED_IN = 3  # the step the kill lands in: steps 1 and 2 are checkpointed

FIT = """
import json, os, sys, time
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from grpo_lightning.runtime.checkpoint_io import AtomicCheckpointIO
from tests.helpers import StepRecorder, make_data, make_module

model_dir, out, ckpt_dir, max_steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ckpt_path = sys.argv[5] if len(sys.argv) > 5 else None
where, _, at = os.environ.get("PAUSE", "").partition(":")  # "update:3" or "write:step=3.ckpt"
torch.set_num_threads(1)


def pause():
    with open(os.path.join(out, "paused"), "w") as f:
        f.write(where)
    time.sleep(300)  # until the test kills this process


class Record(StepRecorder):
    # Each step's metrics on disk as soon as the step ends: what a killed process leaves.
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        before = self.last
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.last > before:
            with open(os.path.join(out, "steps.jsonl"), "a") as f:
                metrics = {k: float(v) for k, v in self.steps[self.last].items()}
                f.write(json.dumps({"step": self.last, "metrics": metrics}) + "\\n")


class PauseBeforeUpdate(L.Callback):
    # In step `at`: its rollout sampled, its gradient taken, the optimizer not yet stepped.
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if where == "update" and trainer.global_step == int(at) - 1:
            pause()


if where == "write":  # the checkpoint's temporary file written and synced, not yet renamed
    replace = os.replace

    def paused_replace(source, target):
        if os.path.basename(target) == at:
            pause()
        replace(source, target)

    os.replace = paused_replace

L.seed_everything(0)
every_step = ModelCheckpoint(ckpt_dir, "{step}", every_n_train_steps=1, save_top_k=-1, save_last=True)
trainer = L.Trainer(
    max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
    enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=1,
    default_root_dir=out, plugins=[AtomicCheckpointIO()], callbacks=[Record(), PauseBeforeUpdate(), every_step],
)
module = make_module(model_dir, kl={"beta": 0.04})
trainer.fit(module, datamodule=make_data(), ckpt_path=ckpt_path)
torch.save(module.policy.state_dict(), os.path.join(out, "weights.pt"))
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


class Fit:
    """One fit in its own process: ``out`` gets its per-step metrics and final weights."""

    def __init__(self, script: Path, model_dir: str, out: Path, ckpt_dir: Path, ckpt_path: str | None = None,
                 pause: str = "") -> None:  # fmt: skip
        self.out = out
        out.mkdir(parents=True)
        args = [model_dir, str(out), str(ckpt_dir), str(TOTAL_STEPS)] + ([ckpt_path] if ckpt_path else [])
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path, "PAUSE": pause, "OMP_NUM_THREADS": "1"}
        with open(out / "output.txt", "w") as log:  # the process writes to its own copy of the handle
            self.process = subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, env=env,
                                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip

    def output(self) -> str:
        return (self.out / "output.txt").read_text()[-3000:]

    def finish(self) -> Fit:
        assert self.process.wait(timeout=300) == 0, self.output()
        return self

    def kill_when_paused(self) -> None:
        """Wait until the fit pauses where ``pause`` said, then SIGKILL it (``kill -9``)."""
        deadline = time.monotonic() + 300
        while not (self.out / "paused").exists():
            assert self.process.poll() is None, "the fit ended before its pause:\n" + self.output()
            assert time.monotonic() < deadline, "the fit never paused"
            time.sleep(0.05)
        os.kill(self.process.pid, signal.SIGKILL)
        assert self.process.wait(timeout=60) == -signal.SIGKILL

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()  # a failed test leaves no process behind

    def steps(self) -> dict[int, dict[str, float]]:
        lines = (self.out / "steps.jsonl").read_text().splitlines()
        return {row["step"]: row["metrics"] for row in map(json.loads, lines)}

    def weights(self) -> dict[str, torch.Tensor]:
        return torch.load(self.out / "weights.pt", weights_only=True)


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kill_resume") / "fit.py"
    path.write_text(FIT)
    return path


@pytest.fixture(scope="module")
def uninterrupted(script, tiny_model_dir, tmp_path_factory):
    """The reference fit, started at once (it runs beside the first test's killed fit)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    fit = Fit(script, tiny_model_dir, root / "fit", root / "ckpt")
    yield fit
    fit.stop()


def assert_resumed_like_uninterrupted(resumed: Fit, uninterrupted: Fit, killed: Fit, killed_logged: int) -> None:
    """The killed fit logged steps 1..``killed_logged``; the resumed one, from ``KILLED_IN`` on, what
    the uninterrupted fit logged, and ends with its weights."""
    reference = uninterrupted.finish().steps()
    assert sorted(reference) == list(range(1, TOTAL_STEPS + 1))
    assert killed.steps() == {step: reference[step] for step in range(1, killed_logged + 1)}
    assert resumed.steps() == {step: reference[step] for step in range(KILLED_IN, TOTAL_STEPS + 1)}  # atol 0
    final, expected = resumed.weights(), uninterrupted.weights()
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[name], expected[name]) for name in expected)


def test_a_fit_killed_in_the_middle_of_a_step_resumes_to_the_uninterrupted_result(
    script, tiny_model_dir, tmp_path, uninterrupted
):
    ckpt = tmp_path / "ckpt"
    with Fit(script, tiny_model_dir, tmp_path / "killed", ckpt, pause=f"update:{KILLED_IN}") as killed:
        killed.kill_when_paused()
    assert sorted(p.name for p in ckpt.glob("*.ckpt")) == ["last.ckpt", "step=1.ckpt", "step=2.ckpt"]

    with Fit(script, tiny_model_dir, tmp_path / "resumed", ckpt, ckpt_path="last") as resumed:
        resumed.finish()
    assert_resumed_like_uninterrupted(resumed, uninterrupted, killed, killed_logged=KILLED_IN - 1)


def test_a_fit_killed_while_writing_a_checkpoint_leaves_none_truncated_and_resumes(
    script, tiny_model_dir, tmp_path, uninterrupted
):
    ckpt = tmp_path / "ckpt"
    with Fit(script, tiny_model_dir, tmp_path / "killed", ckpt, pause=f"write:step={KILLED_IN}.ckpt") as killed:
        killed.kill_when_paused()
    # The new checkpoint is only under its temporary name; every file under a final name is whole.
    assert sorted(p.name for p in ckpt.glob("*.ckpt")) == ["last.ckpt", "step=1.ckpt", "step=2.ckpt"]
    assert [damage(p) for p in ckpt.glob("*.ckpt")] == [None] * 3
    (stray,) = ckpt.glob(f".step={KILLED_IN}.ckpt.*.tmp")

    with Fit(script, tiny_model_dir, tmp_path / "resumed", ckpt, ckpt_path="last") as resumed:
        resumed.finish()
    # Step 3 ended (and was logged) before its checkpoint's write was killed: the resumed fit redoes it.
    assert_resumed_like_uninterrupted(resumed, uninterrupted, killed, killed_logged=KILLED_IN)
    assert not stray.exists(), "the resumed fit's write of the same name removes the killed write's file"
