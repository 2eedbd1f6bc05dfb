"""The benchmark harness: a scaled-down W0 runs end to end and ends with the JSON summary."""

from __future__ import annotations

import dataclasses
import importlib.util
import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from tests.helpers import launcher_free_env

REPO_ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("benchmarks_run", REPO_ROOT / "benchmarks" / "run.py")
bench = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
_spec = importlib.util.spec_from_file_location("benchmarks_fsdp_scaling", REPO_ROOT / "benchmarks" / "fsdp_scaling.py")
scaling = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scaling)
_spec = importlib.util.spec_from_file_location("first_step", REPO_ROOT / "benchmarks" / "first_step.py")
first_step = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(first_step)
_spec = importlib.util.spec_from_file_location("stop_lengths", REPO_ROOT / "benchmarks" / "stop_lengths.py")
stops = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stops)

REQUIRED_KEYS = {
    "median_step_s", "tokens_per_s", "peak_mem_gib", "phases", "workload", "device", "torch", "transformers", "commit",
}
TINY_W0 = ["--prompts", "2", "--group-size", "2", "--prompt-tokens", "4", "--max-new-tokens", "4", "--threads", "1",
           "--first-step", "none"]  # fmt: skip
ON_CPU = ["--accelerator", "cpu"]  # the CPU path's choices (HF rollout, CPU profile), also on a machine with a GPU


def test_scaled_down_w0_prints_the_json_summary_last(tmp_path):
    out = tmp_path / "result.json"
    command = [sys.executable, "benchmarks/run.py", "--workload", "W0", "--steps", "2", *TINY_W0, *ON_CPU,
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
    # No speed flag: the module's choice for the device (the HF path on a CPU), recorded as resolved.
    assert set(result["engine"].values()) <= {"auto", None, False}
    assert result["engine_resolved"]["rollout"] == "hf" and not result["engine_resolved"]["compile"]


def test_bounded_staleness_times_the_trained_steps_not_those_that_fill_the_queue(tmp_path):
    command = [sys.executable, "benchmarks/run.py", "--workload", "W0", "--steps", "2", *TINY_W0, *ON_CPU,
               "--max-staleness", "2", "--partial-rollouts", "--workdir", str(tmp_path / "work")]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert (result["max_staleness"], result["partial_rollouts"]) == (2, True)
    assert len(result["step_s"]) == 4  # two batches only sampled (the queue of k = 2), then two trained
    assert result["median_step_s"] == statistics.median(result["step_s"][2:])


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed")
def test_first_step_from_process_start_is_measured_for_both_frameworks(tmp_path):
    command = [sys.executable, "benchmarks/run.py", "--workload", "W0", "--steps", "2", *TINY_W0, *ON_CPU,
               "--compare", "trl", "--first-step", "cold", "--workdir", str(tmp_path / "work")]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    ours, trl = result, result["trl"]
    # A new process's first step includes its imports and loading: longer than the step alone.
    assert ours["first_step_s"] > ours["step_s"][0] and trl["first_step_s"] > trl["step_s"][0]
    assert "first_step_warm_s" not in ours and "first_step_warm_s" not in trl  # --first-step cold
    assert "first step from process start: ours" in completed.stdout
    phases = ours["first_step_cold_phases"]  # where ours went, in order, adding up to the whole
    assert list(phases) == list(first_step.PHASES) and min(phases.values()) >= 0
    assert sum(phases.values()) == pytest.approx(ours["first_step_s"], abs=0.01)


def test_first_step_phases_run_from_the_launch_through_each_mark():
    marks = {"imports_end": 104.0, "fit_called": 104.5, "train_start": 107.0, "first_batch_start": 107.25}
    phases = first_step.first_step_phases({"first_step_marks": marks, "first_step_end_time": 110.0}, launched=100.0)
    assert phases == {"imports_s": 4.0, "build_s": 0.5, "setup_s": 2.5, "loop_start_s": 0.25, "step_s": 2.75}


def test_the_first_step_clock_starts_before_the_process_does(tmp_path):
    child = "import json, time; time.sleep(1.0); print(json.dumps({'first_step_end_time': time.time()}))"
    env = first_step.cache_env(tmp_path)
    line, launched = first_step.timed_process([sys.executable, "-c", child], env)
    assert first_step.first_step_s(line, launched) >= 1.0  # the interpreter's start and the sleep count
    assert {env[name] for name in first_step.CACHE_VARIABLES} == {str(p) for p in tmp_path.iterdir()}
    assert not any(list(p.iterdir()) for p in tmp_path.iterdir())  # empty: a cold start


def test_speed_flags_set_the_module_s_engine_options():
    args = bench.parse_args(["--workload", "W1", "--rollout", "static", "--compile", "--model-compile", "off",
                             "--fused-lm-head", "on", "--decode-attention", "math"])  # fmt: skip
    assert bench.engine_options(args) == bench.EngineOptions(
        rollout="static", compile=True, decode_attention="math", model_compile=False, fused_lm_head=True
    )
    # The flags of earlier commands keep their meaning.
    args = bench.parse_args(["--workload", "W1", "--rollout-engine", "hf", "--rollout-compile", "--logprob-compile"])
    assert bench.engine_options(args) == bench.EngineOptions(rollout="hf", compile=True, logprob_compile=True)


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


def test_summary_leaves_out_the_profiled_step():
    steps = [{"wall_s": 9.0}, {"wall_s": 2.0}, {"wall_s": 7.0, "profiled": True}, {"wall_s": 3.0}]
    assert bench.summarize(steps, tokens_per_step=10, world_size=1)["median_step_s"] == 2.5
    # nothing else to take the median of: the profiled step
    assert bench.summarize(steps[:3][::2], tokens_per_step=10, world_size=1)["median_step_s"] == 7.0


def test_gradient_stats_are_squared_norms_and_dot_products_with_a_probe_seeded_by_the_name():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1, bias=False))
    model(torch.randn(4, 3)).sum().backward()
    stats = bench.gradient_stats(model, compute=True)
    assert set(stats) == {"0.weight", "0.bias", "1.weight"}
    for name, parameter in model.named_parameters():
        probe = torch.randn(parameter.shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))
        assert stats[name]["sq_norm"] == pytest.approx(float(parameter.grad.square().sum()), rel=1e-6)
        assert stats[name]["probe_dot"] == pytest.approx(float((parameter.grad * probe).sum()), rel=1e-5)
    assert bench.gradient_stats(model, compute=False) is None


