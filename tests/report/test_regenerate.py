"""A committed report rebuilds, byte for byte, from the data/ folder beside it by its REGENERATE
line (run from the repository root, into $OUT). PNG bytes depend on matplotlib and FreeType: they
are compared with the matplotlib that the ``test`` extra pins (the one the reports were written
with), and elsewhere every other file is."""

import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "reports" / "default"
PINNED_MATPLOTLIB = re.search(r'"matplotlib==([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)


def test_the_committed_default_report_regenerates_byte_for_byte(tmp_path):
    line = (REPORT / "REGENERATE").read_text()
    assert line.endswith("\n") and line.count("\n") == 1  # one shell line
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["sh", "-c", line], cwd=REPO, env=env, check=True, capture_output=True)
    committed = sorted(p.name for p in REPORT.iterdir() if p.is_file() and p.name != "REGENERATE")
    assert {"report.md", "report.html", "final_metrics.csv", "final_metrics.tex", "curves_val_accuracy.png"} <= set(committed)
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == committed
    compared = [name for name in committed if matplotlib.__version__ == PINNED_MATPLOTLIB or not name.endswith(".png")]
    different = [name for name in compared if (out / name).read_bytes() != (REPORT / name).read_bytes()]
    assert not different, f"rebuilt with other bytes: {different}"


def test_every_committed_report_regenerates_or_says_it_cannot():
    """A report without data/ and REGENERATE is an unverifiable number: it must say so at its top."""
    reports = sorted(p.parent for p in (REPO / "reports").glob("*/report.md"))
    assert len(reports) >= 5
    for folder in reports:
        if (folder / "REGENERATE").is_file():
            assert (folder / "data" / "sweep.json").is_file(), folder.name
            assert (folder / "REGENERATE").read_text() == f'grpo-lightning-report reports/{folder.name}/data --output "$OUT"\n'
        else:
            head = (folder / "report.md").read_text().split("## Summary")[0]
            assert "cannot be regenerated" in head, f"{folder.name}: no data/, REGENERATE or banner"
    for folder in sorted(p for p in (REPO / "reports").iterdir() if p.is_dir() and p not in reports):
        # reports of benchmarks (reports/smollm2): their own builder, from data/ beside them
        assert (folder / "data").is_dir() and (folder / "REGENERATE").is_file(), folder.name
        assert "reports/" + folder.name + "/data" in (folder / "REGENERATE").read_text(), folder.name


def test_a_cell_restored_from_a_data_folder_keeps_its_scalars_when_exported_again(tmp_path, cell_writer):
    """A finished cell copied back from a report's data/ (to resume its sweep elsewhere) has
    scalars.csv.gz and no event files; exporting the sweep again keeps those scalars."""
    import shutil

    from grpo_lightning.report.cells import discover_cells
    from grpo_lightning.report.data import export_data

    cell_writer(tmp_path / "sweep", "grpo", 0, 0.3)
    export_data(tmp_path / "sweep", discover_cells(tmp_path / "sweep"), tmp_path / "first", "s", [])
    shutil.copytree(tmp_path / "first" / "grpo-seed0", tmp_path / "resumed" / "grpo-seed0")
    export_data(tmp_path / "resumed", discover_cells(tmp_path / "resumed"), tmp_path / "second", "s", [])
    scalars = (tmp_path / "first" / "grpo-seed0" / "scalars.csv.gz").read_bytes()
    assert len(scalars) > 100 and (tmp_path / "second" / "grpo-seed0" / "scalars.csv.gz").read_bytes() == scalars


