"""Several nodes through Lightning's ``num_nodes``: two "nodes" as two CPU processes on localhost
(gloo), each started by the real ``grpo-lightning fit`` with ``MASTER_ADDR``, ``MASTER_PORT`` and
``NODE_RANK`` as on two machines, train FSDP exactly as one node of two devices trains under DDP:
every logged metric at every step, and the final weights."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.cli.resources import config_dir
from tests.helpers import launcher_free_env

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = config_dir()
STEPS = 2
DDP = ["--trainer.strategy", "ddp"]
#: The sharded strategy of configs/strategy/fsdp.yaml, in float32 on the CPU.
FSDP = ["--trainer.strategy", "grpo_lightning.runtime.strategies.PolicyFSDPStrategy", "--trainer.strategy.mixed_precision", "null"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fit_command(model_dir: str, out: Path, nodes: int, devices: int, strategy: list[str]) -> list[str]:
    """``grpo-lightning fit`` of GRPO on the tiny model: 2 steps of 2 prompts x 2 completions per
    process, keyed sampling (the same prompts sample the same completions however the processes are
    started), logs, every process's completions (``completions.jsonl``) and ``last.ckpt`` under ``out``."""
    return [
        sys.executable,
        "-m",
        "grpo_lightning.cli",
        "fit",
        "--config",
        str(CONFIGS / "trainer/cpu.yaml"),
        "--config",
        str(CONFIGS / "data/arithmetic.yaml"),
        "--config",
        str(CONFIGS / "variant/grpo.yaml"),
        "--model.model",
        model_dir,
        "--model.rewards.funcs",
        "[conftest.length_parity_reward]",
        "--model.kl.beta",
        "0.04",
        "--model.sampling.group_size",
        "2",
        "--model.sampling.max_new_tokens",
        "6",
        "--model.optim.learning_rate",
        "1e-3",
        "--model.policy.dtype",
        "float32",
        "--model.sampling.seed",
        "7",
        "--model.engine.rollout",
        "static",
        "--data.batch_size",
        "2",
        "--data.num_train",
        "16",
        "--data.num_val",
        "2",
        *strategy,
        "--trainer.num_nodes",
        str(nodes),
        "--trainer.devices",
        str(devices),
        "--trainer.max_steps",
        str(STEPS),
        "--trainer.limit_val_batches",
        "0",
        "--validate_before_fit",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.default_root_dir",
        str(out),
        "--trainer.logger.init_args.save_dir",
        str(out),
        "--trainer.callbacks.dirpath",
        str(out / "ckpt"),
        "--completions.max_rows",
        "0",
        "--completions.jsonl",
        "true",
    ]


def launch(command: list[str], out: Path, name: str, **variables: str) -> subprocess.Popen:
    env = launcher_free_env()
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])  # the reward: conftest's
    env.update(PYTHONPATH=path, OMP_NUM_THREADS="1", **variables)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.txt", "w") as log:  # the process writes to its own copy of the handle
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def finish(processes: dict[str, subprocess.Popen], out: Path) -> None:
    try:
        for name, process in processes.items():
            assert process.wait(timeout=300) == 0, (out / f"{name}.txt").read_text()[-3000:]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def logged(out: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar rank 0 logged to TensorBoard (``perf/*`` timings left out), as (step, value)."""
    (run,) = (out / "grpo").glob("version_*")
    events = EventAccumulator(str(run))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
        if not tag.startswith("perf/")
    }


def completions(out: Path) -> list[tuple]:
    """What every rank sampled and how it scored (the file rank 0 writes): (step, prompt, completion,
    reward) of each completion."""
    (path,) = (out / "grpo").glob("version_*/completions.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(row["step"], row["prompt"], row["completion"], row["reward"]) for row in rows]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    state = torch.load(out / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("policy.")}


@pytest.mark.slow
def test_fsdp_over_two_nodes_on_localhost_trains_like_ddp_on_one_node_of_two_devices(tiny_model_dir, tmp_path):
    one_node, two_nodes = tmp_path / "one_node", tmp_path / "two_nodes"
    # One node: Lightning starts the second process itself.
    finish({"node0": launch(fit_command(tiny_model_dir, one_node, nodes=1, devices=2, strategy=DDP), one_node, "node0")}, one_node)
    # Two nodes of one device: each started on its own, as a scheduler would on two machines.
    port = str(free_port())
    command = fit_command(tiny_model_dir, two_nodes, nodes=2, devices=1, strategy=FSDP)
    nodes = {
        f"node{rank}": launch(command, two_nodes, f"node{rank}", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                              NODE_RANK=str(rank))  # fmt: skip
        for rank in (0, 1)
    }
    finish(nodes, two_nodes)

    assert completions(two_nodes) == completions(one_node)
    assert [row[0] for row in completions(one_node)] == [0] * 8 + [1] * 8  # 2 prompts x 2 a step on each of 2 ranks
    expected, got = logged(one_node), logged(two_nodes)
    assert {"loss", "reward", "kl", "grad_norm"} <= set(expected), sorted(expected)
    assert sorted(got) == sorted(expected)
    for tag in expected:
        assert [step for step, _ in got[tag]] == [step for step, _ in expected[tag]], tag
        torch.testing.assert_close([v for _, v in got[tag]], [v for _, v in expected[tag]], rtol=1e-5, atol=1e-6, msg=tag)
    assert [step for step, _ in expected["loss"]] == list(range(1, STEPS + 1))  # after each optimizer step
    assert all(value > 0 for _, value in expected["grad_norm"]), "the comparison needs updates that move the weights"
    weights, reference = final_weights(two_nodes), final_weights(one_node)
    torch.testing.assert_close(weights, reference, rtol=1e-5, atol=1e-6)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(reference[f"policy.{name}"], start[name]) for name in start if f"policy.{name}" in reference)