@pytest.fixture(scope="module")
def dumped_and_profiled_run(tmp_path_factory):
    """One scaled-down W0 run with ``--dump-first-step`` and ``--profile-step 2``."""
    directory = tmp_path_factory.mktemp("dump_and_profile")
    out, dump = directory / "result.json", directory / "dump"
    command = [sys.executable, "benchmarks/run.py", "--workload", "W0", "--steps", "2", *TINY_W0, *ON_CPU, "--workdir",
               str(directory / "work"), "--out", str(out), "--dump-first-step", str(dump), "--profile-step", "2"]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(out.read_text()), out, dump


def test_first_step_dump_holds_completions_and_the_gradients_before_clipping(dumped_and_profiled_run):
    result, _, dump = dumped_and_profiled_run
    assert [f.name for f in dump.iterdir()] == ["rank0.pt"]
    first = torch.load(dump / "rank0.pt", weights_only=True)
    assert (first["rank"], first["world_size"]) == (0, 1)
    rows = first["rows"]
    assert len(rows) == 2 * 2  # P x G
    assert all(len(row["completion"]) == 4 and all(isinstance(t, int) for t in row["completion"]) for row in rows)
    assert [row["prompt"] for row in rows][::2] == [row["prompt"] for row in rows][1::2]  # G rows per prompt
    grads = first["grads"]
    assert "model.embed_tokens.weight" in grads and not any("_fsdp_wrapped_module" in name for name in grads)
    assert all(math.isfinite(g["sq_norm"]) and math.isfinite(g["probe_dot"]) for g in grads.values())
    # The module logs grad_norm before clipping it to max_grad_norm, and the dump is taken there too.
    logged = result["steps_detail"][0]["grad_norm"]
    assert first["grads_at"] == "before clipping" and logged > first["max_grad_norm"]  # clipped after the dump
    assert sum(g["sq_norm"] for g in grads.values()) == pytest.approx(logged**2, rel=1e-4)
    assert set(first["tf32"]) == {"cuda_matmul_allow_tf32", "float32_matmul_precision", "cudnn_allow_tf32"}


