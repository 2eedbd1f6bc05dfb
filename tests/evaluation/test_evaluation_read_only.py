"""``validate``, ``test`` and ``generate`` on a run, as docs/evaluation.md shows them (``--config
run/config.yaml --ckpt_path run/checkpoints/last.ckpt``), change no file of that run: their logs and
``config.yaml`` go to a new folder beside it, which they print, and completions to ``--output``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from grpo_lightning.cli.app import main
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()


def file_hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, by relative path."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory, one_torch_thread) -> Path:
    """A 2-step CLI fit's run folder, ``<root>/grpo/version_0``."""
    root = tmp_path_factory.mktemp("runs")
    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "trainer/cpu.yaml"),
            "--config",
            str(CONFIGS / "data/arithmetic.yaml"),
            "--config",
            str(CONFIGS / "variant/grpo.yaml"),
            "--model.model",
            tiny_model_dir,
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
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(root),
            "--trainer.logger.init_args.save_dir",
            str(root),
        ]
    )
    return root / "grpo" / "version_0"


def test_validate_test_and_generate_change_no_file_of_the_run_they_read(run, tmp_path, capsys):
    before = file_hashes(run)
    assert {"config.yaml", "checkpoints/last.ckpt"} <= set(before) and any("tfevents" in name for name in before)
    capsys.readouterr()
    given = ["--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]

    main(["validate", *given, "--model.evaluation.samples", "2", "--model.evaluation.temperature", "1.0"])
    main(["test", *given, "--data.test_split", "validation"])
    # A resumed run's config.yaml names its own version: evaluation still writes elsewhere.
    main(["validate", *given, "--trainer.logger.init_args.version", "0"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1+2="}\n{"prompt": "3+4="}\n')
    output = tmp_path / "out" / "completions.jsonl"
    main(["generate", *given, "--prompts", str(prompts), "--output", str(output)])

    assert file_hashes(run) == before
    printed = capsys.readouterr().out
    names = run.parent
    assert sorted(p.name for p in names.iterdir()) == ["test_0", "validate_0", "validate_1", "version_0"]
    for folder in ("validate_0", "test_0", "validate_1"):
        subcommand = folder.split("_")[0]
        assert f"{subcommand}: logs and config.yaml in {names / folder}" in printed
        assert (names / folder / "config.yaml").exists() and list((names / folder).glob("events.out.tfevents.*"))
    config = yaml.safe_load((names / "validate_0" / "config.yaml").read_text())
    assert config["model"]["init_args"]["evaluation"]["samples"] == 2
    assert f"wrote 2 completions to {output}" in printed and len(output.read_text().splitlines()) == 2
