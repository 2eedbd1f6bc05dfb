"""The benchmark harness: a scaled-down W0 runs end to end and ends with the JSON summary."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("benchmarks_run", REPO_ROOT / "benchmarks" / "run.py")
bench = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

REQUIRED_KEYS = {
    "median_step_s", "tokens_per_s", "peak_mem_gib", "phases", "workload", "device", "torch", "transformers", "commit",
}
TINY_W0 = ["--prompts", "2", "--group-size", "2", "--prompt-tokens", "4", "--max-new-tokens", "4", "--threads", "1"]


def test_scaled_down_w0_prints_the_json_summary_last(tmp_path):
    out = tmp_path / "result.json"
    command = [sys.executable, "benchmarks/run.py", "--workload", "W0", "--steps", "2", *TINY_W0,
               "--workdir", str(tmp_path / "work"), "--out", str(out)]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]

    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert REQUIRED_KEYS <= result.keys()
    assert result["workload"] == "W0"
    assert set(result["phases"]) == {"rollout_s", "score_s", "logprob_s", "update_s", "step_s"}
    assert len(result["step_s"]) == 2
    assert result["median_step_s"] == result["step_s"][1]  # the first step is left out
    assert result["tokens_per_step"] == 2 * 2 * 4  # P x G x max_new_tokens: every completion is full length
    assert result["tokens_per_s"] == pytest.approx(16 / result["median_step_s"])
    assert result["peak_mem_gib"] >= 0
    assert json.loads(out.read_text()) == result


def test_workloads_match_the_spec():
    w0, w1, w2 = bench.WORKLOADS["W0"], bench.WORKLOADS["W1"], bench.WORKLOADS["W2"]
    assert (w0.prompts, w0.group_size, w0.prompt_tokens, w0.max_new_tokens, w0.vocab_size) == (8, 4, 16, 32, 512)
    assert (w1.prompts * w1.group_size, w1.prompt_tokens, w1.max_new_tokens, w1.micro_batch_size) == (128, 64, 256, 32)
    assert (w1.hidden_size, w1.num_layers, w1.num_heads, w1.num_kv_heads, w1.intermediate_size) == (896, 24, 14, 2, 4864)
    assert (w2.prompts * w2.group_size, w2.prompt_tokens, w2.max_new_tokens) == (256, 128, 512)
    assert (w2.hidden_size, w2.num_layers, w2.num_heads, w2.num_kv_heads, w2.intermediate_size) == (1536, 28, 12, 2, 8960)


def test_summary_skips_the_first_step_and_takes_medians():
    steps = [
        {"wall_s": 9.0, "rollout_s": 8.0, "update_s": 1.0},
        {"wall_s": 2.0, "rollout_s": 1.0, "update_s": 1.0},
        {"wall_s": 4.0, "rollout_s": 3.0, "update_s": 0.5},
        {"wall_s": 3.0, "rollout_s": 2.0, "update_s": 0.7},
    ]
    summary = bench.summarize(steps, tokens_per_step=300, world_size=2)
    assert summary["median_step_s"] == 3.0
    assert summary["phases"] == {"rollout_s": 2.0, "update_s": 0.7}
    assert summary["tokens_per_s"] == 200.0  # both devices' tokens
    assert summary["tokens_per_s_per_device"] == 100.0


def test_fsdp_scaling_runs_three_configurations_and_compares_their_steps(tmp_path):
    """benchmarks/fsdp_scaling.py end to end on two CPU processes (gloo), scaled down."""
    command = [sys.executable, "benchmarks/fsdp_scaling.py", "--workload", "W0", "--devices", "2", "--steps", "2",
               "--micro-batch-size", "4", "--out-dir", str(tmp_path), "--extra", *TINY_W0, "--accelerator", "cpu"]
    # Lightning sets MASTER_PORT in this process when a test runs a process group in it, and that
    # port can still be bound: let the benchmark's runs pick their own.
    launcher_variables = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")
    env = {k: v for k, v in os.environ.items() if k not in launcher_variables}
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads((tmp_path / "scaling.json").read_text())
    assert set(summary["runs"]) == {"single", "fsdp-1", "fsdp-2"}
    assert summary["scaling_efficiency"]["fsdp-2"] == pytest.approx(
        summary["runs"]["fsdp-2"]["tokens_per_s_per_device"] / summary["runs"]["single"]["tokens_per_s_per_device"]
    )
    # Keyed sampling and fp32: the two-process run's steps are the one-process run's.
    agreement = {(row["step"], row["metric"]): row for row in summary["agreement"]}
    assert {"reward", "loss", "kl", "entropy"} <= {metric for _, metric in agreement}
    assert all(row["abs_diff"] < 1e-5 for row in agreement.values())