def test_profile_step_writes_a_table_and_the_top_ops(dumped_and_profiled_run):
    result, out, _ = dumped_and_profiled_run
    table = out.with_suffix(".profile.txt").read_text()
    assert "Self CPU" in table and "aten::" in table
    profile = result["profile"]
    assert profile["step"] == 2 and profile["sort_by"] == "self_cpu_time_total"
    top = profile["top_ops"]
    assert 0 < len(top) <= 15 and {"name", "calls", "self_ms", "total_ms"} <= set(top[0])
    assert [op["self_ms"] for op in top] == sorted((op["self_ms"] for op in top), reverse=True)
    # the module's record_function ranges around the step's phases
    assert {r["name"] for r in profile["ranges"]} == {"grpo.rollout", "grpo.score", "grpo.logprobs", "grpo.update"}
    assert "grpo.* range" in table
    assert result["steps_detail"][1]["profiled"] and "profiled" not in result["steps_detail"][0]


def _fake_run(world_size: int, tokens_per_s_per_device: float, loss: float) -> dict:
    return {"median_step_s": 1.0, "tokens_per_s": tokens_per_s_per_device * world_size, "peak_mem_gib": 0.0, "phases": {},
            "tokens_per_s_per_device": tokens_per_s_per_device, "command": "", "world_size": world_size,
            "steps_detail": [{"loss": loss, "reward": 0.5}]}  # fmt: skip


def test_scaling_summary_with_a_variant_and_without_fsdp_1():
    results = {"single": _fake_run(1, 100.0, 1.0), "fsdp-1": _fake_run(1, 90.0, 1.0),
               "fsdp-2": _fake_run(2, 80.0, 1.0), "fsdp-2-sgo": _fake_run(2, 85.0, 1.5)}  # fmt: skip
    summary = scaling.scaling_summary(results, "2", ["sgo"])
    assert summary["scaling_efficiency"] == pytest.approx({"fsdp-2": 0.8, "fsdp-2-sgo": 0.85})
    assert all(row["abs_diff"] == 0 for row in summary["agreement"])
    sgo = {row["metric"]: row for row in summary["variant_agreement"]["sgo"]}
    assert sgo["loss"]["abs_diff"] == 0.5 and sgo["reward"]["abs_diff"] == 0
    del results["fsdp-1"]
    summary = scaling.scaling_summary(results, "2", ["sgo"])
    assert set(summary["runs"]) == {"single", "fsdp-2", "fsdp-2-sgo"}
    assert "agreement" not in summary and "variant_agreement" not in summary
    assert scaling.parse_variant('sgo=--sharding-strategy SHARD_GRAD_OP --x "a b"') == (
        "sgo", ["--sharding-strategy", "SHARD_GRAD_OP", "--x", "a b"]
    )


def test_completions_match_by_prompt_and_index_and_gradients_by_name():
    one = [{"prompt": "a", "completion": [1, 2]}, {"prompt": "a", "completion": [3, 4]}, {"prompt": "b", "completion": [5, 6]}]
    split = [one[2], one[0], {"prompt": "a", "completion": [3, 7]}]  # other ranks, other order
    assert scaling.compare_completions(one, split) == {"rows": 3, "differ": 1, "unmatched": 0, "first_difference": [1]}
    grads = {"w": {"sq_norm": 4.0, "probe_dot": 1.0}, "b": {"sq_norm": 1.0, "probe_dot": -1.0}}
    other = {"w": {"sq_norm": 4.0, "probe_dot": 1.2}, "b": {"sq_norm": 1.21, "probe_dot": -1.0}}
    compared = scaling.compare_gradients(grads, other)
    assert [r["name"] for r in compared["norm"]] == ["b", "w"] and compared["norm"][0]["norm_rel_diff"] == pytest.approx(0.1)
    assert [r["name"] for r in compared["probe"]] == ["w", "b"] and compared["probe"][0]["probe_rel_diff"] == pytest.approx(0.1)
    assert scaling.grad_norm(grads) == pytest.approx(math.sqrt(5))


