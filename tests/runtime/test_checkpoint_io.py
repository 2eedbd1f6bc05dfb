"""Checkpoint files: written atomically (a write that fails leaves the previous file), and a truncated
or corrupt one given to resume from is an error naming it and the checkpoint to resume from instead,
raised by the CLI before any model is built and by the CheckpointIO when Lightning picks the file.

The kill-and-resume proof, with real processes killed by SIGKILL, is ``tests/checkpoints/test_kill_resume.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from tests.helpers import make_data, make_module

from grpo_lightning.runtime.checkpoint_io import (
    AtomicCheckpointIO,
    CorruptCheckpointError,
    check_checkpoint,
    damage,
)
from grpo_lightning.cli.app import GRPOLightningCLI, main
from grpo_lightning.checkpoints.export import read_checkpoint
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.runtime.strategies import PolicyFSDPStrategy

CONFIGS = config_dir()
CLI_ARGS = [
    "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
    "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", "no/such/model",
]  # fmt: skip


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("fails while the checkpoint is written")


def write(path: Path, step: int) -> Path:
    """A small checkpoint written by the plugin; later steps get later modification times."""
    AtomicCheckpointIO().save_checkpoint({"global_step": step, "state_dict": {"w": torch.full((64,), step)}}, path)
    os.utime(path, ns=(step * 10**9, step * 10**9))
    return path


def truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    path = write(tmp_path / "last.ckpt", 1)
    with pytest.raises(RuntimeError, match="fails while"):
        AtomicCheckpointIO().save_checkpoint({"global_step": 2, "state_dict": {"w": Unpicklable()}}, path)
    assert AtomicCheckpointIO().load_checkpoint(path)["global_step"] == 1
    assert os.listdir(tmp_path) == ["last.ckpt"]


def test_a_checkpoint_gets_the_permissions_of_any_new_file(tmp_path):
    (tmp_path / "plain").write_bytes(b"")
    assert write(tmp_path / "step=1.ckpt", 1).stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_a_truncated_checkpoint_names_the_newest_complete_one_to_resume_from(tmp_path):
    ckpt = tmp_path / "runs" / "ckpt"
    write(ckpt / "step=20.ckpt", 20)
    write(ckpt / "step=10.ckpt", 10)
    bad = truncate(write(ckpt / "step=40.ckpt", 40))
    truncate(write(ckpt / "step=30.ckpt", 30))  # newer than step=20, but truncated too
    (ckpt / ".step=50.ckpt.a1b2.tmp").write_bytes(b"PK\x03\x04 partial")  # a killed write's temporary file
    with pytest.raises(CorruptCheckpointError) as error:
        check_checkpoint(bad)
    message = str(error.value)
    assert message.startswith(f"checkpoint {bad} is truncated or corrupt (")
    assert message.endswith(f"; resume from {ckpt / 'step=20.ckpt'} instead.")


def test_a_truncated_checkpoint_alone_in_its_directory_says_so(tmp_path):
    bad = truncate(write(tmp_path / "step=1.ckpt", 1))
    with pytest.raises(CorruptCheckpointError, match="no complete checkpoint is in the same directory"):
        check_checkpoint(bad)


def test_a_damaged_record_is_reported_when_the_checkpoint_is_read(tmp_path):
    """The index is intact, so the cheap check passes; torch's reader fails, and that is named too."""
    good = write(tmp_path / "step=1.ckpt", 1)
    data = bytearray(write(tmp_path / "step=2.ckpt", 2).read_bytes())
    data[data.index(b"PK\x03\x04", 1) : data.index(b"PK\x03\x04", 1) + 4] = b"XXXX"  # a record's header
    (tmp_path / "step=2.ckpt").write_bytes(data)
    assert damage(tmp_path / "step=2.ckpt") is None
    with pytest.raises(CorruptCheckpointError, match=f"step=2.ckpt is truncated or corrupt.*resume from {good}"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "step=2.ckpt")


def test_a_truncated_last_checkpoint_fails_when_lightning_picks_it(tmp_path):
    def trainer() -> L.Trainer:
        every = ModelCheckpoint(tmp_path / "ckpt", "{step}", every_n_train_steps=1, save_top_k=-1, save_last=True)
        return L.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         plugins=[AtomicCheckpointIO()], callbacks=[every], default_root_dir=tmp_path)  # fmt: skip

    trainer().fit(BoringModel())
    truncate(tmp_path / "ckpt" / "last.ckpt")
    with pytest.raises(CorruptCheckpointError, match="last.ckpt is truncated.*resume from .*step=2.ckpt instead"):
        trainer().fit(BoringModel(), ckpt_path="last")


class RecordingCheckpointIO(AtomicCheckpointIO):
    """The plugin, noting the paths it writes: which writer a strategy used is not visible otherwise."""

    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        self.saved.append(os.path.basename(path))
        super().save_checkpoint(checkpoint, path, storage_options)


def test_fsdp_full_checkpoints_are_written_by_the_plugin(tiny_model_dir, tmp_path):
    plugin = RecordingCheckpointIO()
    every = ModelCheckpoint(tmp_path / "ckpt", "{step}", every_n_train_steps=1, save_top_k=-1)
    trainer = L.Trainer(
        strategy=PolicyFSDPStrategy(mixed_precision=None, state_dict_type="full"), max_steps=2, accelerator="cpu",
        devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        num_sanity_val_steps=0, plugins=[plugin], callbacks=[every],
    )  # fmt: skip
    trainer.fit(make_module(tiny_model_dir, policy={"dtype": "float32"}), datamodule=make_data())
    assert plugin.saved == ["step=1.ckpt", "step=2.ckpt"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == plugin.saved  # no temporary file left
    assert "policy.model.embed_tokens.weight" in read_checkpoint(tmp_path / "ckpt" / "step=2.ckpt")["state_dict"]


def test_fsdp_reads_a_truncated_checkpoint_through_the_same_check(tmp_path):
    """FSDP reads checkpoint files itself, not through the CheckpointIO."""
    write(tmp_path / "step=1.ckpt", 1)
    bad = truncate(write(tmp_path / "step=2.ckpt", 2))
    with pytest.raises(CorruptCheckpointError, match="step=2.ckpt.*resume from .*step=1.ckpt"):
        PolicyFSDPStrategy().load_checkpoint(bad)


def test_the_cli_writes_checkpoints_atomically_by_default(tiny_model_dir):
    cli = GRPOLightningCLI(args=[*CLI_ARGS, "--model.model", tiny_model_dir], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_the_cli_reports_a_truncated_ckpt_path_in_one_line_before_building_the_model(tmp_path, capsys):
    """The model directory does not exist: the checkpoint is checked before the model is even built."""
    write(tmp_path / "step=20.ckpt", 20)
    bad = truncate(write(tmp_path / "step=40.ckpt", 40))
    with pytest.raises(SystemExit) as done:
        main(["fit", *CLI_ARGS, "--ckpt_path", str(bad)], report_errors=True)
    assert done.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert line.startswith(f"error: checkpoint {bad} is truncated or corrupt")
    assert line.endswith(f"resume from {tmp_path / 'step=20.ckpt'} instead. (run again with --verbose for the traceback)")