def test_a_report_can_compare_with_another_baseline_and_its_data_keeps_the_choice(tmp_path, cell_writer):
    """``--baseline ARM``: every other arm is compared with ARM, and data/sweep.json keeps the choice
    so that REGENERATE rebuilds the same report; an arm that does not exist is refused by name, and so
    are cells that record different baselines (runs of other specs) unless the report chooses one."""
    import json

    import pytest

    from grpo_lightning.report import build_report

    sweep = tmp_path / "sweep"
    for variant, accuracy in (("grpo", 0.3), ("dapo", 0.4)):
        for seed in (0, 1):
            cell = cell_writer(sweep, variant, seed, accuracy + 0.01 * seed) / "cell.json"
            cell.write_text(json.dumps({**json.loads(cell.read_text()), "baseline": variant}))  # each its own
    with pytest.raises(ValueError, match=r"different baselines \('dapo' by dapo-seed0, dapo-seed1; 'grpo' by "
                                         r"grpo-seed0, grpo-seed1\); choose one with --baseline NAME"):  # fmt: skip
        build_report(sweep, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    target = build_report(sweep, tmp_path / "report", baseline="dapo")
    text = (target / "report.md").read_text()
    assert "Baseline: **dapo** (chosen for this report)" in text
    assert '"baseline": "dapo"' in (target / "data" / "sweep.json").read_text()
    again = build_report(target / "data", tmp_path / "again")
    assert (again / "report.md").read_text() == text
    with pytest.raises(ValueError, match="baseline: no arm is named 'ppo'"):
        build_report(sweep, tmp_path / "other", baseline="ppo")


def test_cells_of_another_design_in_the_folder_are_refused_as_join_refuses_them(tmp_path, cell_writer):
    """An earlier spec's finished cells (other args) left in the sweep folder are not compared as one design."""
    import json

    import pytest

    from grpo_lightning.report import build_report

    for variant, steps in (("grpo", 100), ("dapo", 50)):
        for seed in (0, 1):
            cell = cell_writer(tmp_path / "sweep", variant, seed, 0.3) / "cell.json"
            settings = {"args": {"trainer.max_steps": steps}, "base_configs": ["configs/trainer/cpu.yaml"], "model": "m"}
            cell.write_text(json.dumps({**json.loads(cell.read_text()), "settings": settings}))
    with pytest.raises(ValueError, match=r"^report: cells grpo-seed0, grpo-seed1 ran with other settings \(args: "
                                         r"\{'trainer.max_steps': 100\}, not \{'trainer.max_steps': 50\}\); dapo-seed0 "
                                         r"and 1 other finished cells ran with the latter"):  # fmt: skip
        build_report(tmp_path / "sweep", tmp_path / "report")
    assert not (tmp_path / "report").exists()


def test_a_report_keeps_its_equivalence_margin_in_its_data(tmp_path, cell_writer):
    """``--equivalence-margin``: data/sweep.json keeps it, the Method states it, and REGENERATE (which
    gives none) rebuilds the same report; a data folder refuses another margin, naming where to set it."""
    import pytest

    from grpo_lightning.report import build_report

    sweep = tmp_path / "sweep"
    for variant, accuracy in (("grpo", 0.3), ("dapo", 0.4)):
        for seed in (0, 1, 2):
            cell_writer(sweep, variant, seed, accuracy + 0.01 * seed)
    target = build_report(sweep, tmp_path / "report", equivalence_margin=0.05)
    text = (target / "report.md").read_text()
    assert '"equivalence_margin": 0.05' in (target / "data" / "sweep.json").read_text()
    assert "Equivalence (TOST) within a margin δ: 0.05 on accuracies and shares" in text
    assert (build_report(target / "data", tmp_path / "again") / "report.md").read_text() == text
    with pytest.raises(ValueError, match="equivalence_margin: a data folder keeps the margin it was exported with"):
        build_report(target / "data", tmp_path / "other", equivalence_margin=0.1)


def test_a_report_keeps_its_target_mde_in_its_data(tmp_path, cell_writer):
    """``--target-mde``: data/sweep.json keeps it beside the margin, the Method states it, and REGENERATE rebuilds
    the same report; a data folder refuses another target, and one exported before the key uses the default."""
    import json

    import pytest

    from grpo_lightning.report import build_report
    from grpo_lightning.report.cli import main

    sweep = tmp_path / "sweep"
    for variant, accuracy in (("grpo", 0.3), ("dapo", 0.4)):
        for seed in (0, 1, 2):
            cell_writer(sweep, variant, seed, accuracy + 0.01 * seed)
    main([str(sweep), "--output", str(tmp_path / "report"), "--target-mde", "0.05"])
    data = tmp_path / "report" / "data"
    record = json.loads((data / "sweep.json").read_text())
    assert (record["target_mde"], record["equivalence_margin"]) == (0.05, 0.02)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Seeds for a target MDE δ* (0.05 on accuracies and shares, 5% of the baseline's mean elsewhere" in text
    assert (build_report(data, tmp_path / "again") / "report.md").read_text() == text
    with pytest.raises(ValueError, match="target_mde: a data folder keeps the target MDE it was exported with"):
        build_report(data, tmp_path / "other", target_mde=0.1)
    (data / "sweep.json").write_text(json.dumps({k: v for k, v in record.items() if k != "target_mde"}))
    assert "Seeds for a target MDE δ* (0.04 on accuracies" in (build_report(data, tmp_path / "older") / "report.md").read_text()
    (data / "sweep.json").write_text(json.dumps({**record, "target_mde": -0.04}))
    with pytest.raises(ValueError, match="target_mde: -0.04 in sweep.json is no positive number; set one, e.g. 0.04"):
        build_report(data, tmp_path / "refused")


def test_a_data_folder_with_a_margin_that_is_no_positive_number_is_refused_by_name(tmp_path, cell_writer):
    import json

    import pytest

    from grpo_lightning.report import build_report

    cell_writer(tmp_path / "sweep", "grpo", 0, 0.3)
    data = build_report(tmp_path / "sweep", tmp_path / "report") / "data"
    record = json.loads((data / "sweep.json").read_text())
    (data / "sweep.json").write_text(json.dumps({**record, "equivalence_margin": "two points"}))
    with pytest.raises(ValueError, match="equivalence_margin: 'two points' in sweep.json is no positive number"):
        build_report(data, tmp_path / "again")


def test_notes_in_the_data_are_said_at_the_reports_top_and_kept_on_regeneration(tmp_path, cell_writer):
    """An erratum found after the runs goes into ``data/sweep.json``'s ``notes``: the report says it above
    its Summary, as text (never markup), and a rebuild from the data keeps it."""
    import json

    from grpo_lightning.report import build_report

    sweep = tmp_path / "sweep"
    for variant, accuracy in (("grpo", 0.3), ("dapo", 0.4)):
        for seed in (0, 1):
            cell_writer(sweep, variant, seed, accuracy + 0.01 * seed)
    target = build_report(sweep, tmp_path / "report")
    assert "**Note:** These" not in (target / "report.md").read_text()
    record = json.loads((target / "data" / "sweep.json").read_text())
    record["notes"] = ["These runs ended completions at the wrong token *here*."]
    (target / "data" / "sweep.json").write_text(json.dumps(record))
    text = (build_report(target / "data", tmp_path / "again") / "report.md").read_text()
    head = text.split("## Summary")[0]
    assert "**Note:** These runs ended completions at the wrong token \\*here\\*." in head
    assert (build_report(target / "data", tmp_path / "third") / "report.md").read_text() == text
    record["notes"] = "One note given as text, not a list."  # said whole, not letter by letter
    (target / "data" / "sweep.json").write_text(json.dumps(record))
    head = (build_report(target / "data", tmp_path / "fourth") / "report.md").read_text().split("## Summary")[0]
    assert head.count("**Note:**") == 1 and "**Note:** One note given as text, not a list." in head