@pytest.mark.slow
def test_fsdp_scaling_check_fp32_compares_completions_and_first_step_gradients(tmp_path):
    """``--check-fp32`` on two CPU processes: single, fsdp-1 and fsdp-2 sample the same completions
    and compute the same first-step gradients. (The scaling mode runs the same three processes; its
    summary is checked above, and two FSDP processes' training in tests/runtime/test_strategies.py.)"""
    command = [sys.executable, "benchmarks/fsdp_scaling.py", "--workload", "W0", "--devices", "2", "--check-fp32",
               "--fp32-shape", "--steps 2", "--micro-batch-size", "4", "--out-dir", str(tmp_path),
               "--extra", *TINY_W0, "--accelerator", "cpu"]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=launcher_free_env())
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads((tmp_path / "check_fp32.json").read_text())
    runs = ("fsdp-1-fp32", "fsdp-2-fp32", "single-fp32")
    assert sorted(f.name for f in (tmp_path / "fsdp-2-fp32.dump").iterdir()) == ["rank0.pt", "rank1.pt"]
    assert all(row["abs_diff"] < 1e-5 for row in summary["agreement"])
    pairs = ("fsdp-1-fp32 vs fsdp-2-fp32", "single-fp32 vs fsdp-1-fp32")
    assert all(row["abs_diff"] < 1e-5 for row in summary["agreement_pairs"][pairs[1]])
    for pair in pairs:
        assert summary["completions"][pair] == {"rows": 4, "differ": 0, "unmatched": 0, "first_difference": []}
        gradients = summary["gradients"][pair]
        assert gradients["unmatched"] == [] and len(gradients["norm"]) == len(gradients["probe"]) == 10
        assert all(row["norm_rel_diff"] < 1e-4 and row["probe_rel_diff"] < 1e-4 for row in gradients["norm"] + gradients["probe"])
    for name in runs:
        assert summary["grad_norm"][name] == pytest.approx(summary["logged_grad_norm"][name], rel=1e-4)
        assert summary["tf32"][name]["float32_matmul_precision"] in ("highest", "high", "medium")
    assert "rows differ" in completed.stdout and "largest relative differences of gradient norm" in completed.stdout


def test_padding_free_benchmark_measures_packed_against_padded_on_a_ragged_batch(capsys):
    spec = importlib.util.spec_from_file_location("benchmarks_padding_free", REPO_ROOT / "benchmarks" / "studies" / "padding_free.py")
    padding_free = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(padding_free)
    result = padding_free.main(["--workload", "W0", "--repeats", "1"])
    assert 0 < result["real_tokens"] < result["padded_tokens"]
    assert result["max_abs_logp_difference"] < 1e-5
    assert result["padded_ms"] > 0 and result["packed_ms"] > 0
    assert "packed" in capsys.readouterr().out


