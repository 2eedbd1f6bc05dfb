"""Reading checkpoints is safe: every reader (resume, ``validate``/``generate``, ``export``) loads with
``weights_only=True``, so a crafted pickle runs no code; a damaged file is one ``error:`` line naming
it; ``--ckpt_path last`` resumes the newest run of the name or stops with an error."""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from grpo_lightning.runtime.checkpoint_io import UnsafeCheckpointError, load_checkpoint_file
from grpo_lightning.cli.app import main
from grpo_lightning.cli.run_folders import last_checkpoint_of_run
from grpo_lightning.cli.generate import generate_completions
from grpo_lightning.checkpoints.export import main as export_main
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()


def fit_args(model_dir: str, root: Path, *extra: str, steps: int = 2) -> list[str]:
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
        "--model.evaluation.max_new_tokens",
        "4",
        "--data.batch_size",
        "2",
        "--data.num_train",
        "8",
        "--data.num_val",
        "4",
        "--data.val_batch_size",
        "4",
        "--trainer.max_steps",
        str(steps),
        "--trainer.enable_progress_bar",
        "false",
        "--validate_before_fit",
        "false",
        "--trainer.default_root_dir",
        str(root),
        "--trainer.logger.init_args.save_dir",
        str(root),
        *extra,
    ]


@pytest.fixture(scope="module")
def fitted(tiny_model_dir, tmp_path_factory, one_torch_thread) -> Path:
    """``last.ckpt`` of a real 2-step CLI fit."""
    root = tmp_path_factory.mktemp("runs")
    main(fit_args(tiny_model_dir, root))
    return root / "grpo" / "version_0" / "checkpoints" / "last.ckpt"


