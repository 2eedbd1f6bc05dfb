"""The report's step is the optimizer step: runs that log ``counters/*`` are read on that axis,
with their generation batches beside it; older runs count their optimizer steps from their config."""

from __future__ import annotations

import math

import pytest
from torch.utils.tensorboard import SummaryWriter

from grpo_lightning.ablation.runs import load_run
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


def test_a_run_logged_on_the_batch_counter_counts_its_optimizer_steps_from_its_config(tmp_path):
    """Runs from before ``counters/*`` logged one row per rollout at the batch counter: their
    optimizer steps are the rollouts times the steps each rollout took, read from the cell's
    config (``ppo_epochs`` passes of one step per ``minibatch_size`` rows), never the rows alone."""
    from torch.utils.tensorboard import SummaryWriter

    from grpo_lightning.ablation.runs import optimizer_steps_per_rollout

    writer = SummaryWriter(log_dir=str(tmp_path))
    for batch in range(3):  # rows at the batch counter 0, 1, 2
        writer.add_scalar("reward", 0.1, batch, walltime=1_000_000.0 + batch)
    writer.close()
    run = load_run(tmp_path)
    config = {"model": {"init_args": {"sampling": {"group_size": 8}, "optim": {"minibatch_size": 32, "ppo_epochs": 1}}},
              "data": {"init_args": {"batch_size": 16}}}  # fmt: skip
    assert optimizer_steps_per_rollout(config) == 4  # 16 x 8 rows in minibatches of 32
    assert optimizer_steps_per_rollout({"model": {"init_args": {"optim": {"ppo_epochs": 2}}}}) == 2
    recorded = {"model": {"init_args": {"group_size": 8, "minibatch_size": 32, "ppo_epochs": 1}},
                "data": {"init_args": {"batch_size": 16}}}  # a run recorded before the option groups  # fmt: skip
    assert optimizer_steps_per_rollout(recorded) == 4
    run.updates_per_step = optimizer_steps_per_rollout(config)
    assert final_value(run, "steps") == 12
    assert run.axis("reward", "step")[0].tolist() == [4, 8, 12]
    # Their generation batches were not counted (DAPO's logged step was its update count): unknown.
    assert math.isnan(final_value(run, "batches"))


@pytest.mark.parametrize(
    "steps_per_rollout, rollouts, expected",
    [
        # one row per rollout of two optimizer steps, at steps 2, 4, ..., 40: the last 10 optimizer steps are 31-40,
        # the rows at 32, 34, 36, 38 and 40 (rollouts 16-20): reward 0.1 (16 + ... + 20) / 5 = 1.8, not the last ten
        # rows' 0.1 (11 + ... + 20) / 10 = 1.55, which span optimizer steps 21-40
        (2, 20, 1.8),
        # one row per optimizer step: the last ten rows, as before (rollouts 11-20)
        (1, 20, 1.55),
        # a row every four steps, at 4, ..., 20: steps 11-20 hold the rows at 12, 16 and 20 (rollouts 3-5)
        (4, 5, 0.4),
    ],
)
def test_training_metrics_are_averaged_over_the_last_10_optimizer_steps(tmp_path, steps_per_rollout, rollouts, expected):
    run = load_run(write_run(tmp_path, steps_per_rollout=steps_per_rollout, rollouts=rollouts))
    assert final_value(run, "reward") == pytest.approx(expected)
