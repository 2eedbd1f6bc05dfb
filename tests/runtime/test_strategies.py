"""Strategies, on the CPU (gloo): the FSDP wrap policy, the strategy configs, FSDP in one process
(every FSDP hook runs, nothing is sharded) and over two processes (torchrun; sharded), where it
must train as DDP does and resume exactly from its checkpoints."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FullyShardedDataParallel
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

import grpo_lightning.training.module
import grpo_lightning.runtime.strategies
from grpo_lightning.errors import ConfigError
from grpo_lightning.cli.app import GRPOLightningCLI, main
from grpo_lightning.rollout.engine.attention import GQA_ATTENTION, grouped_query_attention
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.checkpoints.export import export_checkpoint, read_checkpoint
from grpo_lightning.runtime.strategies import (
    PolicyFSDPStrategy,
    RolloutReplica,
    decoder_layer_classes,
    full_parameters,
    mixed_precision_config,
    shard,
)
from tests.helpers import fit, logits, make_module

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def test_the_wrap_policy_finds_the_decoder_layer_class(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert decoder_layer_classes(model) == {Qwen2DecoderLayer}


def test_without_fsdp_sharding_and_gathering_change_nothing(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shard(model) is model
    assert isinstance(full_parameters(model), contextlib.nullcontext)


def test_fsdp_mixed_precision_computes_in_bf16_and_reduces_in_fp32():
    config = mixed_precision_config("bf16")
    # buffers (the rotary inverse frequencies) keep their fp32
    assert (config.param_dtype, config.reduce_dtype, config.buffer_dtype) == (torch.bfloat16, torch.float32, None)
    assert config.cast_forward_inputs
    assert mixed_precision_config(None) is None
    with pytest.raises(ValueError, match="mixed_precision"):
        mixed_precision_config("fp8")


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_strategy_configs_parse_through_the_cli(strategy, capsys):
    with pytest.raises(SystemExit) as done:
        main([
            "fit", "--config", str(CONFIGS / "trainer/gpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
            "--config", str(CONFIGS / "variant/grpo.yaml"), "--config", str(CONFIGS / f"strategy/{strategy}.yaml"),
            "--model.model", "some/model", "--print_config",
        ])  # fmt: skip
    assert done.value.code == 0
    expected = "class_path: grpo_lightning.runtime.strategies.PolicyFSDPStrategy" if strategy == "fsdp" else "strategy: ddp"
    assert expected in capsys.readouterr().out


def test_the_fsdp_config_builds_the_strategy():
    args = [
        "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
        "--config", str(CONFIGS / "variant/grpo.yaml"), "--config", str(CONFIGS / "strategy/fsdp.yaml"),
        "--model.model", "some/model", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
    ]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    strategy = cli.trainer.strategy
    assert isinstance(strategy, PolicyFSDPStrategy)
    assert strategy.mixed_precision.param_dtype == torch.bfloat16
    assert cli.model.hparams.policy["dtype"] == "float32"


# ---------------------------------------------------------------- FSDP in one process


def fsdp_module(model_dir: str):
    return make_module(model_dir, kl={"beta": 0.04}, policy={"dtype": "float32"})


def fsdp_strategy() -> PolicyFSDPStrategy:
    return PolicyFSDPStrategy(mixed_precision=None, activation_checkpointing=True)


def test_fsdp_shards_each_model_on_its_own_and_trains_as_without_it(tiny_model_dir, tmp_path, monkeypatch):
    clipped = []
    monkeypatch.setattr(grpo_lightning.runtime.strategies, "clip_grad_norm_", lambda model, norm: clipped.append(norm) or model.clip_grad_norm_(norm))

    grpo = fsdp_module(tiny_model_dir)
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2)
    first, trainer = fit(grpo, 2, tmp_path / "first", callbacks=[every], strategy=fsdp_strategy())

    # each model its own FSDP root with a unit per decoder layer; the reference stays out of the optimizer
    for model in (grpo.policy, grpo.ref_model):
        assert isinstance(model, FullyShardedDataParallel)
        units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel) and m is not model]
        assert len(units) == 2 and all(any(isinstance(m, Qwen2DecoderLayer) for m in u.modules()) for u in units)
    assert sum(isinstance(m, CheckpointWrapper) for m in grpo.policy.modules()) == 2  # the policy's layers only
    assert not any(isinstance(m, CheckpointWrapper) for m in grpo.ref_model.modules())
    assert not isinstance(trainer.strategy.model, FullyShardedDataParallel)  # the LightningModule is not wrapped
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert optimized == {id(p) for p in grpo.policy.parameters()}
    assert not optimized & {id(p) for p in grpo.ref_model.parameters()}
    assert clipped == [1.0, 1.0]

    # the same steps as without FSDP (one process: nothing is sharded, but every FSDP hook runs)
    plain, _ = fit(fsdp_module(tiny_model_dir), 2, tmp_path / "plain")
    for step in (1, 2):
        torch.testing.assert_close(first[step], plain[step], rtol=1e-4, atol=1e-6)

    # checkpoint: plain parameter names (no FSDP or checkpoint-wrapper prefixes), no reference model
    checkpoint = read_checkpoint(tmp_path / "ckpt" / "step=2.ckpt")
    names = set(checkpoint["state_dict"])
    assert names == {f"policy.{k}" for k in AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()}

    # the gathered policy saves and exports as a Hugging Face model
    grpo.save_pretrained(tmp_path / "saved")
    export_checkpoint(tmp_path / "ckpt" / "step=2.ckpt", tmp_path / "exported")
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "saved")
    torch.testing.assert_close(logits(saved, tokenizer), logits(exported, tokenizer), rtol=0, atol=0)


def test_ppo_under_fsdp_shards_its_critic_with_a_unit_per_layer_and_one_for_the_fp32_head(
    tiny_model_dir, tmp_path
):
    from grpo_lightning.variants import PPO

    ppo = make_module(tiny_model_dir, cls=PPO, policy={"dtype": "bfloat16"})  # bf16 weights beside the fp32 head
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=1)
    steps, trainer = fit(ppo, 1, tmp_path, callbacks=[every], strategy=PolicyFSDPStrategy(mixed_precision="bf16"))
    critic = ppo.value_model
    assert isinstance(critic, FullyShardedDataParallel)
    units = [m.module for m in critic.modules() if isinstance(m, FullyShardedDataParallel) and m is not critic]
    assert sorted(type(u).__name__ for u in units) == ["Qwen2DecoderLayer", "Qwen2DecoderLayer", "ValueHead"]
    assert {id(p) for p in trainer.optimizers[1].param_groups[0]["params"]} == {id(p) for p in critic.parameters()}
    assert torch.isfinite(torch.tensor(steps[1]["value/loss"]))
    names = set(read_checkpoint(tmp_path / "ckpt" / "step=1.ckpt")["state_dict"])
    assert {"value_model.head.weight", "value_model.backbone.norm.weight"} <= names  # plain names, gathered


def test_gathered_fsdp_rollouts_refuse_the_static_cache_engine(tiny_model_dir, tmp_path):
    strategy = PolicyFSDPStrategy(mixed_precision=None, rollout_weights="gather")
    with pytest.raises(ConfigError, match="engine.rollout: .*rollout_weights='gather'"):
        fit(make_module(tiny_model_dir, engine=EngineOptions(rollout="static")), 1, tmp_path, strategy=strategy)


@pytest.fixture
def refreshes(monkeypatch) -> list[int]:
    """One entry per ``RolloutReplica.refresh`` call."""
    calls, refresh = [], RolloutReplica.refresh

    def counting_refresh(self, model):
        calls.append(1)
        refresh(self, model)

    monkeypatch.setattr(RolloutReplica, "refresh", counting_refresh)
    return calls


@pytest.mark.parametrize("fused", [False, True], ids=["", "fused-projections"])
def test_fsdp_rollouts_sample_from_a_replica_refreshed_after_each_step(
    tiny_model_dir, tmp_path, refreshes, fused
):
    """With ``fuse_projections`` the replica's q/k/v and gate/up parameters are views of one buffer
    per layer; the in-place refreshes keep them so (the engine fuses once)."""
    engine = EngineOptions(rollout="static", fuse_projections=fused)
    grpo = make_module(tiny_model_dir, engine=engine, kl={"beta": 0.04}, policy={"dtype": "float32"})
    sharded, _ = fit(grpo, 2, tmp_path / "sharded", strategy=fsdp_strategy())
    assert len(refreshes) == 2  # before the first rollout, and after the first step's update
    with FullyShardedDataParallel.summon_full_params(grpo.policy):
        policy = {k: v.clone() for k, v in grpo.policy.module.state_dict().items()}
    with grpo.rollout_model() as replica:  # refreshed: the second step's update came after
        pass
    assert len(refreshes) == 3
    if fused:  # refreshed in place three times: the views the engine made at the first rollout hold
        layers = grpo.sampler.engine._fused
        assert grpo.sampler.engine.model is replica and layers is not None
        assert all(layer.holds_its_parameters() for layer in layers)
    for name, value in replica.state_dict().items():
        torch.testing.assert_close(value, policy[name.replace("_checkpoint_wrapped_module.", "")], rtol=0, atol=0)
    # the static engine on the replica trains as on the unsharded policy
    static = EngineOptions(rollout="static")
    plain, _ = fit(
        make_module(tiny_model_dir, engine=static, kl={"beta": 0.04}, policy={"dtype": "float32"}),
        2,
        tmp_path / "plain",
    )
    for step in (1, 2):
        torch.testing.assert_close(sharded[step], plain[step], rtol=1e-4, atol=1e-6)


def test_fp32_weights_can_roll_out_from_a_bf16_replica_refreshed_after_each_step(tiny_model_dir, tmp_path, refreshes):
    grpo = make_module(
        tiny_model_dir,
        engine=EngineOptions(rollout="static"),
        policy={"dtype": "float32"},
        sampling={"dtype": "bfloat16"},
    )
    metrics, _ = fit(grpo, 2, tmp_path)
    assert len(refreshes) == 2  # before the first rollout, and after the first step's update
    # The second step's update is newer than the replica: the next rollout refreshes it, once.
    for expected_refreshes in (3, 3):
        with grpo.rollout_model() as model:
            assert model is grpo.rollout_weights.replica.model
        assert len(refreshes) == expected_refreshes
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics[2].values())
    assert next(model.parameters()).dtype == torch.bfloat16
    assert next(grpo.policy.parameters()).dtype == torch.float32
    policy = dict(grpo.policy.named_parameters())
    for name, value in model.named_parameters():
        torch.testing.assert_close(value, policy[name].detach().to(torch.bfloat16), rtol=0, atol=0)


def test_rollout_dtype_is_checked():
    with pytest.raises(ConfigError, match="sampling.dtype"):
        make_module("some/model", sampling={"dtype": "bf16"})


# ---------------------------------------------------------------- two processes


DISTRIBUTED_FIT = """
import json, os, sys
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.evaluation.completions import CompletionLog
from grpo_lightning.rollout.engine.attention import GQA_ATTENTION, grouped_query_attention
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.runtime.strategies import PolicyFSDPStrategy
from grpo_lightning.variants import DAPO, GRPO, PPO

