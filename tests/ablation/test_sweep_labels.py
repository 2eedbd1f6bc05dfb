"""Sweeps run what they say: a shared file may not set an arm's class, each cell's resolved config
matches its name before it runs, and errors reach the user in one line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from grpo_lightning.ablation import labels
from grpo_lightning.ablation import sweep as ablate
from grpo_lightning.ablation.run import SPEC_DIR, main
from grpo_lightning.ablation.spec import SweepError, SweepSpec
from grpo_lightning.ablation.sweep import cell_command, run_sweep

BASE = ["configs/trainer/cpu.yaml", "configs/data/arithmetic.yaml", "configs/model/tiny.yaml"]
BRING_YOUR_OWN = "docs/bring_your_own/config.yaml"  # sets model.class_path: grpo_lightning.variants.GRPO


def spec_dict(tmp_path, **changes):
    spec = {"output_dir": str(tmp_path / "sweep"), "base_configs": BASE, "variants": ["dapo", "dr_grpo"], "seeds": [0],
            "model": "/m"}  # fmt: skip
    spec.update(changes)
    return spec


def never_launched(*args, **kwargs):
    raise AssertionError("a cell ran")


def test_a_base_config_that_sets_the_class_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate, "launch", never_launched)
    base = ["configs/trainer/cpu.yaml", "configs/data/arithmetic.yaml", BRING_YOUR_OWN]
    with pytest.raises(SweepError) as error:
        run_sweep(spec_dict(tmp_path, base_configs=base))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"base_configs: {Path(BRING_YOUR_OWN).absolute()} sets model.class_path (grpo_lightning.variants.GRPO)")
    assert message.endswith("remove model.class_path from it (the variants axis gives each cell its class).")
    assert not (tmp_path / "sweep").exists()


def test_a_variant_files_settings_and_the_data_seed_are_refused_in_shared_files(tmp_path):
    shared = tmp_path / "shared.yaml"
    shared.write_text("model:\n  init_args:\n    dpo_weight: 0.5\n")  # configs/variant/online_dpo_grpo.yaml sets it
    spec = SweepSpec.from_dict(spec_dict(tmp_path, variants=["grpo", "online_dpo_grpo"], base_configs=[*BASE, str(shared)]))
    with pytest.raises(SweepError, match=r"sets model.dpo_weight \(0.5\), which the variants axis sets"):
        labels.check_shared_files(spec)
    shared.write_text("data:\n  init_args:\n    seed: 3\n")
    with pytest.raises(SweepError, match=r"sets data.seed \(3\), which the seeds axis sets.*each cell's seed"):
        labels.check_shared_files(SweepSpec.from_dict(spec_dict(tmp_path, base_configs=[*BASE, str(shared)])))
    with pytest.raises(SweepError, match="args: model.class_path"):
        labels.check_shared_files(SweepSpec.from_dict(spec_dict(tmp_path, args={"model.class_path": "grpo_lightning.variants.GRPO"})))
    # args are refused what shared files are: every seedN cell would share one data order
    with pytest.raises(SweepError, match=r"args: data.init_args.seed \(3\) would set what the seeds axis sets"):
        labels.check_shared_files(SweepSpec.from_dict(spec_dict(tmp_path, args={"data.init_args.seed": 3})))


def test_an_override_axis_wins_over_a_shared_file_and_says_so(tmp_path):
    spec = SweepSpec.from_dict(spec_dict(tmp_path, overrides={"trainer.max_steps": [3, 5]}))
    notes = labels.check_shared_files(spec)
    cpu = Path("configs/trainer/cpu.yaml").absolute()
    assert f"overrides.trainer.max_steps replaces trainer.max_steps (100) of {cpu} in every cell" in notes
    assert f"seeds replaces seed_everything (0) of {cpu} in every cell" in notes
    cells = spec.cells()
    labels.check_cells(spec, cells, [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells])  # they match


def test_a_cell_whose_resolved_class_or_seed_differs_from_its_name_is_refused(tmp_path):
    # --model grpo_lightning.variants.GRPO after the variant's file: every cell would be GRPO
    spec = SweepSpec.from_dict(spec_dict(tmp_path, args={"model": "grpo_lightning.variants.GRPO"}))
    cells = spec.cells()
    commands = [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells]
    with pytest.raises(SweepError, match=r"cell dapo-seed0: its resolved model.class_path is grpo_lightning.variants.GRPO, not grpo_lightning.variants.DAPO"):
        labels.check_cells(spec, cells, commands)
    spec = SweepSpec.from_dict(spec_dict(tmp_path, args={"seed_everything": 7}))
    cells = spec.cells()
    with pytest.raises(SweepError, match="cell dapo-seed0: its resolved seed_everything is 7, not 0"):
        labels.check_cells(spec, cells, [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells])


def test_a_cell_without_a_model_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate, "launch", never_launched)
    with pytest.raises(SweepError, match=r"^cell dapo-seed0: its fit command does not parse: model.model is required; "
                                         r"give it in the sweep's model:[^\n]*$"):  # fmt: skip
        run_sweep(spec_dict(tmp_path, model=None))


def test_every_shipped_sweep_passes_the_shared_file_check():
    from hydra import compose, initialize_config_dir

    for path in sorted(SPEC_DIR.glob("*.yaml")):
        with initialize_config_dir(config_dir=str(SPEC_DIR), version_base="1.3"):
            labels.check_shared_files(SweepSpec.from_dict(compose(config_name=path.stem)))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["no_such_key=1"], "error: Could not override 'no_such_key'. To append to your config use +no_such_key=1 (Key 'no_such_key' is not in struct)"),
        (["output_dir=null"], "error: output_dir: give the directory that will hold one folder per cell."),
    ],
)
def test_sweep_errors_arrive_as_one_line(argv, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.chdir(tmp_path)  # Hydra's output folder of a run that fails
    monkeypatch.setattr(sys, "argv", ["grpo-lightning-ablate", *argv])
    handlers = logging.root.handlers[:]
    try:
        with pytest.raises(SystemExit) as exit_info:
            main()
    finally:  # main() logs to this test's captured stderr, closed after it
        logging.root.handlers[:] = handlers
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == expected


def test_cells_run_by_another_interpreter_are_not_checked_here_and_say_so(tmp_path):
    spec = SweepSpec.from_dict(spec_dict(tmp_path, python=str(tmp_path / "other" / "python"), args={"model": "grpo_lightning.variants.GRPO"}))
    cells = spec.cells()
    with pytest.warns(UserWarning, match="resolved configs are not checked"):
        labels.check_cells(spec, cells, [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells])
    (tmp_path / "venv_python").symlink_to(sys.executable)  # another virtual environment's python: a link to this one
    spec = SweepSpec.from_dict(spec_dict(tmp_path, python=str(tmp_path / "venv_python"), args={"model": "grpo_lightning.variants.GRPO"}))
    with pytest.warns(UserWarning, match="resolved configs are not checked"):
        labels.check_cells(spec, cells, [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells])


def test_the_check_parses_each_cell_as_its_own_command_line(tmp_path, monkeypatch):
    """Not with the sweep's own arguments beside it, which Lightning would warn of in every sweep."""
    import warnings

    monkeypatch.setattr(sys, "argv", ["grpo-lightning-ablate", "--config-name", "smoke"])
    spec = SweepSpec.from_dict(spec_dict(tmp_path))
    cells = spec.cells()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        labels.check_cells(spec, cells, [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells])
    assert not [w for w in caught if "sys.argv" in str(w.message)]
    assert sys.argv == ["grpo-lightning-ablate", "--config-name", "smoke"]


