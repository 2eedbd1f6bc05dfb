"""The field sweep (every variant) and the DAPO-parts sweep (one technique at a time): they parse and
expand to the right cells, and each cell's fit command builds the module it names. Nothing is run."""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir

from grpo_lightning.ablation.run import SPEC_DIR
from grpo_lightning.ablation.spec import SweepSpec
from grpo_lightning.ablation.sweep import cell_command
from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.cli.resources import config_dir


def sweep(name: str, tmp_path) -> SweepSpec:
    with initialize_config_dir(config_dir=str(SPEC_DIR), version_base="1.3"):
        return SweepSpec.from_dict(compose(name, overrides=[f"output_dir={tmp_path}"]))


#: Shipped variants the field leaves out, with the reason.
NOT_IN_THE_FIELD = {"on_policy_distillation": "it learns from a teacher model, and the field has only its start model"}


def test_the_field_runs_every_shipped_variant_at_five_seeds_with_two_steps_per_rollout(tmp_path):
    spec = sweep("field", tmp_path)
    shipped = sorted(p.stem for p in (config_dir() / "variant").glob("*.yaml") if p.stem not in NOT_IN_THE_FIELD)
    cells = spec.cells()
    assert sorted({cell.arm for cell in cells}) == shipped and len(cells) == 5 * len(shipped)
    data = yaml.safe_load((config_dir() / "data" / "arithmetic.yaml").read_text())["data"]["init_args"]
    model = yaml.safe_load((config_dir() / "model" / "tiny.yaml").read_text())["model"]["init_args"]
    assert data["batch_size"] * model["sampling"]["group_size"] == 2 * spec.args["model.init_args.optim.minibatch_size"]


#: arm -> (clip_eps_high, dynamic_sampling, aggregation, overlong_buffer) of its DAPO module (max_new_tokens 32).
DAPO_ARMS = {
    "dapo": (0.28, True, "token_mean", None),
    "dapo+grpo_end": (0.2, False, "seq_mean_token_mean", 0),
    "dapo+grpo_end+clip_higher": (0.28, False, "seq_mean_token_mean", 0),
    "dapo+grpo_end+dynamic_sampling": (0.2, True, "seq_mean_token_mean", 0),
    "dapo+grpo_end+token_mean": (0.2, False, "token_mean", 0),
    "dapo+grpo_end+overlong_shaping": (0.2, False, "seq_mean_token_mean", None),
}


@pytest.fixture(scope="module")
def dapo_parts(tmp_path_factory) -> SweepSpec:
    return sweep("dapo_parts", tmp_path_factory.mktemp("dapo_parts"))


def test_dapo_parts_has_one_arm_per_technique_at_five_seeds(dapo_parts):
    cells = dapo_parts.cells()
    assert sorted({cell.arm for cell in cells}) == sorted(DAPO_ARMS) and len(cells) == 5 * len(DAPO_ARMS)


def test_each_technique_file_sets_only_its_own_option():
    folder = SPEC_DIR / "dapo_parts"
    settings = {path.stem: yaml.safe_load(path.read_text())["model"]["init_args"] for path in folder.glob("*.yaml")}
    assert settings.pop("grpo_end") == {"loss": {"clip_eps_high": 0.2}, "dynamic_sampling": False,
                                        "aggregation": "seq_mean_token_mean", "overlong_buffer": 0}  # fmt: skip
    assert settings == {
        "clip_higher": {"loss": {"clip_eps_high": 0.28}},
        "dynamic_sampling": {"dynamic_sampling": True},
        "token_mean": {"aggregation": "token_mean"},
        "overlong_shaping": {"overlong_buffer": None},
    }


@pytest.mark.parametrize("arm", ["dapo", "dapo+grpo_end", "dapo+grpo_end+overlong_shaping"])
def test_a_dapo_parts_cell_builds_dapo_with_only_its_technique(arm, dapo_parts, tmp_path):
    cell = next(cell for cell in dapo_parts.cells() if cell.arm == arm)
    command = cell_command(dapo_parts, cell, tmp_path / cell.name, model="some/model")
    module = GRPOLightningCLI(args=command[command.index("fit") + 1 :], run=False).model
    clip_eps_high, dynamic_sampling, aggregation, overlong_buffer = DAPO_ARMS[arm]
    assert type(module).__name__ == "DAPO" and module.coefficients.beta == 0.0
    assert (module.settings.clip_eps_high, module.dynamic_sampling, module.settings.aggregation) == (clip_eps_high, dynamic_sampling,
                                                                                        aggregation)  # fmt: skip
    assert module.overlong_buffer == (module.max_new_tokens // 5 if overlong_buffer is None else overlong_buffer)


def test_a_sweep_whose_axis_values_are_lists_skips_its_finished_cells(tmp_path):
    """The DAPO-parts cells carry lists of files (the config axis): a sweep keys its results by cell."""
    from grpo_lightning.ablation.sweep import run_sweep

    spec = sweep("dapo_parts", tmp_path)
    for cell in spec.cells():
        (tmp_path / cell.name).mkdir()
        (tmp_path / cell.name / "DONE").write_text("")
    results = run_sweep(spec)
    assert [r.status for r in results] == ["skipped"] * 30 and len({r.cell for r in results}) == 30