model_dir, out, kind, max_steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ckpt_path = sys.argv[5] if len(sys.argv) > 5 else None


class Record(L.Callback):
    def __init__(self):
        self.prompts, self.steps = [], {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.prompts += batch["prompt"]
        metrics = pl_module.last_step_metrics
        self.steps[trainer.global_step] = {k: float(v) for k, v in metrics.items() if not k.startswith("perf/")}


L.seed_everything(0)
record = Record()
# "keyed": keyed sampling (sampling.seed) on the static engine, FSDP on 2 processes or 1 process with
# the 2 processes' prompts in one batch.
keyed = kind.endswith("-keyed")
devices = 1 if kind.startswith("single") else 2
strategy = {"ddp": "ddp", "ddp-compiled": "ddp"}.get(kind) or ("auto" if devices == 1 else PolicyFSDPStrategy(mixed_precision=None))
trainer = L.Trainer(
    strategy=strategy, accelerator="cpu", devices=devices, max_steps=max_steps, logger=False, enable_progress_bar=False,
    enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=out,
    callbacks=[record, ModelCheckpoint(os.path.join(out, "ckpt"), "{step}", every_n_train_steps=2, save_top_k=-1),
               CompletionLog(max_rows=0, jsonl=os.path.join(out, "completions.jsonl"))],
)
engine = dict(engine=EngineOptions(rollout="static")) if keyed else {}
if kind == "ddp-compiled":  # the log-prob passes through torch.compile
    engine["engine"] = EngineOptions(model_compile=True)
variant = dict(cls=DAPO, max_gen_batches=3) if kind == "fsdp-dapo" else dict(cls=GRPO, kl={"beta": 0.04})
if "ppo" in kind:  # a critic with a rate at which it moves in two steps
    variant = dict(cls=PPO, kl={"beta": 0.04}, value_learning_rate=1e-2)
# Micro-batches of one row: two backward passes per step and rank (DDP syncs only in the last).
module = variant.pop("cls")(model=model_dir, rewards={"funcs": ["tests.helpers.length_parity_reward"]},
                            sampling={"group_size": 2, "max_new_tokens": 6, "seed": 7 if keyed else None},
                            optim={"micro_batch_size": 1, "learning_rate": 1e-3}, policy={"dtype": "float32"},
                            **engine, **variant)
data = ArithmeticDataModule(num_train=16, num_val=4, batch_size=2 * (2 // devices))
trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
module.save_pretrained(os.path.join(out, "saved"))
with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
    json.dump({"prompts": record.prompts, "steps": record.steps, "world": trainer.world_size}, f)
# Leave together: a process that exits with the process group alive can abort in gloo's teardown.
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
# Everything is written: skip the interpreter's teardown, where a thread of the CPU backends left
# running at times aborts the process ("terminate called without an active exception").
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    script: Path, model_dir: str, out: Path, kind: str, max_steps: int, ckpt_path: Path | None = None, processes: int = 2
) -> list[dict]:
    """``processes`` CPU processes (gloo); returns what each rank recorded."""
    args = [model_dir, str(out), kind, str(max_steps)] + ([str(ckpt_path)] if ckpt_path else [])
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port", str(free_port())]
    command = [sys.executable, *launcher, str(script), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(processes)]


def steps(rank: dict, *numbers: int) -> list[dict]:
    return [rank["steps"][str(n)] for n in numbers]


@pytest.fixture(scope="module")
def ddp_run(tiny_model_dir, tmp_path_factory) -> tuple[list[dict], Path]:
    """The eager DDP fit of two steps over two processes, which the compiled and FSDP fits are compared
    with: what each rank recorded, and its output folder (``saved``: the policy after it)."""
    root = tmp_path_factory.mktemp("ddp")
    script = root / "distributed_fit.py"
    script.write_text(DISTRIBUTED_FIT)
    return torchrun(script, tiny_model_dir, root / "ddp", "ddp", 2), root / "ddp"


@pytest.mark.slow
def test_model_compile_under_ddp_trains_like_the_eager_model(tiny_model_dir, tmp_path, ddp_run):
    """``model_compile`` over two CPU processes: every step's metrics, the norm of the averaged
    gradient among them, match the eager DDP run's, so the compiled backward pass still feeds
    DDP's all-reduce (local gradients would give other norms)."""
    script = tmp_path / "distributed_fit.py"
    script.write_text(DISTRIBUTED_FIT)
    eager, _ = ddp_run
    compiled = torchrun(script, tiny_model_dir, tmp_path / "compiled", "ddp-compiled", 2)
    for rank in (0, 1):
        assert compiled[rank]["prompts"] == eager[rank]["prompts"]
        torch.testing.assert_close(steps(compiled[rank], 1, 2), steps(eager[rank], 1, 2), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_fsdp_over_two_cpu_processes_trains_like_ddp_and_resumes_exactly(tiny_model_dir, tmp_path, ddp_run):
    script = tmp_path / "distributed_fit.py"
    script.write_text(DISTRIBUTED_FIT)
    ddp, ddp_dir = ddp_run
    fsdp = torchrun(script, tiny_model_dir, tmp_path / "fsdp", "fsdp", 4)
    resumed = torchrun(script, tiny_model_dir, tmp_path / "resumed", "fsdp", 4, tmp_path / "fsdp" / "ckpt" / "step=2.ckpt")

    for ranks in (ddp, fsdp):
        assert [r["world"] for r in ranks] == [2, 2]
        assert not set(ranks[0]["prompts"]) & set(ranks[1]["prompts"]), "ranks must see different prompts"
    # The JSONL file, which rank 0 writes, holds every process's completions, groups counted over both
    rows = [json.loads(line) for line in (ddp_dir / "completions.jsonl").read_text().splitlines()]
    assert sorted(row["prompt"] for row in rows) == sorted(p for rank in ddp for p in rank["prompts"] for _ in range(2))
    assert sorted(row["group"] for row in rows if row["step"] == 0) == [0, 0, 1, 1, 2, 2, 3, 3]
    for rank in (0, 1):
        # Same prompts, same sampling, same averaged update: the same metrics as DDP.
        assert fsdp[rank]["prompts"][:4] == ddp[rank]["prompts"]
        torch.testing.assert_close(steps(fsdp[rank], 1, 2), steps(ddp[rank], 1, 2), rtol=1e-4, atol=1e-6)
        # Sharded weights and optimizer state, each rank's RNG and data position: an exact resume.
        assert sorted(resumed[rank]["steps"], key=int) == ["3", "4"]
        torch.testing.assert_close(steps(resumed[rank], 3, 4), steps(fsdp[rank], 3, 4), rtol=0, atol=0)

    checkpoint = read_checkpoint(tmp_path / "fsdp" / "ckpt" / "step=2.ckpt")
    assert len(checkpoint["training_state"]) == 2  # one per rank
    assert not any(k.startswith("ref_model.") for k in checkpoint["state_dict"])
    # The gathered policy, written by save_pretrained or exported from the checkpoint, is DDP's.
    export_checkpoint(tmp_path / "fsdp" / "ckpt" / "step=2.ckpt", tmp_path / "exported")
    tokenizer = AutoTokenizer.from_pretrained(ddp_dir / "saved")

    def run_logits(directory: Path) -> torch.Tensor:
        return logits(AutoModelForCausalLM.from_pretrained(directory), tokenizer)

    torch.testing.assert_close(run_logits(tmp_path / "exported"), run_logits(ddp_dir / "saved"), rtol=1e-4, atol=1e-5)
    export_checkpoint(tmp_path / "fsdp" / "ckpt" / "step=4.ckpt", tmp_path / "exported4")
    torch.testing.assert_close(run_logits(tmp_path / "fsdp" / "saved"), run_logits(tmp_path / "exported4"), rtol=0, atol=0)


@pytest.mark.slow
def test_keyed_sampling_makes_two_fsdp_processes_train_like_one_process_with_their_batches(tiny_model_dir, tmp_path):
    """The CPU counterpart of the 1-GPU against 2-GPU comparison of benchmarks/fsdp_scaling.py."""
    script = tmp_path / "distributed_fit.py"
    script.write_text(DISTRIBUTED_FIT)
    two = torchrun(script, tiny_model_dir, tmp_path / "two", "fsdp-keyed", 2)
    (one,) = torchrun(script, tiny_model_dir, tmp_path / "one", "single-keyed", 2, processes=1)
    assert sorted(one["prompts"]) == sorted(two[0]["prompts"] + two[1]["prompts"])
    # Logged metrics are means over both processes' rollouts: the one-process run's, step by step.
    assert steps(two[0], 1, 2) == steps(two[1], 1, 2)
    for step in (1, 2):
        ours, reference = steps(two[0], step)[0], steps(one, step)[0]
        assert ours.keys() == reference.keys()
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_ppo_over_two_fsdp_processes_trains_like_one_process_with_their_batches(tiny_model_dir, tmp_path):
    """The critic is sharded too; its loss and the whitened advantages take every process's tokens,
    so two processes make the one-process run's policy, critic steps included."""
    script = tmp_path / "distributed_fit.py"
    script.write_text(DISTRIBUTED_FIT)
    two = torchrun(script, tiny_model_dir, tmp_path / "two", "fsdp-ppo-keyed", 2)
    (one,) = torchrun(script, tiny_model_dir, tmp_path / "one", "single-ppo-keyed", 2, processes=1)
    assert sorted(one["prompts"]) == sorted(two[0]["prompts"] + two[1]["prompts"])
    for step in (1, 2):
        ours, reference = steps(two[0], step)[0], steps(one, step)[0]
        for name in ("loss", "value/loss", "grad_norm", "value/grad_norm", "kl"):
            torch.testing.assert_close(ours[name], reference[name], rtol=1e-4, atol=1e-6, msg=f"step {step}: {name}")
    assert steps(two[0], 2)[0]["value/loss"] != steps(two[0], 1)[0]["value/loss"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "one" / "saved")
    policies = [logits(AutoModelForCausalLM.from_pretrained(tmp_path / run / "saved"), tokenizer) for run in ("one", "two")]
    torch.testing.assert_close(policies[1], policies[0], rtol=1e-4, atol=1e-5)


def test_dapo_dynamic_sampling_over_two_fsdp_processes_updates_together(tiny_model_dir, tmp_path):
    """Each process keeps its own informative groups; the update needs collectives on both, so they
    must decide together (``min_over_ranks``): the fit ends, with the same logged steps on both."""
    script = tmp_path / "distributed_fit.py"
    script.write_text(DISTRIBUTED_FIT)
    ranks = torchrun(script, tiny_model_dir, tmp_path / "dapo", "fsdp-dapo", 3)
    # Step 0 is recorded after a generation batch that did not fill the batch (no update yet).
    assert sorted(ranks[0]["steps"], key=int) == sorted(ranks[1]["steps"], key=int) == ["0", "1", "2", "3"]
    for step in ("1", "2", "3"):
        assert ranks[0]["steps"][step] == ranks[1]["steps"][step]  # means over both processes
        assert ranks[0]["steps"][step]["dynamic_sampling/gen_batches"] >= 1
    assert len(ranks[0]["prompts"]) == len(ranks[1]["prompts"]) > 3 * 2  # generation batches beyond one a step


def test_an_unsharded_reference_model_gives_the_sharded_ones_results(tiny_model_dir, tmp_path):
    strategy = PolicyFSDPStrategy(mixed_precision=None, reference_weights="unsharded")
    grpo = make_module(tiny_model_dir, kl={"beta": 0.04}, policy={"dtype": "float32"})
    whole, _ = fit(grpo, 2, tmp_path / "whole", strategy=strategy)
    assert isinstance(grpo.policy, FullyShardedDataParallel)
    assert not isinstance(grpo.ref_model, FullyShardedDataParallel)
    assert not any(isinstance(m, FullyShardedDataParallel) for m in grpo.ref_model.modules())
    sharded, _ = fit(
        make_module(tiny_model_dir, kl={"beta": 0.04}, policy={"dtype": "float32"}),
        2,
        tmp_path / "sharded",
        strategy=fsdp_strategy(),
    )
    for step in (1, 2):
        torch.testing.assert_close(whole[step], sharded[step], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="reference_weights"):
        PolicyFSDPStrategy(reference_weights="replica")


def test_an_unsharded_reference_model_computes_in_the_strategys_dtype(tiny_model_dir, tmp_path):
    grpo = make_module(tiny_model_dir, kl={"beta": 0.04}, policy={"dtype": "float32"})
    fit(grpo, 1, tmp_path, strategy=PolicyFSDPStrategy(mixed_precision="bf16", reference_weights="unsharded"))
    assert {p.dtype for p in grpo.ref_model.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in grpo.ref_model.buffers()} == {torch.float32}  # rotary frequencies keep fp32


def test_under_32_true_the_shards_are_float32_whatever_dtype_loaded_them(tiny_model_dir, tmp_path):
    """As the strategy's docstring says and W4's memory breakdown shows: Lightning's FSDP precision
    ``32-true`` casts the module, so a bf16-loaded model trains float32 shards, its reference too."""
    grpo = make_module(tiny_model_dir, kl={"beta": 0.04}, policy={"dtype": "bfloat16"})
    fit(grpo, 1, tmp_path, strategy=PolicyFSDPStrategy(mixed_precision="bf16"))
    assert {p.dtype for p in grpo.policy.parameters()} == {torch.float32}
    assert {p.dtype for p in grpo.ref_model.parameters()} == {torch.float32}


def test_a_replica_has_its_own_config_so_the_engine_switches_its_attention_alone(tiny_model_dir):
    """The engine sets the attention implementation of the model it samples from; on a replica that
    must not reach the policy, whose compiled forwards guard on it (a rollout sampled ahead runs on
    another thread while the policy trains)."""
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    replica = RolloutReplica(policy, torch.bfloat16)
    with grouped_query_attention(replica.model):
        assert replica.model.config._attn_implementation == GQA_ATTENTION
        assert policy.config._attn_implementation == "sdpa"


def test_cpu_offload_on_a_cpu_run_is_a_config_error(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="cpu_offload: .*on CUDA only"):
        fit(make_module(tiny_model_dir), 1, tmp_path, strategy=PolicyFSDPStrategy(mixed_precision=None, cpu_offload=True))