def test_trace_phases_sums_busy_and_idle_time_and_the_outermost_host_calls(tmp_path):
    spec = importlib.util.spec_from_file_location("benchmarks_trace_phases", REPO_ROOT / "benchmarks" / "trace_phases.py")
    phases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(phases)

    def event(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"cat": cat, "name": name, "ts": ts * 1000, "dur": dur * 1000, "pid": 1, "tid": tid}  # in us

    # Times in ms. On the GPU: kernels at 0-10, 10.5-30.5, 60-70 and 65-75 (overlapping), in a
    # 100 ms phase: busy 10 + 20 + 10 + 5 = 45, idle 0.5 (a 500 us gap) + 29.5 + 25 (after the last).
    events = [
        event("gpu_user_annotation", "grpo.update", 0, 100),
        event("kernel", "gemm", 0, 10),
        event("kernel", "norm", 10.5, 20),
        event("gpu_memcpy", "Memcpy DtoD", 60, 10),
        event("kernel", "gemm", 65, 10),
        event("kernel", "outside the phase", 120, 5),
        # On the host: two outer calls of X (one with a call inside it), a compiled region, and on
        # another thread (the backward pass's) a call while X runs.
        event("user_annotation", "grpo.update", 1000, 200),
        event("cpu_op", "X", 1010, 50),
        event("cpu_op", "Y", 1020, 10),
        event("cpu_op", "MulBackward0", 1030, 15, tid=2),
        event("cpu_op", "Torch-Compiled Region: 1/0", 1100, 30),
        event("cpu_op", "Z", 1105, 5),
        event("cpu_op", "X", 1170, 10),
    ]
    summary = phases.phase_summary(events, "grpo.update")
    assert summary["span_ms"] == 100 and summary["kernels"] == 4
    assert summary["busy_ms"] == pytest.approx(45) and summary["idle_ms"] == pytest.approx(55)
    assert dict(summary["idle_by_gap"]) == pytest.approx({"0.1-1 ms": 0.5, ">=1 ms": 54.5})
    assert dict(summary["kernel_ms"]) == pytest.approx({"gemm": 20, "norm": 20, "Memcpy DtoD": 10})
    assert summary["kernel_calls"]["gemm"] == 2
    assert dict(summary["host_ms"]) == pytest.approx({"X": 60, "Torch-Compiled Region: 1/0": 30, "MulBackward0": 15})
    assert summary["host_calls"]["X"] == 2 and summary["host_span_ms"] == 200
    assert dict(summary["compiled_ms"]) == pytest.approx({"Torch-Compiled Region: 1/0": 30})
    assert phases.phase_summary(events, "grpo.rollout") is None

    trace = tmp_path / "trace.json.gz"
    with gzip.open(trace, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    printed = subprocess.run(
        [sys.executable, "benchmarks/trace_phases.py", str(trace), "--phases", "grpo.update", "grpo.rollout"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "== grpo.update: span 100.0 ms on the GPU, 4 kernels, busy 45.0 ms, idle 55.0 ms" in printed
    assert "== grpo.rollout: not in the trace" in printed


def test_w5_is_w1_with_lognormal_stop_lengths_median_600_and_a_tenth_at_the_limit():
    w1, w5 = bench.WORKLOADS["W1"], bench.WORKLOADS["W5"]
    assert (w5.max_new_tokens, w5.stop_lengths, w5.micro_batch_size) == (2048, "lognormal", 8)
    assert dataclasses.replace(w5, max_new_tokens=256, stop_lengths=None, micro_batch_size=32) == w1
    lengths = [length for step in range(400) for length in stops.stop_lengths(step, 128, 2048, seed=0)]
    assert statistics.median(lengths) == pytest.approx(600, rel=0.03)
    assert sum(length == 2048 for length in lengths) / len(lengths) == pytest.approx(0.10, abs=0.01)
    assert min(lengths) >= 1 and max(lengths) == 2048
    # The same table for any caller, one draw per (step, row), whatever the number of rows asked.
    assert stops.stop_lengths(3, 16, 2048, seed=0) == stops.stop_lengths(3, 128, 2048, seed=0)[:16]
    assert stops.stop_lengths(3, 16, 2048, seed=0) != stops.stop_lengths(4, 16, 2048, seed=0)


def test_force_stops_blocks_eos_before_the_drawn_length_and_everything_else_at_it():
    is_eos = torch.tensor([False, True, False, False])
    eos_at = stops.eos_steps([1, 3, 4], max_new_tokens=4)  # the third row reaches the limit: no EOS forced
    assert eos_at.tolist() == [0, 2, 4]
    logits = torch.zeros(3, 4)
    inf = float("-inf")
    assert stops.force_stops(logits, 0, eos_at, is_eos).tolist() == [[inf, 0, inf, inf], [0, inf, 0, 0], [0, inf, 0, 0]]
    at_two = stops.force_stops(logits, torch.tensor([2]), eos_at, is_eos)  # as the engine passes its step
    assert at_two.tolist() == [[0, 0, 0, 0], [inf, 0, inf, inf], [0, inf, 0, 0]]
    assert stops.produced_lengths(torch.tensor([[5, 1, 0], [5, 5, 5], [1, 0, 0]]), [1]) == [2, 3, 1]


FORCED_W0 = ["--prompts", "4", "--group-size", "4", "--prompt-tokens", "4", "--max-new-tokens", "32", "--threads", "1"]


@pytest.fixture(scope="module")
def forced_stop_run(tmp_path_factory):
    """Our side of W0 with ``--stop-lengths lognormal`` (16 rows, up to 32 tokens, 2 steps)."""
    directory = tmp_path_factory.mktemp("forced_stops")
    command = [sys.executable, "benchmarks/run.py", "--workload", "W0", "--steps", "2", *FORCED_W0, "--rollout", "static",
               "--stop-lengths", "lognormal", "--first-step", "none", "--workdir", str(directory / "work")]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1]), directory / "work", completed.stdout


def test_forced_stops_give_every_completion_its_drawn_length(forced_stop_run):
    result, _, printed = forced_stop_run
    drawn = [stops.stop_lengths(step, 16, 32, seed=0) for step in range(2)]
    report = result["stop_lengths"]
    assert (report["rows"], report["rows_off"]) == (32, 0)
    assert report["mean_length_per_rollout"] == [statistics.mean(d) for d in drawn]
    # The module's own count of completion tokens (up to and including EOS) agrees, step by step.
    assert [s["completions/mean_length"] for s in result["steps_detail"]] == pytest.approx([statistics.mean(d) for d in drawn])
    assert result["tokens_per_step"] == sum(drawn[1])  # the timed step's tokens
    assert report["bucket_steps"] == 4 and 0 < len(report["decode_ms_per_step"]) <= 8
    assert all(ms > 0 for ms in report["decode_ms_per_step"])
    assert report["rows_running"] == sorted(report["rows_running"], reverse=True)
    assert "stop lengths: drawn mean" in printed and "decode ms/step" in printed


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed")
def test_trl_side_forces_the_same_lengths_on_the_same_rows(forced_stop_run):
    ours, work, _ = forced_stop_run
    command = [sys.executable, "benchmarks/trl_compare.py", "--model", str(work / "model"), "--prompts", str(work / "prompts"),
               "--num-prompts", "4", "--group-size", "4", "--max-new-tokens", "32", "--micro-batch-size", "16",
               "--steps", "2", "--cpu", "--threads", "1", "--stop-lengths", "lognormal"]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])["stop_lengths"]
    assert (report["rows"], report["rows_off"]) == (32, 0)
    assert report["mean_length_per_rollout"] == ours["stop_lengths"]["mean_length_per_rollout"]
    assert report["mean_completion_length"] == pytest.approx(ours["stop_lengths"]["mean_completion_length"])


