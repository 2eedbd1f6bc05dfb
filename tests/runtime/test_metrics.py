"""Step metrics: weighted means, minima and maxima merged over processes; what is logged when."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_lightning.runtime.metrics import PhaseTimer, StepMetrics, every_step_metrics


def test_step_metrics_merge_weighted_means_minima_and_maxima_over_processes():
    processes = [StepMetrics(), StepMetrics()]
    processes[0].update("loss", 1.0, weight=1.0)
    processes[0].update("loss", 4.0, weight=3.0)  # this process: (1 + 12) / 4
    processes[1].update("loss", 2.0, weight=4.0)
    for metrics, shortest, longest in zip(processes, (5.0, 3.0), (9.0, 7.0)):
        metrics.update("min_length", shortest, reduce="min")
        metrics.update("max_length", longest, reduce="max")
    processes[1].update("only_here", 6.0)
    states = []

    def gather(state):  # stands in for the all-gather over processes
        states.append(state)
        return states

    processes[0].compute_and_reset(gather=gather)
    merged = processes[1].compute_and_reset(gather=gather)
    assert merged == {"loss": (1 + 12 + 8) / 8, "min_length": 3.0, "max_length": 9.0, "only_here": 6.0}
    assert processes[1].compute_and_reset() == {}  # reset


def test_step_metrics_leave_out_nan_values():
    """A NaN value (e.g. the mean of a reward function that scored nothing) adds nothing to a mean,
    minimum or maximum; a metric that got only NaN is NaN, not missing."""
    metrics = StepMetrics()
    for value, weight in ((1.0, 2.0), (float("nan"), 5.0), (4.0, 1.0)):
        metrics.update("reward", value, weight=weight)
    metrics.update("shortest", float("nan"), reduce="min")
    metrics.update("shortest", 7.0, reduce="min")
    metrics.update("unscored", torch.tensor(float("nan")))
    metrics.update("longest", float("nan"), reduce="max")
    values = metrics.compute_and_reset()
    assert values["reward"] == (2.0 + 4.0) / 3 and values["shortest"] == 7.0
    assert math.isnan(values["unscored"]) and math.isnan(values["longest"])
    with pytest.raises(ValueError, match="reduce must be one of mean, min, max, got 'median'"):
        metrics.update("loss", 1.0, reduce="median")



def test_step_metrics_log_a_value_as_it_was_when_added():
    """Values are read at the end of the step (not moved to the CPU as they are added); a tensor
    changed in place after being added still counts with its value at that time."""
    metrics = StepMetrics()
    running = torch.tensor(2.0)
    metrics.update("loss", running, weight=torch.tensor(1.0))
    running += 10.0
    metrics.update("loss", running, weight=torch.tensor(3.0))
    assert metrics.compute_and_reset() == {"loss": (2.0 + 36.0) / 4}


def test_every_step_gives_self_log_the_loss_reward_and_kl_as_cpu_tensors():
    values = {"loss": 1.0, "reward": 0.5, "kl": 0.01, "entropy": 2.0, "perf/step_s": 0.1}
    others, progress = every_step_metrics(values)
    assert set(others) == {"loss"} and set(progress) == {"reward", "kl"}
    assert all(v.device.type == "cpu" and float(v) == pytest.approx(values[k]) for k, v in {**others, **progress}.items())


def test_phase_timer_adds_one_duration_per_phase_under_perf():
    metrics = StepMetrics()
    timer = PhaseTimer(metrics, torch.device("cpu"))
    for _ in range(2):  # a phase run twice in a step counts as the mean of its durations
        with timer.phase("rollout"):
            pass
    values = metrics.compute_and_reset()
    assert set(values) == {"perf/rollout_s"} and 0 <= values["perf/rollout_s"] <= timer.total()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_values_on_the_gpu_and_on_the_cpu_are_read_together_in_order():
    metrics = StepMetrics()
    metrics.update("loss", torch.tensor(2.0, device="cuda"))
    metrics.update("perf/step_s", 0.5)
    metrics.update("loss", torch.tensor(4.0, device="cuda"), weight=3.0)
    metrics.update("length", torch.tensor(7.0), reduce="max")
    metrics.update("length", torch.tensor(9.0, device="cuda"), reduce="max")
    assert metrics.compute_and_reset() == {"loss": (2.0 + 12.0) / 4, "perf/step_s": 0.5, "length": 9.0}