class Planted:
    """Unpickled (``weights_only=False``), it creates the file ``path``: a stand-in for any code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def crafted_checkpoint(fitted: Path, folder: Path) -> tuple[Path, Path]:
    """A copy of a real checkpoint with a :class:`Planted` object in it, and the file it would create."""
    planted = folder / "planted"
    checkpoint = torch.load(fitted, weights_only=True)
    checkpoint["hyper_parameters"]["note"] = Planted(planted)
    path = folder / "crafted.ckpt"
    torch.save(checkpoint, path)
    return path, planted


def prompts_file(folder: Path) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text('{"prompt": "1+2="}\n')
    return path


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if "error: " in line]
    return line


def test_a_real_checkpoint_loads_with_weights_only_and_exports(fitted, tmp_path, capsys):
    assert load_checkpoint_file(fitted)["global_step"] == 2  # no global needs allow-listing
    main(["export", "--ckpt_path", str(fitted), "--output_dir", str(tmp_path / "hf")])
    assert f"wrote {tmp_path / 'hf'}" in capsys.readouterr().out
    assert (tmp_path / "hf" / "config.json").exists()


def test_a_crafted_pickle_runs_no_code_in_export_generate_or_validate(fitted, tiny_model_dir, tmp_path, capsys):
    path, planted = crafted_checkpoint(fitted, tmp_path)

    with pytest.raises(SystemExit) as done:
        export_main(["--ckpt_path", str(path), "--output_dir", str(tmp_path / "hf")])
    assert done.value.code == 2
    line = one_error_line(capsys)
    assert re.search(rf"checkpoint {re.escape(str(path))} is not loaded: its pickle calls _?io\.open", line), line  # _io from 3.12

    from grpo_lightning.variants import GRPO

    module = GRPO(model=tiny_model_dir, sampling={"max_new_tokens": 2})
    with pytest.raises(UnsafeCheckpointError, match=r"_?io\.open"):
        generate_completions(module, str(prompts_file(tmp_path)), str(tmp_path / "out.jsonl"), ckpt_path=str(path))

    run_args = fit_args(tiny_model_dir, tmp_path)[1:]
    for subcommand, extra in (("generate", ["--prompts", str(prompts_file(tmp_path)), "--output", str(tmp_path / "o.jsonl")]),
                              ("validate", [])):  # fmt: skip
        with pytest.raises(SystemExit) as done:
            main([subcommand, *run_args, "--ckpt_path", str(path), *extra], report_errors=True)
        assert done.value.code == 2
        assert re.search(r"is not loaded: its pickle calls _?io\.open", one_error_line(capsys))
    assert not planted.exists()
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "o.jsonl").exists()


def damage_zip_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0:4] = b"XXXX"  # the first record's local header signature
    path.write_bytes(data)


def damage_data_pkl(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        (record,) = [info for info in archive.infolist() if info.filename.endswith("data.pkl")]
    data = bytearray(path.read_bytes())
    start = record.header_offset + 30 + len(record.filename.encode()) + len(record.extra)
    for i in range(start + record.file_size // 2, start + record.file_size // 2 + 16):
        data[i] ^= 0xFF
    path.write_bytes(data)


@pytest.mark.parametrize("damage", [damage_zip_header, damage_data_pkl], ids=["zip_header", "data_pkl"])
def test_a_damaged_checkpoint_is_one_error_line_for_every_reader(damage, fitted, tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "damaged.ckpt"
    bad.write_bytes(fitted.read_bytes())
    damage(bad)
    expected = f"checkpoint {bad} is truncated or corrupt"

    with pytest.raises(SystemExit) as done:
        export_main(["--ckpt_path", str(bad), "--output_dir", str(tmp_path / "hf")])
    assert done.value.code == 2 and expected in one_error_line(capsys)

    run_args = fit_args(tiny_model_dir, tmp_path)[1:]
    generate = ["--prompts", str(prompts_file(tmp_path)), "--output", str(tmp_path / "o.jsonl")]
    for subcommand, extra in (("fit", []), ("validate", []), ("generate", generate)):
        with pytest.raises(SystemExit) as done:
            main([subcommand, *run_args, "--ckpt_path", str(bad), *extra], report_errors=True)
        assert done.value.code == 2
        assert one_error_line(capsys).startswith(f"error: {expected}")


def test_ckpt_path_last_resumes_the_newest_run_of_the_name(fitted, tiny_model_dir, capsys):
    root = fitted.parents[3]
    main(fit_args(tiny_model_dir, root, "--ckpt_path", "last", steps=3))
    captured = capsys.readouterr()
    assert f"--ckpt_path last: {fitted} (optimizer step 2)" in captured.err
    assert "fit finished: 3 / 3 optimizer steps" in captured.out
    assert sorted(p.name for p in (root / "grpo").iterdir()) == ["version_0"]  # resumed into its own version
    assert load_checkpoint_file(fitted)["global_step"] == 3


def test_ckpt_path_last_names_the_step_and_the_runs_it_was_chosen_over(fitted, tmp_path):
    """The newest written last.ckpt of the name is taken; the line printed names its step and every
    other run's last checkpoint, so a short fit written after a long one does not pass unseen."""
    step = load_checkpoint_file(fitted)["global_step"]
    copies = [tmp_path / "grpo" / f"version_{v}" / "checkpoints" / "last.ckpt" for v in (0, 1)]
    for age, copy in zip((0, 100), copies):
        copy.parent.mkdir(parents=True)
        shutil.copyfile(fitted, copy)
        os.utime(copy, (copy.stat().st_atime - age, copy.stat().st_mtime - age))
    trainer = {"default_root_dir": str(tmp_path), "logger": {"init_args": {"save_dir": str(tmp_path)}}}
    found, line = last_checkpoint_of_run(trainer, "grpo")
    assert found == copies[0]
    assert line == (f"--ckpt_path last: {copies[0]} (optimizer step {step}), the newest written of 2 last checkpoints; "
                    f"the others: {copies[1]} (step {step})")  # fmt: skip
    copies[1].unlink()
    assert last_checkpoint_of_run(trainer, "grpo") == (copies[0], f"--ckpt_path last: {copies[0]} (optimizer step {step})")


def test_ckpt_path_last_without_a_run_of_the_name_is_an_error(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(fit_args(tiny_model_dir, tmp_path, "--ckpt_path", "last"), report_errors=True)
    assert done.value.code == 2
    line = one_error_line(capsys)
    assert line.startswith("error: --ckpt_path last: no last.ckpt of a run named 'grpo'") and str(tmp_path) in line
    assert not (tmp_path / "grpo").exists()  # nothing was trained