def test_memory_held_counts_each_owner_s_tensors_once(tiny_model_dir, tmp_path):
    """``memory_held`` (the per-owner breakdown the GPU runs print) after a real fit, counted on the
    CPU: the policy's weights, AdamW's two moments per weight, the reference copy and the engine's
    key/value cache."""
    from tests.helpers import fit, make_module

    from grpo_lightning.rollout.engine.options import EngineOptions

    module = make_module(tiny_model_dir, engine=EngineOptions(rollout="static"), kl={"beta": 0.04})
    _, trainer = fit(module, 1, tmp_path)
    held = bench.memory_held(module, trainer.optimizers[0], device_type="cpu")
    weights = sum(p.numel() * p.element_size() for p in module.policy.parameters()) / 2**30
    assert held["policy_parameters"] == pytest.approx(weights)
    assert held["policy_gradients"] == pytest.approx(weights)  # kept until the next step's zero_grad
    assert held["optimizer_state"] == pytest.approx(2 * weights, rel=0.01)  # plus a step counter per weight
    assert held["reference_parameters"] == pytest.approx(weights)
    assert held["rollout_replica"] == 0.0  # the engine samples from the policy itself
    assert held["rollout_kv_cache"] > 0
    if not torch.cuda.is_available():
        assert bench.memory_held(module, trainer.optimizers[0]) == {}


@pytest.mark.slow
def test_budget_race_reports_steps_wall_clock_and_accuracy_per_framework(tiny_model_dir, tmp_path):
    """Both frameworks train the recipe's task on the tiny model for 6 s from their process's start."""
    frameworks = ["grpo-lightning"] + (["trl"] if importlib.util.find_spec("trl") else [])
    tiny = [
        "--model",
        tiny_model_dir,
        "--set",
        "model.sampling.max_new_tokens=4",
        "--set",
        "model.sampling.group_size=2",
        "--set",
        "model.optim.micro_batch_size=4",
        "--set",
        "data.batch_size=2",
        "--set",
        "data.num_train=64",
        "--set",
        "data.num_val=8",
        "--set",
        "trainer.precision=32-true",
    ]
    command = [sys.executable, "benchmarks/budget_race.py", "--budgets", "0.1", "--device", "cpu", *tiny,
               *([] if "trl" in frameworks else ["--no-trl"])]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert [run["framework"] for run in result["runs"]] == frameworks
    assert 0.0 <= result["accuracy_before"] <= 1.0
    for run in result["runs"]:
        assert run["budget_min"] == 0.1 and isinstance(run["steps"], int) and run["steps"] >= 0
        assert run["wall_s"] >= 6.0  # the budget counts from the process's start: it ends no earlier
        assert 0.0 <= run["accuracy"] <= 1.0


