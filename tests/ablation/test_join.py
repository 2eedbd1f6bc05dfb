"""Joining the runs of one sweep: cells of the committed SmolLM2 report's data, split as two runs would
have left them, then joined again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpo_lightning.ablation.join import join, main
from grpo_lightning.errors import ConfigError

DATA = Path(__file__).resolve().parents[2] / "reports" / "smollm2_variants" / "data"


def run_of(folder: Path, cells: list[str], commit: str, line: str) -> Path:
    """A sweep folder holding ``cells`` (copies of the report's), one provenance record and a sweep.json."""
    for name in cells:
        shutil.copytree(DATA / name, folder / name)
    (folder / "provenance.json").write_text(json.dumps([{"commit": commit, "cells": {c: "done" for c in cells}}]))
    (folder / "sweep.json").write_text(json.dumps({"name": "smollm2_variants", "equivalence_margin": 0.02,
                                                   "provenance": [line]}))  # fmt: skip
    return folder


def test_two_runs_join_into_one_sweep_with_both_provenances(tmp_path, capsys):
    first = run_of(tmp_path / "day1", ["grpo-seed0", "dr_grpo-seed0"], "aaa", "day 1")
    second = run_of(tmp_path / "day2", ["grpo-seed1", "dr_grpo-seed1"], "bbb", "day 2")
    main([str(first), str(second), "--out", str(tmp_path / "joined")])
    joined = tmp_path / "joined"
    assert sorted(d.name for d in joined.iterdir() if d.is_dir()) == ["dr_grpo-seed0", "dr_grpo-seed1", "grpo-seed0", "grpo-seed1"]
    assert (joined / "grpo-seed1" / "outcomes").is_dir()  # the per-prompt outcomes travel with the cell
    assert [r["commit"] for r in json.loads((joined / "provenance.json").read_text())] == ["aaa", "bbb"]
    assert json.loads((joined / "sweep.json").read_text())["provenance"] == ["day 1", "day 2"]
    assert "4 cells in" in capsys.readouterr().out


def test_the_same_cell_twice_is_refused(tmp_path):
    first = run_of(tmp_path / "day1", ["grpo-seed0"], "aaa", "day 1")
    second = run_of(tmp_path / "day2", ["grpo-seed0"], "bbb", "day 2")
    with pytest.raises(ConfigError, match="grpo-seed0 .* also in .*day1: the same arm and seed twice"):
        join([first, second], tmp_path / "joined")
    assert not (tmp_path / "joined").exists()  # nothing copied before the check


@pytest.mark.parametrize("unfinished_first", [True, False])
def test_an_unfinished_cell_gives_way_to_its_finished_run_and_the_sweep_says_so(tmp_path, unfinished_first):
    """A run stopped at its deadline left a cell unfinished, and a later run finished it: the joined sweep holds
    the finished run, in either order of the sources, and a line of its sweep.json names the one left out."""
    stopped = run_of(tmp_path / "stopped", ["grpo-seed0", "dr_grpo-seed0"], "aaa", "stopped")
    (stopped / "dr_grpo-seed0" / "DONE").unlink()
    finished = run_of(tmp_path / "finished", ["dr_grpo-seed0"], "bbb", "finished")
    sources = [stopped, finished] if unfinished_first else [finished, stopped]
    found = join(sources, tmp_path / "joined")
    assert found == {"grpo-seed0": stopped, "dr_grpo-seed0": finished}
    assert (tmp_path / "joined" / "dr_grpo-seed0" / "DONE").is_file()
    lines = json.loads((tmp_path / "joined" / "sweep.json").read_text())["provenance"]
    assert lines[-1] == f"join: dr_grpo-seed0 of {stopped}, unfinished there, left out for its finished run in {finished}"


def test_a_sweep_of_one_arms_extra_seeds_joins_with_the_baseline_given(tmp_path):
    """A sweep of dppo's seeds alone records dppo as its baseline: the join refuses to guess the report's, takes it
    from --baseline into sweep.json, and refuses a baseline that is no arm."""
    grid = run_of(tmp_path / "grid", ["grpo-seed0", "dppo-seed0"], "aaa", "grid")
    extra = run_of(tmp_path / "extra", ["dppo-seed1"], "bbb", "dppo's seed 1")
    cell_json = extra / "dppo-seed1" / "cell.json"
    cell_json.write_text(json.dumps({**json.loads(cell_json.read_text()), "baseline": "dppo"}))
    with pytest.raises(ConfigError, match=r"record different baselines \(dppo, grpo.*--baseline NAME"):
        join([grid, extra], tmp_path / "refused")
    with pytest.raises(ConfigError, match=r"--baseline 'rloo' is not an arm .*\['dppo', 'grpo'\]"):
        join([grid, extra], tmp_path / "refused", baseline="rloo")
    assert not (tmp_path / "refused").exists()
    main([str(grid), str(extra), "--out", str(tmp_path / "joined"), "--baseline", "grpo"])
    assert json.loads((tmp_path / "joined" / "sweep.json").read_text())["baseline"] == "grpo"


def test_finished_cells_without_their_step_wise_scalars_are_refused_by_the_join_and_the_report(tmp_path, capsys):
    """A tarball that left out the event files: the report would count fewer seeds in its curves."""
    first = run_of(tmp_path / "day1", ["grpo-seed0", "dr_grpo-seed0"], "aaa", "day 1")
    second = run_of(tmp_path / "day2", ["grpo-seed1", "dr_grpo-seed1"], "bbb", "day 2")
    (second / "dr_grpo-seed1" / "scalars.csv.gz").unlink()
    with pytest.raises(SystemExit) as stopped:
        main([str(first), str(second), "--out", str(tmp_path / "joined")])
    assert stopped.value.code == 2 and not (tmp_path / "joined").exists()  # nothing copied before the check
    assert "1 finished cell(s) hold no step-wise scalars" in capsys.readouterr().err
    (second / "dr_grpo-seed1" / "DONE").unlink()  # unfinished: the report counts it as such, the join takes it
    join([first, second], tmp_path / "joined")
    (first / "grpo-seed0" / "scalars.csv.gz").unlink()
    from grpo_lightning.report.build import build_report

    with pytest.raises(ConfigError, match="report: 1 finished cell\\(s\\) hold no step-wise scalars .*: grpo-seed0;"):
        build_report(first, tmp_path / "report")


def test_cells_of_another_design_are_refused_and_config_paths_compare_by_their_configs_folder(tmp_path):
    first = run_of(tmp_path / "day1", ["grpo-seed0"], "aaa", "day 1")
    second = run_of(tmp_path / "day2", ["grpo-seed1"], "bbb", "day 2")
    cell_file = second / "grpo-seed1" / "cell.json"
    cell = json.loads(cell_file.read_text())
    cell["settings"]["base_configs"] = [f"/elsewhere/checkout/{p}" for p in cell["settings"]["base_configs"]]
    cell_file.write_text(json.dumps(cell))
    join([first, second], tmp_path / "same")  # another checkout's paths to the same configs
    cell["settings"]["args"]["model.init_args.optim.minibatch_size"] = 128
    cell_file.write_text(json.dumps(cell))
    with pytest.raises(ConfigError, match="grpo-seed1 .* other settings \\(args"):
        join([first, second], tmp_path / "other")


def test_cells_whose_config_files_differ_in_content_are_refused_and_older_records_compare_by_path(tmp_path):
    first = run_of(tmp_path / "day1", ["grpo-seed0", "dr_grpo-seed0"], "aaa", "day 1")
    second = run_of(tmp_path / "day2", ["grpo-seed1"], "bbb", "day 2")
    assert "base_configs_sha256" not in json.loads((first / "grpo-seed0" / "cell.json").read_text())["settings"]
    cell_file = second / "grpo-seed1" / "cell.json"
    cell = json.loads(cell_file.read_text())
    base = len(cell["settings"]["base_configs"])
    cell["settings"].update(base_configs_sha256=["a" * 16] * base, variant_config_sha256="b" * 16)
    cell_file.write_text(json.dumps(cell))
    join([first, second], tmp_path / "older")  # the report's cells predate the digests: their paths agree
    third = run_of(tmp_path / "day3", ["grpo-seed2"], "ccc", "day 3")
    third_file = third / "grpo-seed2" / "cell.json"
    for key, value in (("base_configs_sha256", ["c" * 16] * base), ("variant_config_sha256", "d" * 16)):
        other = json.loads(third_file.read_text())
        other["settings"].update({**cell["settings"], key: value})
        third_file.write_text(json.dumps(other))
        match = "other settings \\(base_configs_sha256" if key.startswith("base") else "ran its arm with other settings"
        with pytest.raises(ConfigError, match=match):
            join([second, third], tmp_path / f"edited_{key}")


def test_report_settings_that_disagree_are_refused(tmp_path):
    first = run_of(tmp_path / "day1", ["grpo-seed0"], "aaa", "day 1")
    second = run_of(tmp_path / "day2", ["grpo-seed1"], "bbb", "day 2")
    (second / "sweep.json").write_text(json.dumps({"name": "smollm2_variants", "equivalence_margin": 0.05}))
    with pytest.raises(ConfigError, match="equivalence_margin"):
        join([first, second], tmp_path / "joined")
    assert not (tmp_path / "joined").exists()


def test_sweeps_of_other_folders_join_and_the_joined_sweep_names_both(tmp_path):
    first = run_of(tmp_path / "day1", ["grpo-seed0"], "aaa", "day 1")
    second = run_of(tmp_path / "day2", ["grpo-seed1"], "bbb", "day 2")
    for folder in (first, second):
        (folder / "sweep.json").write_text(json.dumps({"name": folder.name, "sweep_folder": folder.name,
                                                       "equivalence_margin": 0.02}))  # fmt: skip
    join([first, second], tmp_path / "joined")
    record = json.loads((tmp_path / "joined" / "sweep.json").read_text())
    assert (record["name"], record["sweep_folder"], record["equivalence_margin"]) == ("day1 + day2", "day1 + day2", 0.02)
    main([str(first), str(second), "--out", str(tmp_path / "named"), "--name", "both days", "--provenance", "one card"])
    record = json.loads((tmp_path / "named" / "sweep.json").read_text())
    assert (record["name"], record["sweep_folder"], record["provenance"]) == ("both days", "day1 + day2", ["one card"])


def test_two_arms_of_one_variant_that_differ_by_an_override_join(tmp_path):
    first = run_of(tmp_path / "day1", ["grpo-seed0"], "aaa", "day 1")
    second = run_of(tmp_path / "day2", ["grpo-seed1"], "bbb", "day 2")
    other_arm = second / "grpo+cosine_kl-seed1"
    (second / "grpo-seed1").rename(other_arm)
    cell = json.loads((other_arm / "cell.json").read_text())
    cell["arm"], cell["settings"]["overrides"] = "grpo+cosine_kl", {"config": "schedules/cosine_kl.yaml"}
    (other_arm / "cell.json").write_text(json.dumps(cell))
    assert sorted(join([first, second], tmp_path / "joined")) == ["grpo+cosine_kl-seed1", "grpo-seed0"]