def test_the_sweep_says_its_notes_once_and_a_launcher_job_does_not_repeat_them(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(labels, "check_cells", lambda spec, cells, commands: [])  # parsing: tested above
    spec = SweepSpec.from_dict(spec_dict(tmp_path))
    note = "seeds replaces seed_everything (0)"
    with caplog.at_level(logging.INFO, logger="grpo_lightning.ablation.sweep"):
        ablate.check_sweep(spec, spec.cells())
        assert note in caplog.text
        caplog.clear()
        ablate.check_sweep(spec, spec.cells()[:1], announce=False)  # what each launcher job runs
        assert note not in caplog.text


def test_a_shared_setting_may_not_change_what_makes_an_arm_its_variant(tmp_path, monkeypatch):
    """DAPO's clip-higher (loss.clip_eps_high 0.28) is a default of its class, not a setting of its file:
    a shared 0.2 would leave the arm called dapo and running GRPO's clip."""
    monkeypatch.setattr(ablate, "launch", never_launched)
    shared = tmp_path / "shared.yaml"
    shared.write_text("model:\n  init_args:\n    loss:\n      clip_eps_high: 0.2\n")
    with pytest.raises(SweepError) as error:
        run_sweep(spec_dict(tmp_path, variants=["grpo", "dapo"], base_configs=[*BASE, str(shared)]))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"arm dapo: base_configs: {shared} sets model.loss.clip_eps_high to 0.2, "
                              "and the variant 'dapo' has 0.28 there")  # fmt: skip
    assert "overrides: {model.loss.clip_eps_high: [0.2]}" in message
    assert not (tmp_path / "sweep").exists()
    # args too, and a part a variant names by class attribute (Dr. GRPO's aggregation)
    spec = SweepSpec.from_dict(spec_dict(tmp_path, args={"model.init_args.aggregation": "token_mean"}))
    cells = spec.cells()
    with pytest.raises(SweepError, match=r"^arm dr_grpo: args: model.init_args.aggregation sets model.aggregation to "
                                         r"token_mean, and the variant 'dr_grpo' has seq_mean_token_sum_norm there"):  # fmt: skip
        labels.check_cells(spec, cells, [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells])


def test_a_variants_setting_given_by_an_axis_or_a_shared_setting_no_variant_defines_is_allowed(tmp_path):
    # through an axis the arm's name says it: dapo-clip_eps_high0.2
    spec = SweepSpec.from_dict(spec_dict(tmp_path, variants=["grpo", "dapo"], overrides={"model.loss.clip_eps_high": [0.2]}))
    cells = spec.cells()
    configs = labels.check_cells(spec, cells, [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells])
    assert [c.name for c in cells] == ["grpo-seed0-clip_eps_high0.2", "dapo-seed0-clip_eps_high0.2"]
    assert labels.lookup(configs[1], "model.loss.clip_eps_high") == (True, 0.2)
    # the learning rate is no variant's own, and a shared value equal to every arm's own changes none
    spec = SweepSpec.from_dict(spec_dict(tmp_path, args={"model.init_args.optim.learning_rate": 1e-3, "model.kl.beta": 0.0}))
    cells = spec.cells()
    labels.check_cells(spec, cells, [cell_command(spec, c, tmp_path / c.name, "/m") for c in cells])