def _startup_phases():
    spec = importlib.util.spec_from_file_location("startup_phases", REPO_ROOT / "benchmarks" / "startup_phases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_startup_phases_give_each_phase_the_seconds_since_the_mark_before_it():
    lines, phases = _startup_phases().phase_table([("imported", 5.0), ("parsed", 5.5), ("loaded", 7.0)])
    assert phases == {"imported": 5.0, "parsed": 0.5, "loaded": 1.5}
    assert [line.split()[-1] for line in lines] == ["imported", "parsed", "loaded"]


def test_startup_phases_time_a_method_that_calls_its_parent_s_once():
    startup = _startup_phases()

    class Base:
        def setup(self):
            return "base"

    class Child(Base):
        def setup(self):
            return super().setup() + "+child"

    marks, depth = [], {}
    for cls in (Base, Child):
        startup._timed(cls, "setup", "strategy setup", marks.append, depth)
    assert Child().setup() == "base+child"
    assert marks == ["before strategy setup", "strategy setup"]


def test_exit_time_splits_a_command_at_its_last_line(tmp_path):
    spec = importlib.util.spec_from_file_location("exit_time", REPO_ROOT / "benchmarks" / "exit_time.py")
    exit_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exit_time)
    child = "import time; print('last', flush=True); time.sleep(0.5); raise SystemExit(3)"
    status, last_line, after = exit_time.exit_time([sys.executable, "-c", child])
    assert status == 3 and last_line > 0 and 0.5 <= after < 5


def test_the_smollm2_report_rebuilds_its_readme_and_compares_arms_paired_by_seed(tmp_path):
    """reports/smollm2/README.md is what its REGENERATE line writes from data/; beside TRL it gives the
    paired difference by seed with its t-interval, and an arm of one seed is kept out of the table."""
    report = REPO_ROOT / "reports" / "smollm2"
    line = (report / "REGENERATE").read_text().strip()
    env = {**os.environ, "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", line], cwd=REPO_ROOT, env=env, check=True, capture_output=True)
    text = (tmp_path / "README.md").read_text()
    assert text == (report / "README.md").read_text()
    # by hand: 64.5-65.0, 71.5-68.5, 62.5-51.5 = -0.5, 3.0, 11.0; mean 4.5, sd 5.895, t(2) 4.303 x 3.403 = 14.64
    assert "paired by seed (n = 3): +4.5 points [-10.1, +19.1] (95% t-interval), paired t-test p = 0.32" in text
    assert "| grpo-lightning grpo | 0, 1, 2 | 55, 51, 58 |" in text
    assert "\n| grpo-lightning dr_grpo | 0 |" not in text and "One seed only, not compared: grpo-lightning dr_grpo" in text


#: Our (aggregation, advantage) -> TRL's (loss_type, scale_rewards): the same loss and advantage.
TRL_LOSS_OF_OURS = {("seq_mean_token_mean", "group_std"): ("grpo", "group"),
                    ("seq_mean_token_sum_norm", "group_mean"): ("dr_grpo", "none"),
                    ("token_mean", "group_std"): ("dapo", "group")}  # fmt: skip


@pytest.mark.parametrize("variant", ["grpo", "dr_grpo", "dapo"])
def test_parity_gives_trl_the_settings_of_our_variant(variant, tiny_model_dir, tmp_path):
    """benchmarks/parity.py's TRL config holds what our variant resolves from the same task settings:
    group size, completions per optimizer step, completion length, temperature, learning rate, beta,
    clip range, gradient clip, loss and advantage, seed and steps (the loss itself, against TRL's code:
    tests/benchmarks/test_parity_trl.py)."""
    pytest.importorskip("trl")
    spec = importlib.util.spec_from_file_location("parity", REPO_ROOT / "benchmarks" / "parity.py")
    parity = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    settings = parity.task_settings(tiny_model_dir, ["model.sampling.group_size=4"], "mul_3digit")
    config = sys.modules["smollm2"].trl_config(settings, tmp_path, seed=3, device="cpu", variant=variant, max_steps=7)
    arguments = {k: v for k, v in settings["model"]["init_args"].items() if k != "model"}
    ours = parity.preset_class(variant)(model=tiny_model_dir, **arguments)

    completions = settings["data"]["init_args"]["batch_size"] * ours.sampling_options.group_size
    assert config.num_generations == ours.sampling_options.group_size == 4
    assert config.generation_batch_size == completions == 32 * 4  # the report's 32 prompts a step
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == completions  # one step a rollout
    assert config.num_iterations == 1
    assert config.max_completion_length == ours.sampling_options.max_new_tokens
    assert config.temperature == ours.sampling_options.temperature
    assert config.learning_rate == ours.optim_options.learning_rate and config.lr_scheduler_type == "constant_with_warmup"
    assert (config.warmup_steps, config.weight_decay) == (ours.optim_options.warmup_steps, ours.optim_options.weight_decay)
    assert config.beta == ours.kl_options.beta == 0.0
    assert (config.epsilon, config.epsilon_high) == (ours.loss_options.clip_eps_low, ours.loss_options.clip_eps_high)
    assert config.max_grad_norm == ours.optim_options.max_grad_norm
    assert (config.loss_type, config.scale_rewards) == TRL_LOSS_OF_OURS[(ours.settings.aggregation, ours.settings.advantage)]
    assert config.use_bias_correction_kl == ours.kl_options.unbiased == False  # noqa: E712  (TRL's default: True)
    assert (config.seed, config.max_steps) == (3, 7)


