"""The registry of presets (``grpo_lightning.variants.PRESETS``) is the one list: each preset's file,
shipped config, short name on the command line and in a sweep, place in a report and rows in the
READMEs agree with it. A preset added to the folder but not registered is the conformance suite's
(tests/conformance/test_conformance_variants.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_lightning import variants
from grpo_lightning.ablation.labels import same_class, variant_class
from grpo_lightning.cli.app import variant_log_name
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.cli.variants import resolve_variant_args, shipped_variants
from grpo_lightning.report.build import VARIANT_ORDER

REPO = Path(__file__).resolve().parents[2]
PRESETS = variants.PRESETS


def table_names(page: Path, heading: str) -> list[str]:
    """The names in backticks in the first column of the first table under ``heading`` of ``page``."""
    section = re.split(rf"^{re.escape(heading)}$", page.read_text(), maxsplit=1, flags=re.MULTILINE)[1]
    rows = re.search(r"^\|.*?(?=\n\n|\Z)", section, re.MULTILINE | re.DOTALL).group(0).splitlines()[2:]
    return [name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])]


def test_each_preset_is_its_files_module_and_ships_its_config_and_no_other_config_ships():
    for name, class_name in PRESETS.items():
        assert (Path(variants.__file__).parent / f"{name}.py").is_file(), name
        assert variant_log_name(class_name) == name  # a run is filed under the short name
        config = yaml.safe_load((config_dir() / "variant" / f"{name}.yaml").read_text())
        assert config["model"]["class_path"] == variants.class_path(name) == f"grpo_lightning.variants.{class_name}"
        assert getattr(variants, class_name).__module__ == f"grpo_lightning.variants.{name}"
    assert sorted(path.stem for path in (config_dir() / "variant").glob("*.yaml")) == sorted(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_a_short_name_is_its_presets_class_path_on_the_command_line_and_in_a_sweep(name):
    path = variants.class_path(name)
    assert shipped_variants()[name] == path
    assert resolve_variant_args(["fit", "--model", name, "--model.help", name]) == ["fit", "--model", path, "--model.help", path]
    assert resolve_variant_args([f"--model={name}"]) == [f"--model={path}"]
    assert variant_class(name) == path  # a sweep's variants: [name]


def test_the_readme_tables_have_a_row_for_every_preset():
    presets = sorted(PRESETS.values())
    assert sorted(table_names(REPO / "README.md", "## Variants")) == presets
    assert sorted(table_names(REPO / "variants" / "README.md", "# Variants")) == presets


def test_a_report_orders_its_arms_as_the_registry():
    assert VARIANT_ORDER == list(PRESETS) == list(shipped_variants())


def test_the_registry_is_read_without_loading_a_model_library():
    code = "import sys, grpo_lightning.variants as v; v.PRESETS; import grpo_lightning.report.build; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "False"


def test_a_former_class_path_names_the_preset_it_named():
    assert variants.moved_class_path("variants.DAPO") == "grpo_lightning.variants.DAPO"
    assert variants.moved_class_path("variants.dr_grpo.DrGRPO") == "grpo_lightning.variants.dr_grpo.DrGRPO"
    assert variants.moved_class_path("variants.Nope") is None and variants.moved_class_path("variants") is None
    assert variants.moved_class_path("grpo_lightning.variants.DAPO") is None  # not a former path
    assert same_class("variants.DAPO", "grpo_lightning.variants.DAPO")  # what a report reads from old runs
    assert not same_class("variants.GRPO", "grpo_lightning.variants.DAPO")


def test_the_folder_is_no_top_level_package(monkeypatch):
    """From a checkout's root (on ``sys.path`` here) the folder would import as ``variants``, a second
    copy of every class: it refuses, naming the package."""
    monkeypatch.delitem(sys.modules, "variants", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'variants': the presets are grpo_lightning.variants"):
        import variants as _  # noqa: F401
