"""benchmarks/sweep_bundle.py: a sweep packed on one machine resumes on another (its finished
cells restored, the unfinished left to run) and packs again with every cell's scalars."""

import importlib.util
import json
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sweep_bundle", REPO / "benchmarks" / "sweep_bundle.py")
bundle = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bundle)


def test_a_packed_sweep_restores_its_finished_cells_and_packs_again_whole(tmp_path, cell_writer):
    first = tmp_path / "machine1" / "field"
    cell_writer(first, "grpo", 0, 0.3)
    cell_writer(first, "grpo", 1, 0.3, finished=False)
    (first / "provenance.json").write_text(json.dumps([{"commit": "abc"}]))
    bundle.pack(first, tmp_path / "out" / "field.tar.gz")

    second = tmp_path / "machine2" / "field"
    bundle.restore(tmp_path / "out" / "field.tar.gz", second)
    assert sorted(p.name for p in second.iterdir() if p.is_dir()) == ["grpo-seed0"]  # the unfinished cell runs again
    assert (second / "grpo-seed0" / "DONE").is_file() and json.loads((second / "provenance.json").read_text())[0]["commit"] == "abc"

    cell_writer(second, "grpo", 1, 0.4)  # the second run finishes the rest
    bundle.pack(second, tmp_path / "out2" / "field.tar.gz")
    with tarfile.open(tmp_path / "out2" / "field.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"data/sweep.json", "data/provenance.json", "data/grpo-seed0/DONE", "data/grpo-seed1/DONE",
            "data/grpo-seed0/scalars.csv.gz", "data/grpo-seed1/scalars.csv.gz"} <= names  # fmt: skip
    with tarfile.open(tmp_path / "out" / "field.tar.gz") as one, tarfile.open(tmp_path / "out2" / "field.tar.gz") as two:
        assert two.extractfile("data/grpo-seed0/scalars.csv.gz").read() == one.extractfile("data/grpo-seed0/scalars.csv.gz").read()
