"""The report's step is the optimizer step: runs that log ``counters/*`` are read on that axis,
with their generation batches beside it; older runs keep the training steps done."""

from __future__ import annotations

import pytest
from torch.utils.tensorboard import SummaryWriter

from grpo_lightning.report import load_run
from grpo_lightning.report.arms import final_value


def write_run(directory, steps_per_rollout: int = 4, batches_per_update: int = 2, rollouts: int = 3):
    """What a fit of ``rollouts`` updates of ``steps_per_rollout`` optimizer steps each logs, DAPO-like:
    ``batches_per_update`` generation batches per update; validation before training and at the end."""
    writer = SummaryWriter(log_dir=str(directory))
    wall = 1_000_000.0
    writer.add_scalar("val/accuracy", 0.1, 0, walltime=wall)
    for rollout in range(1, rollouts + 1):
        wall += 1.0
        step = rollout * steps_per_rollout  # the optimizer steps taken, this update's included
        for tag, value in {"reward": 0.1 * rollout, "perf/step_s": 1.0, "perf/generated_tokens": 100.0 * rollout,
                           "counters/rollouts": float(rollout),
                           "counters/generation_batches": float(rollout * batches_per_update)}.items():  # fmt: skip
            writer.add_scalar(tag, value, step, walltime=wall)
    writer.add_scalar("val/accuracy", 0.5, rollouts * steps_per_rollout, walltime=wall + 0.5)
    writer.close()
    return directory


def test_a_run_is_read_on_optimizer_steps(tmp_path):
    run = load_run(write_run(tmp_path))
    x, _ = run.axis("reward", "step")
    assert x.tolist() == [4, 8, 12]
    x, y = run.axis("val/accuracy", "step")
    assert x.tolist() == [0, 12] and y.tolist() == pytest.approx([0.1, 0.5])
    assert final_value(run, "steps") == 12  # optimizer steps, not the 3 rows of training metrics
    assert final_value(run, "batches") == 6  # generation batches: two per update
