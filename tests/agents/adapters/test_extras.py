"""The adapters' optional libraries: a path that needs one that is missing names the extra installing it,
and the extras named are the package's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grpo_lightning.agents import EnvironmentOptions
from grpo_lightning.agents.adapters import extras
from grpo_lightning.errors import ConfigError

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_a_path_whose_library_is_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(extras.EXTRAS, "absent_hub", "absent")  # a library that is not installed
    with pytest.raises(ConfigError, match=r"^environment.name: absent_hub.envs.Game needs the package 'absent_hub', "
                                          r"which is not installed: pip install 'grpo-lightning\[absent\]'.$"):  # fmt: skip
        EnvironmentOptions.of({"name": "absent_hub.envs.Game"})


def test_a_module_missing_inside_an_installed_library_is_no_missing_extra(monkeypatch):
    monkeypatch.setitem(extras.EXTRAS, "json", "absent")  # json is there; json.no_such_module is not
    with pytest.raises(ConfigError, match=r"^environment.name: 'json.no_such_module.Game' does not import"):
        EnvironmentOptions.of({"name": "json.no_such_module.Game"})


def test_the_extras_named_are_the_packages_own():
    section = PYPROJECT.read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    declared = set(re.findall(r"^([a-z_-]+) = \[", section, re.MULTILINE))
    assert set(extras.EXTRAS.values()) <= declared, sorted(declared)
