"""However a ``grpo-lightning fit`` ends (``max_steps`` off the checkpoint interval, ``max_time``, an
early stop, SIGTERM, SIGINT, with its output's reader gone), ``last.ckpt`` holds its last completed
optimizer step and the summary names that step.

The fits are real CLI fits of the tiny model with a checkpoint every 2 steps, each ended at an odd
step: Lightning's own ``last.ckpt`` stays at the step before. The signal tests run ``grpo-lightning fit`` as a process and signal it
while :class:`PauseAtStep` (a test callback, appended with ``--trainer.callbacks+=``) holds it at the
end of a known step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from grpo_lightning.runtime import time_budget
from grpo_lightning.runtime.checkpoint_io import load_checkpoint_file
from grpo_lightning.cli.app import main
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()
ROOT = Path(__file__).resolve().parents[2]


class PauseAtStep(L.Callback):
    """At the end of optimizer step ``$PAUSE_AT_STEP``: write ``$PAUSE_DIR/paused`` and wait (at most
    two minutes) until the trainer has received the stop signal the test sends."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != int(os.environ.get("PAUSE_AT_STEP", "-1")):
            return
        Path(os.environ["PAUSE_DIR"], "paused").write_text(str(trainer.global_step))
        deadline = time.monotonic() + 120
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.05)


class BudgetClock:
    """The clock of ``grpo_lightning.runtime.time_budget``: the real time plus ``ahead`` seconds."""

    ahead = 0.0

    @classmethod
    def time(cls) -> float:
        return time.time() + cls.ahead


class ClockJumpsInTheThirdStep(L.Callback):
    """Step 3 takes a day by the budget's clock: a ``max_time`` of an hour runs out in it, however long
    loading and the first two steps take on a busy machine."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 2:
            BudgetClock.ahead = 24 * 3600.0


def fit_args(model_dir: str, root: Path, *extra: str, steps: int = 5) -> list[str]:
    return [
        "fit",
        "--config",
        str(CONFIGS / "trainer/cpu.yaml"),
        "--config",
        str(CONFIGS / "data/arithmetic.yaml"),
        "--config",
        str(CONFIGS / "variant/grpo.yaml"),
        "--model.model",
        model_dir,
        "--model.sampling.group_size",
        "2",
        "--model.sampling.max_new_tokens",
        "4",
        "--model.optim.micro_batch_size",
        "8",
        "--data.batch_size",
        "2",
        "--data.num_train",
        "64",
        "--data.num_val",
        "4",
        "--data.val_batch_size",
        "4",
        "--trainer.max_steps",
        str(steps),
        "--trainer.val_check_interval",
        "100",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.default_root_dir",
        str(root),
        "--trainer.logger.init_args.save_dir",
        str(root),
        "--trainer.callbacks.every_n_train_steps",
        "2",
        *extra,
    ]


def last_step(root: Path) -> int:
    """The optimizer step of the fit's ``last.ckpt``."""
    return load_checkpoint_file(root / "grpo" / "version_0" / "checkpoints" / "last.ckpt")["global_step"]


def summary_checkpoint(printed: str) -> tuple[Path, int]:
    """The checkpoint line of the fit summary: its path and the step it names."""
    line = printed.split("checkpoint:  ")[1].splitlines()[0]
    path, _, step = line.rpartition(" (optimizer step ")
    return Path(path), int(step.rstrip(")"))


def test_a_fit_off_the_checkpoint_interval_ends_with_last_ckpt_at_its_last_step(
    tiny_model_dir, tmp_path, one_torch_thread, capsys
):
    rewards = ("--model.rewards.funcs", "[tests.helpers.length_parity_reward]")  # a gradient, so optimizer state
    main(fit_args(tiny_model_dir, tmp_path, *rewards, steps=3))
    printed = capsys.readouterr().out
    assert last_step(tmp_path) == 3
    assert summary_checkpoint(printed) == (tmp_path / "grpo" / "version_0" / "checkpoints" / "last.ckpt", 3)

    # Resumed to 5: last.ckpt moves on to 5, past the interval's step 4.
    last = tmp_path / "grpo" / "version_0" / "checkpoints" / "last.ckpt"
    # The command line's fit releases the optimizer's state at its end, after last.ckpt took it.
    assert torch.load(last, weights_only=False)["optimizer_states"][0]["state"]
    main(fit_args(tiny_model_dir, tmp_path, *rewards, "--ckpt_path", str(last), steps=5))
    assert last_step(tmp_path) == 5
    assert summary_checkpoint(capsys.readouterr().out)[1] == 5


