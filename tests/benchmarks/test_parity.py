"""benchmarks/parity.py: what our side records of each optimizer step."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if "parity" not in sys.modules:  # the CLI's class paths name it "parity"
    _spec = importlib.util.spec_from_file_location("parity", BENCHMARKS / "parity.py")
    sys.modules["parity"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["parity"])
parity = sys.modules["parity"]


def test_the_probe_writes_a_row_per_optimizer_step_with_every_completion_sampled_since_the_last(tmp_path):
    """DAPO's dynamic sampling may sample batches that end without an update: they get no row, and
    their completions count in the next update's."""
    settings = tmp_path / "settings.json"
    settings.write_text("{}")
    probe = parity.ParityProbe(str(tmp_path / "run"), str(settings), "start", "cpu", eval_every=100, max_steps=100)
    module = SimpleNamespace(last_step_metrics={"reward": 0.5, "entropy": 1.0})

    def batch_end(global_step: int, lengths: list[int]) -> None:
        outputs = {"rollout": SimpleNamespace(lengths=torch.tensor(lengths))}
        probe.on_train_batch_end(SimpleNamespace(global_step=global_step), module, outputs, None, 0)

    batch_end(0, [1, 3])  # sampled only
    batch_end(1, [2, 1])  # the first update
    batch_end(2, [4, 4])
    rows = [json.loads(line) for line in (tmp_path / "run" / "rows.jsonl").read_text().splitlines()]
    assert [(row["step"], row["at_once_share"], row["reward"]) for row in rows] == [(1, 0.5, 0.5), (2, 0.0, 0.5)]
    assert math.isnan(parity.at_once_share([]))