def _ecosystem():
    spec = importlib.util.spec_from_file_location("ecosystem", REPO_ROOT / "benchmarks" / "ecosystem.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _finite(values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


@pytest.mark.slow
def test_ecosystem_distils_from_the_exported_teacher_and_compares_the_curriculum(tiny_model_dir, tmp_path):
    """benchmarks/ecosystem.py's two learning stages on the tiny model, side by side as the GPU script
    runs them: the student reads the teacher the first fit exported and starts from the base model;
    the curriculum's arms log its metrics (only the one with it on)."""
    work, reward = tmp_path / "work", "model.init_args.rewards.funcs=[tests.helpers.length_parity_reward]"
    command = [sys.executable, "benchmarks/ecosystem.py", "learn", "--smoke", tiny_model_dir, "--work", str(work),
               "--out", str(tmp_path), "--val-every", "2", "--set", reward, "--teacher-steps", "2", "--student-steps", "2",
               "--seeds", "0", "--curriculum-steps", "4", "--num-train", "8"]  # fmt: skip
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]

    distilled = json.loads((tmp_path / "distillation.json").read_text())
    export = str(work / "distill" / "teacher_export")
    assert distilled["teacher_export"] == export and (Path(export) / "model.safetensors").exists()
    assert distilled["student_read"] == {"model": tiny_model_dir, "teacher": export}
    assert all(distilled["checks"].values())
    assert _finite(distilled["accuracy"].values()) and all(0 <= a <= 1 for a in distilled["accuracy"].values())
    student = distilled["student_fit"]["curves"]
    assert [step for step, _ in student["val/accuracy"]] == [0, 2]
    assert [step for step, _ in student["distill/reverse_kl"]] == [1, 2] and _finite(v for _, v in student["distill/reverse_kl"])

    compared = json.loads((tmp_path / "curriculum.json").read_text())
    assert set(compared["fits"]) == {"off-seed0", "on-seed0"}
    assert all(fit["exit_status"] == 0 for fit in compared["fits"].values())
    assert "curriculum/skipped" in compared["fits"]["on-seed0"]["curves"]
    assert not any(tag.startswith("curriculum/") for tag in compared["fits"]["off-seed0"]["curves"])
    summary = compared["summary"]
    assert _finite([*summary["on"]["final_accuracy"], *summary["off"]["final_accuracy"], summary["mean_on_minus_off"]])


def test_ecosystem_w5_arms_differ_only_in_how_a_pass_is_cut():
    ecosystem = _ecosystem()
    rows = ecosystem.w5_command("rows", 4, Path("files"), Path("rows.json"))
    tokens = ecosystem.w5_command("tokens", 4, Path("files"), Path("rows.json"))
    assert tokens == [*rows, "--micro-batch-tokens", str(8 * (64 + 2048))]  # 8 of W5's longest rows a pass
    parsed = bench.parse_args(tokens[2:])
    assert (parsed.workload, parsed.steps, parsed.first_step, parsed.padding_free) == ("W5", 4, "none", True)
    assert bench.micro_batches(parsed, bench.WORKLOADS["W5"]) == {"ppo_epochs": 1, "micro_batch_size": None,
                                                                  "micro_batch_tokens": 8 * 2112}  # fmt: skip
    assert bench.micro_batches(bench.parse_args(rows[2:]), bench.WORKLOADS["W5"])["micro_batch_size"] == 8
    assert ecosystem.w5_command("rows_padded", 4, Path("files"), Path("rows.json")) == [*rows[:-1]]  # W5 as in RESULTS.md