def test_a_run_folder_copied_elsewhere_resumes_into_its_own_last_ckpt(tiny_model_dir, tmp_path, one_torch_thread, capsys):
    """Lightning restores where last.ckpt is only for the folder path it recorded: resumed in a copy of
    the run folder, the fit wrote last-v1.ckpt and left last.ckpt at the step it resumed from."""
    import shutil

    main(fit_args(tiny_model_dir, tmp_path / "first", steps=1))
    capsys.readouterr()
    copy = shutil.copytree(tmp_path / "first", tmp_path / "copy")
    last = copy / "grpo" / "version_0" / "checkpoints" / "last.ckpt"
    main(fit_args(tiny_model_dir, copy, "--ckpt_path", str(last), steps=3))
    assert sorted(p.name for p in last.parent.glob("last*.ckpt")) == ["last.ckpt"]
    assert last_step(copy) == 3 and summary_checkpoint(capsys.readouterr().out) == (last, 3)


def test_without_a_save_last_checkpoint_the_first_one_writes_last_ckpt(tiny_model_dir, tmp_path, one_torch_thread):
    main(fit_args(tiny_model_dir, tmp_path, "--trainer.callbacks.save_last", "false", steps=3))
    assert last_step(tmp_path) == 3


def test_a_fit_ended_by_max_time_saves_its_last_step(tiny_model_dir, tmp_path, one_torch_thread, capsys, monkeypatch):
    monkeypatch.setattr(time_budget, "time", BudgetClock)
    monkeypatch.setattr(BudgetClock, "ahead", 0.0)
    jump = f"{__name__}.ClockJumpsInTheThirdStep"
    main(fit_args(
        tiny_model_dir, tmp_path, "--trainer.max_time", "00:01:00:00", f"--trainer.callbacks+={jump}",
        "--validate_before_fit", "false", steps=40,
    ))  # fmt: skip
    printed = capsys.readouterr().out
    assert "fit finished: 3 / 40 optimizer steps" in printed, printed  # stopped after the step the budget ran out in
    assert last_step(tmp_path) == 3
    assert summary_checkpoint(printed)[1] == 3


def test_an_early_stopped_fit_saves_its_last_step(tiny_model_dir, tmp_path, one_torch_thread, capsys):
    # The tiny model's accuracy stays 0: no improvement after the validation at step 0 stops the fit.
    main(fit_args(
        tiny_model_dir, tmp_path, "--trainer.val_check_interval", "3", "--trainer.callbacks+=EarlyStopping",
        "--trainer.callbacks.monitor", "val/accuracy", "--trainer.callbacks.mode", "max",
        "--trainer.callbacks.patience", "0", steps=40,
    ))  # fmt: skip
    printed = capsys.readouterr().out
    assert "fit finished: 3 / 40 optimizer steps" in printed
    assert last_step(tmp_path) == 3
    assert summary_checkpoint(printed)[1] == 3


PAUSE = f"--trainer.callbacks+={Path(__file__).stem}.PauseAtStep"


