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
