"""benchmarks/same_seed_reruns.py on real cells of the committed smollm2_variants data: the second run of
each cell is the first run of another seed, so every number is known by hand."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "reports" / "smollm2_variants" / "data"
_spec = importlib.util.spec_from_file_location("same_seed_reruns", ROOT / "benchmarks" / "same_seed_reruns.py")
reruns = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reruns)


def test_swapped_seeds_give_the_hand_computed_spreads(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    for name in ("grpo-seed0", "grpo-seed1"):
        shutil.copytree(DATA / name, first / name)
    # "grpo-seed0" of the second run ended as seed 1 did (0.694), and the other way round (0.686)
    shutil.copytree(DATA / "grpo-seed1", second / "grpo-seed0")
    shutil.copytree(DATA / "grpo-seed0", second / "grpo-seed1")
    reruns.main([str(first), str(second)])
    text = capsys.readouterr().out
    assert "| grpo-seed0 | 0.686 | 0.694 | +0.008 |" in text and "| grpo-seed1 | 0.694 | 0.686 | -0.008 |" in text
    # differences +-0.008: mean 0, sd 0.008 * sqrt(2) = 0.0113, a rerun's own 0.008; the two seeds' sd 0.0057
    assert "2 cells. Mean difference +0.0000" in text
    assert "differences 0.0113, so a rerun's own spread is 0.0080, against 0.0057 between the seeds" in text


def test_fewer_than_two_shared_cells_are_refused(tmp_path):
    for folder in ("first", "second"):
        shutil.copytree(DATA / "grpo-seed0", tmp_path / folder / "grpo-seed0")
    with pytest.raises(SystemExit, match="1 cell"):
        reruns.main([str(tmp_path / "first"), str(tmp_path / "second")])