def cli_env(tmp_path: Path, paused_at: int = -1) -> dict[str, str]:
    """The environment of a ``grpo-lightning fit`` process that :class:`PauseAtStep` holds at ``paused_at``."""
    return {
        **os.environ, "PAUSE_AT_STEP": str(paused_at), "PAUSE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "checkpoints"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }  # fmt: skip


def wait_until_paused(process: subprocess.Popen, tmp_path: Path) -> None:
    deadline = time.monotonic() + 300
    while not (tmp_path / "paused").exists():
        assert process.poll() is None, (tmp_path / "output.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, "the fit never reached its pause"
        time.sleep(0.05)


def cli_command() -> list[str]:
    script = Path(sys.executable).with_name("grpo-lightning")
    return [str(script)] if script.exists() else [sys.executable, "-m", "grpo_lightning.cli"]  # the same console_main


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_fit_stopped_by_a_signal_saves_its_last_completed_step(tiny_model_dir, tmp_path, stop, one_torch_thread):
    paused_at = 3
    args = fit_args(tiny_model_dir, tmp_path, PAUSE, steps=40)
    with open(tmp_path / "output.txt", "w") as log:
        process = subprocess.Popen(
            [*cli_command(), *args], cwd=tmp_path, env=cli_env(tmp_path, paused_at), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_until_paused(process, tmp_path)
        process.send_signal(stop)
        status = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    printed = (tmp_path / "output.txt").read_text()
    assert status == 128 + stop, printed[-3000:]  # not 0: the fit did not reach max_steps
    assert last_step(tmp_path) == paused_at, printed[-3000:]
    assert f"fit stopped by {stop.name}: {paused_at} / 40 optimizer steps" in printed
    assert summary_checkpoint(printed)[1] == paused_at
    assert not list((tmp_path / "grpo" / "version_0" / "checkpoints").glob(".*.tmp"))  # written atomically
    if stop == signal.SIGTERM:  # resumed, it ends where one uninterrupted fit ends
        last = tmp_path / "grpo" / "version_0" / "checkpoints" / "last.ckpt"
        main(fit_args(tiny_model_dir, tmp_path, "--ckpt_path", str(last)))
        main(fit_args(tiny_model_dir, tmp_path / "uninterrupted"))
        assert_same_weights(tmp_path, tmp_path / "uninterrupted", steps=5)


def assert_same_weights(root: Path, other: Path, steps: int) -> None:
    first, second = (load_checkpoint_file(r / "grpo" / "version_0" / "checkpoints" / "last.ckpt") for r in (root, other))
    assert first["global_step"] == second["global_step"] == steps
    assert first["state_dict"].keys() == second["state_dict"].keys()
    assert all(torch.equal(first["state_dict"][k], second["state_dict"][k]) for k in first["state_dict"])


def test_the_final_checkpoint_is_a_state_to_resume_from(tiny_model_dir, tmp_path, one_torch_thread, capsys):
    """A fit of 5 steps ended at 3 (off the interval) and resumed ends with the weights of one
    uninterrupted 5-step fit."""
    main(fit_args(tiny_model_dir, tmp_path / "full", "--seed_everything", "1"))
    main(fit_args(tiny_model_dir, tmp_path / "parts", "--seed_everything", "1", steps=3))
    last = tmp_path / "parts" / "grpo" / "version_0" / "checkpoints" / "last.ckpt"
    main(fit_args(tiny_model_dir, tmp_path / "parts", "--seed_everything", "1", "--ckpt_path", str(last)))
    capsys.readouterr()
    assert_same_weights(tmp_path / "full", tmp_path / "parts", steps=5)


def piped_fit(model_dir: str, tmp_path: Path, reader: list[str], *extra: str, steps: int, stderr_too: bool = False,
              paused_at: int = -1) -> tuple[subprocess.Popen, subprocess.Popen]:  # fmt: skip
    """``grpo-lightning fit ... | reader`` (``2>&1 | reader`` with ``stderr_too``), with its progress bar: two real
    processes joined by a pipe; the fit's stderr goes to ``output.txt`` otherwise."""
    args = fit_args(model_dir, tmp_path, "--trainer.enable_progress_bar", "true", *extra, steps=steps)
    with open(tmp_path / "output.txt", "w") as log:
        fit = subprocess.Popen(
            [*cli_command(), *args], cwd=tmp_path, env=cli_env(tmp_path, paused_at), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if stderr_too else log,
        )  # fmt: skip
    reader_process = subprocess.Popen(reader, stdin=fit.stdout, stdout=subprocess.DEVNULL)
    fit.stdout.close()  # the reader holds the pipe's only read end: when it exits, the fit's writes fail
    return fit, reader_process


@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_fit_piped_to_a_reader_that_exits_early_ends_at_max_steps_with_last_ckpt(
    tiny_model_dir, tmp_path, stderr_too, one_torch_thread
):
    """``grpo-lightning fit ... | head -n 3``: ``head`` exits after three lines, the fit's later writes (its
    progress bar, its summary) find the pipe closed, and the fit goes on silently to ``max_steps``."""
    fit, head = piped_fit(tiny_model_dir, tmp_path, ["head", "-n", "3"], steps=3, stderr_too=stderr_too)
    try:
        status = fit.wait(timeout=300)
    finally:
        fit.kill()
        head.kill()
    assert head.wait() == 0
    printed = (tmp_path / "output.txt").read_text()
    assert status == 0, printed[-3000:]
    assert last_step(tmp_path) == 3
    if not stderr_too:  # the fit wrote to the closed pipe, and said so
        assert "stdout is closed (Broken pipe)" in printed


def test_ctrl_c_on_a_piped_fit_saves_the_step_it_reached(tiny_model_dir, tmp_path, one_torch_thread):
    """Ctrl+C on ``grpo-lightning fit ... | tee out.log``: the terminal signals both, ``tee`` dies and the fit,
    stopping after its step, writes to the closed pipe."""
    paused_at = 2
    fit, tee = piped_fit(tiny_model_dir, tmp_path, ["cat"], PAUSE, steps=40, paused_at=paused_at)
    try:
        wait_until_paused(fit, tmp_path)
        tee.kill()
        tee.wait()
        fit.send_signal(signal.SIGINT)
        status = fit.wait(timeout=120)
    finally:
        fit.kill()
        fit.wait()
    printed = (tmp_path / "output.txt").read_text()
    assert status == 128 + signal.SIGINT, printed[-3000:]
    assert last_step(tmp_path) == paused_at, printed[-3000:]
    assert "stdout is closed (Broken pipe)" in printed
