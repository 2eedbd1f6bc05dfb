"""The report reads each arm's class from its cells' resolved configs and refuses a mislabelled arm."""

from __future__ import annotations

import pytest
import yaml

from grpo_lightning.report import build_report
from grpo_lightning.report.cli import main
from grpo_lightning.report.labels import MislabelledArmError


def relabel(directory, class_path: str) -> None:
    """What a base config that sets model.class_path left: the cell ran another class than its name's."""
    config = yaml.safe_load((directory / "config.yaml").read_text())
    config["model"]["class_path"] = class_path
    (directory / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture
def mislabelled(tmp_path, cell_writer):
    for variant in ("grpo", "dapo"):
        for seed in (0, 1):
            cell_writer(tmp_path, variant, seed, 0.3)
    relabel(tmp_path / "dapo-seed1", "grpo_lightning.variants.GRPO")
    return tmp_path


def test_a_mislabelled_arm_is_refused(mislabelled):
    message = (r"dapo-seed1: the cell of arm 'dapo' ran grpo_lightning.variants.GRPO \(its config.yaml\), "
               r"not grpo_lightning.variants.DAPO as its variant 'dapo' says")
    with pytest.raises(MislabelledArmError, match=message):
        build_report(mislabelled, mislabelled / "report")
    assert not (mislabelled / "report").exists()


def test_the_report_cli_says_so_in_one_line(mislabelled, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(mislabelled)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and "ran grpo_lightning.variants.GRPO" in error


def test_the_full_path_of_the_same_class_is_no_mislabel(tmp_path, cell_writer):
    cell_writer(tmp_path, "dapo", 0, 0.3)
    cell_writer(tmp_path, "grpo", 0, 0.3)
    relabel(tmp_path / "dapo-seed0", "grpo_lightning.variants.dapo.DAPO")  # how a config may name it
    build_report(tmp_path, tmp_path / "report")
    assert (tmp_path / "report" / "report.md").exists()


def test_a_class_path_recorded_before_the_presets_moved_names_the_preset_it_named_then(tmp_path, cell_writer):
    """Runs before 0.1.0 saved ``variants.DAPO`` (a top-level package then): the committed reports' data
    keep it, and rebuild; it is read as the preset it named, and a mislabel is still one."""
    cell_writer(tmp_path, "dapo", 0, 0.3)
    cell_writer(tmp_path, "grpo", 0, 0.3)
    relabel(tmp_path / "dapo-seed0", "variants.DAPO")
    relabel(tmp_path / "grpo-seed0", "variants.grpo.GRPO")
    build_report(tmp_path, tmp_path / "report")
    assert "| `model.class_path` | variants.grpo.GRPO | variants.DAPO |" in (tmp_path / "report" / "report.md").read_text()
    relabel(tmp_path / "dapo-seed0", "variants.GRPO")
    with pytest.raises(MislabelledArmError, match=r"ran variants.GRPO \(its config.yaml\), not grpo_lightning.variants.DAPO"):
        build_report(tmp_path, tmp_path / "report2")
