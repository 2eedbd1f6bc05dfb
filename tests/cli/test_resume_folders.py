"""A run folder holds one history: a CLI fit resumed into its checkpoint's folder continues from the
folder's newest checkpoint only (an older one is refused, naming both and the fix), and TensorBoard
and CSV logs show each step once after a kill and a resume (what the killed fit logged after its
checkpoint goes, what it logged before stays), both in the run's one version folder."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.cli.app import main
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()
RUN = [
    *("--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml")),
    *("--config", str(CONFIGS / "variant/grpo.yaml")),
    *("--model.sampling.group_size", "2", "--model.sampling.max_new_tokens", "4", "--model.evaluation.max_new_tokens", "4"),
    *("--model.rewards.funcs", "[tests.helpers.length_parity_reward]"),
    *("--data.batch_size", "2", "--data.num_train", "8", "--data.num_val", "2", "--validate_before_fit", "false"),
    *("--trainer.enable_progress_bar", "false", "--trainer.max_steps", "4", "--trainer.val_check_interval", "2"),
    *("--trainer.callbacks.every_n_train_steps", "2", "--trainer.callbacks.save_top_k", "-1"),  # the config's last.ckpt one
]


def fit(root: Path, model_dir: str, *extra: str) -> None:
    main(["fit", *RUN, "--model.model", model_dir, "--trainer.default_root_dir", str(root),
          "--trainer.logger.init_args.save_dir", str(root), *extra], report_errors=True)  # fmt: skip


@pytest.fixture
def four_steps(tiny_model_dir, tmp_path, one_torch_thread) -> Path:
    """``grpo/version_0`` of a 4-step fit checkpointed (and validated) at steps 2 and 4, in ``tmp_path``
    (a copy elsewhere would not resume as the run: Lightning's ModelCheckpoint keeps its state only
    in the folder it saved it in)."""
    fit(tmp_path, tiny_model_dir)
    return tmp_path


def steps_of(run: Path, tag: str) -> list[int]:
    events = EventAccumulator(str(run))  # the whole folder, as TensorBoard reads a run
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_resuming_from_an_older_checkpoint_of_the_run_folder_is_refused_naming_both(four_steps, tiny_model_dir, tmp_path, capsys):
    folder = tmp_path / "grpo/version_0/checkpoints"
    (older,) = folder.glob("*step=2.ckpt")
    before = sorted(p.name for p in (tmp_path / "grpo").rglob("*"))
    with pytest.raises(SystemExit) as stopped:
        fit(tmp_path, tiny_model_dir, "--trainer.max_steps", "6", "--ckpt_path", str(older))
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--ckpt_path {older} (optimizer step 2) is older than {folder / 'last.ckpt'} (optimizer step 4)" in error
    assert "--trainer.logger.init_args.version 1 (a new version folder)" in error
    assert sorted(p.name for p in (tmp_path / "grpo").rglob("*")) == before  # nothing written

    # The fix it names: the branch gets a folder of its own, and version_0 keeps its one history.
    fit(tmp_path, tiny_model_dir, "--ckpt_path", str(older), "--trainer.logger.init_args.version", "1")
    assert sorted(p.name for p in (tmp_path / "grpo/version_1/checkpoints").glob("*.ckpt")) == ["epoch=0-step=4.ckpt", "last.ckpt"]
    assert steps_of(tmp_path / "grpo/version_1", "reward") == [3, 4]
    assert sorted(p.name for p in (tmp_path / "grpo").rglob("*")) == sorted(before + ["version_1"] + [
        p.name for p in (tmp_path / "grpo/version_1").rglob("*")])  # fmt: skip


class FailBeforeStep4(L.Callback):
    """Stops a fit as a kill would: after step 3 is logged, before any checkpoint of it (at step 2)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 3:
            raise RuntimeError("killed")


def test_a_fit_killed_after_its_checkpoint_and_resumed_shows_each_step_once_in_tensorboard(tiny_model_dir, tmp_path, one_torch_thread):
    with pytest.raises(RuntimeError, match="killed"):
        fit(tmp_path, tiny_model_dir, f"--trainer.callbacks+={__name__}.FailBeforeStep4")
    run = tmp_path / "grpo/version_0"
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 2
    assert steps_of(run, "reward") == [1, 2, 3]  # step 3 logged after the last checkpoint

    fit(tmp_path, tiny_model_dir, "--ckpt_path", "last")
    assert sorted(p.name for p in (run / "checkpoints").glob("*.ckpt")) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 4
    for tag in ("reward", "loss"):
        assert steps_of(run, tag) == [1, 2, 3, 4], tag  # once each: the killed fit's step 3 is dropped
    assert steps_of(run, "val/reward") == [2, 4]  # step 2's validation (after its checkpoint) is kept
    events = EventAccumulator(str(run))
    events.Reload()
    (killed, resumed) = sorted(run.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)
    resumed_events = EventAccumulator(str(resumed))
    resumed_events.Reload()
    assert [e.value for e in events.Scalars("reward")][2:] == [e.value for e in resumed_events.Scalars("reward")]


def csv_steps(path: Path, column: str) -> list[int]:
    with path.open(newline="") as file:
        return [int(row["step"]) for row in csv.DictReader(file) if row.get(column)]


def test_a_csv_logger_beside_tensorboard_shares_its_folder_and_keeps_the_steps_before_a_resume(tiny_model_dir, tmp_path,
                                                                                              one_torch_thread):
    with_csv = ("--trainer.logger+=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(tmp_path))
    with pytest.raises(RuntimeError, match="killed"):
        fit(tmp_path, tiny_model_dir, f"--trainer.callbacks+={__name__}.FailBeforeStep4", *with_csv)
    run = tmp_path / "grpo/version_0"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("metrics.csv")) == ["grpo/version_0/metrics.csv"]
    assert csv_steps(run / "metrics.csv", "reward") == [1, 2, 3]

    fit(tmp_path, tiny_model_dir, "--ckpt_path", "last", *with_csv)  # Lightning's CSV writer alone would delete 1 and 2
    assert csv_steps(run / "metrics.csv", "reward") == [1, 2, 3, 4]
    assert csv_steps(run / "metrics.csv", "val/reward") == [2, 4]
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("metrics")) == ["metrics.csv"]
    assert steps_of(run, "reward") == [1, 2, 3, 4]
