"""Speed benchmark of one GRPO workload (``WORKLOADS``: W0 to W5) through a real Lightning Trainer.

    python benchmarks/run.py --workload W0 [--compare trl] [--steps 5] [--out result.json]

Builds a random-init model of the workload's shape and a word-level tokenizer of its vocabulary
size, writes ``P`` random prompts of exactly the workload's prompt length, runs ``--steps`` GRPO
steps (``grpo_lightning.variants.GRPO``; ``--variant ppo``: ``grpo_lightning.variants.PPO``, with its
critic, on the same settings; one optimizer step per rollout, every completion exactly
``max_new_tokens`` long, or with ``--stop-lengths lognormal`` (W5's default) each stopped at a drawn
length, ``benchmarks/stop_lengths.py``) and reports, over the steps after the first: the median wall-clock
seconds per step, generated tokens per second, peak GPU memory and the median split between
rollout, scoring, reference/old log-probs and the update. The last line of stdout is one JSON
object with every figure. ``--compare trl`` runs TRL's ``GRPOTrainer`` on the identical workload in
a subprocess (``benchmarks/trl_compare.py``) and adds its figures and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
if str(REPO_ROOT / "benchmarks") not in sys.path:  # this folder's modules (stop_lengths) when imported from elsewhere
    sys.path.append(str(REPO_ROOT / "benchmarks"))

# As a user's command starts: the bytecode cache (grpo_lightning.bytecode) before torch is imported.
from grpo_lightning.bytecode import use_own_bytecode_cache  # noqa: E402
from grpo_lightning.import_pause import collection_paused  # noqa: E402

use_own_bytecode_cache()

with collection_paused():  # as the command line imports them
    import lightning  # noqa: F401
    import torch
    import transformers  # noqa: F401

from grpo_lightning.rollout.engine import DECODE_ATTENTION_KINDS  # noqa: E402
from grpo_lightning.rollout.engine.options import EngineOptions  # noqa: E402
from first_step import KINDS as FIRST_STEP_KINDS  # noqa: E402

#: ``time.time()`` once this process has imported what it needs: the first mark of a first step's phases.
IMPORTS_END_TIME = time.time()

#: The values of an on/off engine flag, as the engine option's.
SWITCH = {"auto": None, "on": True, "off": False}


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """The module's engine options from the command line's flags."""
    switches = {f: SWITCH[getattr(args, f)] for f in ("compile", "fuse_projections", "logprob_compile", "model_compile", "fused_lm_head")}
    return EngineOptions(
        rollout=args.rollout, decode_attention=args.decode_attention, padding_free=args.padding_free, **switches
    )

def micro_batches(args: argparse.Namespace, workload: Workload) -> dict[str, Any]:
    """The module's optim options: one PPO epoch, passes of the workload's rows or of ``--micro-batch-tokens``."""
    if args.micro_batch_tokens is not None:
        return {"ppo_epochs": 1, "micro_batch_size": None, "micro_batch_tokens": args.micro_batch_tokens}
    return {"ppo_epochs": 1, "micro_batch_size": workload.micro_batch_size}


WORKDIR_ENV = "GRPO_BENCH_WORKDIR"  # lets the processes a multi-device launch re-runs reuse rank 0's files
PHASES = ("rollout_s", "score_s", "logprob_s", "values_s", "update_s", "step_s")  # values_s: PPO's critic pass
#: Training metrics recorded per step (means over all devices), for comparing runs step by step.
TRAINING_METRICS = ("loss", "grad_norm", "reward", "reward_std", "kl", "entropy", "completions/mean_length", "clip_ratio/region",
                    "value/loss", "value/explained_variance",  # PPO's critic
                    *(f"sampling/{name}" for name in ("sampling_logp_difference/mean", "sampling_logp_difference/max",
                      "importance_sampling_ratio/min", "importance_sampling_ratio/mean", "importance_sampling_ratio/max")))


@dataclasses.dataclass(frozen=True)
class Workload:
    """One row of WORKLOADS.md: model shape, rollout shape and batch sizes."""

    prompts: int
    group_size: int
    prompt_tokens: int
    max_new_tokens: int
    micro_batch_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    dtype: str
    rope_theta: float = 10000.0
    stop_lengths: str | None = None  # "lognormal": completions stop at drawn lengths (benchmarks/stop_lengths.py)


QWEN25 = dict(vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6, dtype="bfloat16")
WORKLOADS: dict[str, Workload] = {
    "W0": Workload(
        prompts=8, group_size=4, prompt_tokens=16, max_new_tokens=32, micro_batch_size=32,
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
        vocab_size=512, tie_word_embeddings=True, max_position_embeddings=128, dtype="float32",
    ),
    "W1": Workload(  # Qwen2.5-0.5B shape
        prompts=16, group_size=8, prompt_tokens=64, max_new_tokens=256, micro_batch_size=32,
        hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, **QWEN25,
    ),
    "W2": Workload(  # Qwen2.5-1.5B shape
        prompts=32, group_size=8, prompt_tokens=128, max_new_tokens=512, micro_batch_size=32,
        hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960, **QWEN25,
    ),
    "W3": Workload(  # Qwen2.5-7B shape; with --lora-rank 64
        prompts=16, group_size=8, prompt_tokens=256, max_new_tokens=512, micro_batch_size=16,
        hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4, intermediate_size=18944,
        **{**QWEN25, "vocab_size": 152064, "tie_word_embeddings": False},
    ),
}
# W1's model and batch with long completions that stop early, with a long tail: log-normal lengths, median
# 600, 10 % at 2048. Micro-batches of 8: 32 rows of 2112 tokens would hold 20 GB of bf16 logits per copy,
# and TRL's update keeps several copies.
# W3's 7B shape, fully fine-tuned under FSDP (--devices 2|4 --strategy fsdp --activation-checkpointing;
# weak scaling: --prompts 16 x devices). Micro-batches of 4 rows of 768 tokens keep the activations small.
WORKLOADS["W4"] = dataclasses.replace(WORKLOADS["W3"], micro_batch_size=4)
WORKLOADS["W5"] = dataclasses.replace(WORKLOADS["W1"], max_new_tokens=2048, micro_batch_size=8, stop_lengths="lognormal")


def benchmark_reward(prompts: list, completions: list[str], **columns: Any) -> list[float]:
    """Cheap and deterministic: the completion's character count modulo 5, scaled to [0, 1].

    Completions of one prompt differ in characters (words differ in length) though not in tokens,
    so most groups have reward variance and the update does real work.
    """
    return [(len(c) % 5) / 4.0 for c in completions]


# ---------------------------------------------------------------------------------- workload files


def build_workdir(workdir: Path, workload: Workload, rows: int, seed: int) -> dict[str, str]:
    """Write ``model/`` (random weights + tokenizer) and ``prompts/`` (a ``save_to_disk`` dataset
    with columns prompt/answer) into ``workdir``; reuse them when ``spec.json`` matches."""
    shape = {k: v for k, v in dataclasses.asdict(workload).items() if k != "stop_lengths"}  # the files do not depend on it
    spec = {"workload": shape, "rows": rows, "seed": seed, "format": 1}
    paths = {"model": str(workdir / "model"), "prompts": str(workdir / "prompts")}
    spec_file = workdir / "spec.json"
    if spec_file.exists() and json.loads(spec_file.read_text()) == spec:
        return paths
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from grpo_lightning.quickstart.tiny import build_word_level_tokenizer, save_model_and_tokenizer, tiny_config, word_token_ids

    for stale in (spec_file, *map(Path, paths.values())):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_word_level_tokenizer(workload.vocab_size)
    config = tiny_config(
        tokenizer,
        model_type="qwen2",
        hidden_size=workload.hidden_size,
        num_layers=workload.num_layers,
        num_heads=workload.num_heads,
        num_kv_heads=workload.num_kv_heads,
        intermediate_size=workload.intermediate_size,
        max_position_embeddings=workload.max_position_embeddings,
        tie_word_embeddings=workload.tie_word_embeddings,
        rope_theta=workload.rope_theta,
    )
    # Initialising a 1.5B model on the CPU takes minutes; on the GPU, seconds.
    init_device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.random.fork_rng(devices=[]), torch.device(init_device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, workload.dtype))
    save_model_and_tokenizer(model, tokenizer, paths["model"])
    del model

    words = word_token_ids(tokenizer)
    rng = random.Random(seed)
    prompts = [tokenizer.decode([rng.choice(words) for _ in range(workload.prompt_tokens)]) for _ in range(rows)]
    lengths = {len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]}
    if lengths != {workload.prompt_tokens}:
        raise RuntimeError(f"prompts should all be {workload.prompt_tokens} tokens long, got lengths {sorted(lengths)}")
    Dataset.from_dict({"prompt": prompts, "answer": [""] * rows}).save_to_disk(paths["prompts"])
    spec_file.write_text(json.dumps(spec))
    return paths


# ---------------------------------------------------------------------------------- measurement


def _sync() -> None:
    """Wait for the training stream: a rollout sampled ahead on its own stream (``--stale-rollouts
    overlap``) runs on across step boundaries, and a step waits for it where it takes it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()


def make_step_recorder():
    """A Callback recording, per training step, the synchronised wall time and the module's
    ``perf/*`` metrics of that step."""
    import lightning as L

    class StepRecorder(L.Callback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []
            self._start = 0.0
            self.first_step_peak = 0.0
            self.first_step_end_time: float | None = None  # time.time() at the end of the first step
            self.marks: dict[str, float] = {}  # time.time() where the first step's phases end (first_step.PHASES)
            self.memory: dict[str, Any] = {}  # memory_held after the last step (CUDA), or the error it raised

        def on_train_start(self, trainer, pl_module) -> None:
            self.marks["train_start"] = time.time()
            self.threads = torch.get_num_threads()
            self.engine_plan = pl_module.engine_plan  # as resolved for the training device

        def on_train_end(self, trainer, pl_module) -> None:
            try:  # a breakdown that fails must not lose the run's timings
                self.memory = memory_held(pl_module, trainer.optimizers[0])
            except Exception as error:  # noqa: BLE001
                self.memory = {"error": repr(error)}

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            _sync()
            self.marks.setdefault("first_batch_start", time.time())
            self._start = time.perf_counter()
            self._optimizer_steps = trainer.global_step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            _sync()
            wall = time.perf_counter() - self._start
            metrics = pl_module.last_step_metrics  # every step's values (callback_metrics: the logged ones)
            record = {"wall_s": wall}
            if getattr(pl_module, "stale_queue", None) is not None and trainer.global_step == self._optimizer_steps:
                record["filling"] = True  # bounded staleness: a batch that only filled the queue (not DAPO's refills)
            for name in PHASES + ("tokens_per_s", "generated_tokens"):
                value = metrics.get(f"perf/{name}")
                if value is not None:
                    record[name] = float(value)
            for name in TRAINING_METRICS:
                if name in metrics:
                    record[name] = float(metrics[name])
            self.steps.append(record)
            if len(self.steps) == 1:
                self.first_step_end_time = time.time()
                self.first_step_peak = reset_peak_memory()

    return StepRecorder()


def _gib(tensors: Iterable[Any], device_type: str = "cuda") -> float:
    """GiB of the distinct storages behind ``tensors`` on ``device_type`` (views of one buffer count once)."""
    storages = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == device_type:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values()) / 2**30


def _tensors_in(value: Any, depth: int = 3) -> Iterator[Any]:
    """The tensors in ``value``, its lists, dicts and attributes, ``depth`` levels down."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    if depth == 0:
        return
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        items = vars(value).values() if hasattr(value, "__dict__") else ()
    for item in items:
        yield from _tensors_in(item, depth - 1)


def memory_held(module: Any, optimizer: Any, device_type: str | None = None) -> dict[str, float]:
    """GiB this process holds on the GPU (``device_type``) after its last step, by owner; on CUDA also
    what is allocated then and the peak of steps 2..N: the part of the peak held between steps, and
    the part only a step needs. Empty without CUDA unless ``device_type`` is given."""
    device_type = device_type or ("cuda" if torch.cuda.is_available() else None)
    if device_type is None:
        return {}
    parameters = list(module.policy.parameters())
    replica = getattr(module.rollout_weights, "replica", None)
    engines = [engine for sampler in module._samplers.values() for engine in sampler.engines.values()]

    def gib(tensors: Iterable[Any]) -> float:
        return _gib(tensors, device_type)

    held = {
        "policy_parameters": gib(parameters),
        "policy_gradients": gib(p.grad for p in parameters),
        "optimizer_state": gib(v for state in optimizer.state.values() for v in state.values()),
        "reference_parameters": gib(module.ref_model.parameters()) if module.ref_model is not None else 0.0,
        "rollout_replica": gib(replica.model.parameters()) if replica is not None else 0.0,
        "rollout_kv_cache": gib(t for engine in engines for t in _tensors_in(engine._cache)),
    }
    if device_type == "cuda":
        held["allocated"] = torch.cuda.memory_allocated() / 2**30
        held["peak_steps_2_on"] = torch.cuda.max_memory_allocated() / 2**30
    return held


def reset_peak_memory() -> float:
    """Peak GPU memory so far (GiB; 0 without CUDA), then start counting anew: called after the
    first step, so that the peak of the steps after it (compilation and warm-up done) is known too."""
    if not torch.cuda.is_available():
        return 0.0
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def tf32_flags() -> dict[str, Any]:
    """The settings that let fp32 matrix products run in TF32 on the GPU."""
    return {
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }


def gradient_stats(policy: torch.nn.Module, compute: bool) -> dict[str, dict[str, float]] | None:
    """Per parameter of ``policy``, by plain name: the squared L2 norm of its whole gradient
    (``sq_norm``) and the gradient's dot product with a fixed probe (``probe_dot``: normal entries
    of the parameter's shape, drawn on the CPU in fp32 from a generator seeded with the CRC32 of the
    name). Under FSDP every process must call it (the gradients are gathered on rank 0); processes
    with ``compute`` False get None."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    from grpo_lightning.runtime.strategies import _plain_name, is_sharded

    gathered = contextlib.nullcontext()
    if is_sharded(policy):
        gathered = FullyShardedDataParallel.summon_full_params(policy, writeback=False, rank0_only=True, with_grads=True)
    with torch.no_grad(), gathered:
        if not compute:
            return None
        names, values = [], []
        for name, parameter in policy.named_parameters():
            if parameter.grad is None:
                continue
            name = _plain_name(name)
            grad = parameter.grad.detach().float().flatten()
            generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            probe = torch.randn(parameter.grad.shape, generator=generator, dtype=torch.float32).flatten()
            names.append(name)
            values.append(torch.stack([grad.dot(grad), grad.dot(probe.to(grad.device))]))
        values = torch.stack(values).double().cpu().tolist() if values else []  # one device sync
    return {name: {"sq_norm": sq_norm, "probe_dot": dot} for name, (sq_norm, dot) in zip(names, values)}


def make_first_step_dump(directory: Path):
    """A Callback writing ``directory/rank{r}.pt`` (``torch.save``) for the first training step.

    Each process writes its rollout's rows (``rows``: prompt text and completion token ids under
    the completion mask); rank 0 adds ``grads`` (:func:`gradient_stats` of the policy, taken before
    the module clips the gradients, by wrapping the instance's ``clip_and_log_gradient_norm``;
    without that method, at ``on_before_optimizer_step``) and every file the TF32 settings. The
    rollout is caught by wrapping the instance's ``generate``; rows are read and the file written
    after the step's timing, and both wrappers removed.
    """
    import lightning as L

    class FirstStepDump(L.Callback):
        def __init__(self) -> None:
            self.rollout: tuple | None = None
            self.grads: dict[str, dict[str, float]] | None = None
            self.grads_at: str | None = None
            self.wrapped: list[str] = []
            self.done = False

        def wrap(self, pl_module, name: str, function) -> None:
            if name not in vars(pl_module):  # only methods of the class, which removing the wrapper restores
                setattr(pl_module, name, function)
                self.wrapped.append(name)

        def take_grads(self, trainer, pl_module, at: str) -> None:
            self.grads = gradient_stats(pl_module.policy, trainer.is_global_zero)
            self.grads_at = at

        def on_train_start(self, trainer, pl_module) -> None:
            generate = pl_module.generate

            def generate_and_keep(*args, **kwargs):
                rollout = generate(*args, **kwargs)
                if self.rollout is None and trainer.training:
                    self.rollout = (list(rollout.prompts), rollout.completion_ids.clone(), rollout.completion_mask.clone())
                return rollout

            self.wrap(pl_module, "generate", generate_and_keep)
            clip = getattr(pl_module, "clip_and_log_gradient_norm", None)
            if clip is not None:

                def stats_then_clip(*args, **kwargs):
                    if self.grads_at is None:
                        self.take_grads(trainer, pl_module, "before clipping")
                    return clip(*args, **kwargs)

                self.wrap(pl_module, "clip_and_log_gradient_norm", stats_then_clip)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            if not self.done and self.grads_at is None:
                self.take_grads(trainer, pl_module, "on_before_optimizer_step")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if self.done:
                return
            self.done = True
            for name in self.wrapped:
                delattr(pl_module, name)
            rows = []
            if self.rollout is not None:
                prompts, ids, mask = self.rollout
                ids, mask = ids.cpu(), mask.cpu().bool()
                for index, prompt in enumerate(prompts):
                    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
                    rows.append({"prompt": text, "completion": ids[index][mask[index]].tolist()})
            dump = {
                "rank": trainer.global_rank, "world_size": trainer.world_size, "rows": rows, "grads": self.grads,
                "grads_at": self.grads_at, "max_grad_norm": pl_module.optim_options.max_grad_norm, "tf32": tf32_flags(),
            }  # fmt: skip
            directory.mkdir(parents=True, exist_ok=True)
            torch.save(dump, directory / f"rank{trainer.global_rank}.pt")
            self.rollout = None

    return FirstStepDump()


def make_step_profiler(step: int, trace: str | None = None):
    """A Callback profiling training step ``step`` (counted from 1) on rank 0 with
    ``torch.profiler`` (CPU, and CUDA when the module runs there); its events are in ``.events``
    after it, and ``.on_cuda`` says whether they hold the GPU's.
    ``trace``: also write the step's Chrome trace there (gzipped when it ends in ``.gz``)."""
    import lightning as L
    from torch.profiler import ProfilerActivity, profile

    class StepProfiler(L.Callback):
        def __init__(self) -> None:
            self.seen = 0
            self.profiler = None
            self.events = None
            self.on_cuda = False

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.seen += 1
            if self.seen == step and trainer.is_global_zero:
                self.on_cuda = pl_module.device.type == "cuda"
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_cuda else [])
                self.profiler = profile(activities=activities)
                self.profiler.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if self.profiler is not None:
                _sync()
                self.profiler.__exit__(None, None, None)
                if trace:
                    self.profiler.export_chrome_trace(trace)
                self.events = self.profiler.events()
                self.profiler = None

    return StepProfiler()


def profile_report(events, step: int, cuda: bool) -> tuple[str, dict[str, Any]]:
    """The text tables and their JSON summary of a profiled step: the ops by self device time (by
    self CPU time when ``cuda`` is false), 40 in the table and 15 in the JSON; then the module's ``grpo.*``
    ``record_function`` ranges by total device time: the time of the kernels that ran inside each
    range's span on the GPU (without CUDA: its CPU time), with that span and its host time."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList

    self_key, total_key = ("self_device_time_total", "device_time_total") if cuda else ("self_cpu_time_total", "cpu_time_total")
    averages = events.key_averages()
    # A range also has a GPU-side copy spanning its kernels: not an op of its own.
    ops = EventList(
        [e for e in averages if e.device_type == DeviceType.CPU or not getattr(e, "is_user_annotation", False)],
        use_device=getattr(averages, "_use_device", None),
    )
    text = ops.table(sort_by=self_key, row_limit=40)
    top = sorted(ops, key=lambda e: getattr(e, self_key), reverse=True)[:15]

    kernels = [e for e in events if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)]
    ranges: dict[str, dict[str, Any]] = {}
    for e in events:
        if not e.name.startswith("grpo."):
            continue
        row = ranges.setdefault(e.name, {"name": e.name, "calls": 0, "total_ms": 0.0, "device_span_ms": 0.0, "cpu_total_ms": 0.0})
        if e.device_type == DeviceType.CPU:
            row["calls"] += 1
            row["cpu_total_ms"] += e.cpu_time_total / 1e3
        else:
            span = e.time_range
            inside = (k.time_range for k in kernels if span.start <= k.time_range.start and k.time_range.end <= span.end)
            row["device_span_ms"] += span.elapsed_us() / 1e3
            row["total_ms"] += sum(k.elapsed_us() for k in inside) / 1e3
    if not cuda:
        for row in ranges.values():
            row["total_ms"] = row["cpu_total_ms"]
    ranges_sorted = sorted(ranges.values(), key=lambda r: r["total_ms"], reverse=True)
    if ranges_sorted:
        total = "total (kernels in span)" if cuda else "total (CPU)"
        lines = [f"{'grpo.* range':<16} {'calls':>6} {total + ' ms':>28} {'device span ms':>15} {'CPU total ms':>13}"]
        lines += [f"{r['name']:<16} {r['calls']:>6} {r['total_ms']:>28.3f} {r['device_span_ms']:>15.3f} {r['cpu_total_ms']:>13.3f}"
                  for r in ranges_sorted]  # fmt: skip
        text += "\n" + "\n".join(lines) + "\n"

    def op(e) -> dict[str, Any]:
        return {"name": e.key, "calls": e.count, "self_ms": getattr(e, self_key) / 1e3, "total_ms": getattr(e, total_key) / 1e3}

    return text, {"step": step, "sort_by": self_key, "top_ops": [op(e) for e in top], "ranges": ranges_sorted}


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(steps: list[dict[str, float]], tokens_per_step: int, world_size: int) -> dict[str, Any]:
    """Medians over the steps after the first (the first one pays for warm-up), other than a profiled
    one (``--profile-step``: the profiler slows it down) and those that only filled the queue of stale
    rollouts (``--max-staleness``: sampled, not trained)."""
    timed = [s for s in steps[1:] if not s.get("profiled") and not s.get("filling")] or steps[1:] or steps
    step_s = median([s["wall_s"] for s in timed])
    phases = {}
    for name in PHASES:
        values = [s[name] for s in timed if name in s]
        if values:
            phases[name] = median(values)
    total_tokens = tokens_per_step * world_size
    rollout = phases.get("rollout_s")
    return {
        "median_step_s": step_s,
        "step_s": [s["wall_s"] for s in steps],
        "tokens_per_step": total_tokens,
        "tokens_per_s": total_tokens / step_s if step_s else None,
        "tokens_per_s_per_device": tokens_per_step / step_s if step_s else None,
        "rollout_tokens_per_s": total_tokens / rollout if rollout else None,
        "phases": phases,
    }


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def git_commit() -> tuple[str | None, bool | None]:
    if os.environ.get("GRPO_BENCH_COMMIT"):
        return os.environ["GRPO_BENCH_COMMIT"], None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        )
        return head.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return None, None


def versions() -> dict[str, str]:
    import lightning
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "lightning": lightning.__version__}


# ---------------------------------------------------------------------------------- runs


def make_strategy(args: argparse.Namespace):
    """``fsdp`` is the project's own FSDP strategy (policy and reference sharded per decoder layer)."""
    if args.strategy == "fsdp":
        from grpo_lightning.runtime.strategies import PolicyFSDPStrategy

        return PolicyFSDPStrategy(
            mixed_precision=None if args.mixed_precision == "none" else args.mixed_precision,
            rollout_weights=args.rollout_weights,
            reference_weights=args.reference_weights,
            sharding_strategy=args.sharding_strategy,
            activation_checkpointing=args.activation_checkpointing,
            cpu_offload=args.cpu_offload,
        )
    return args.strategy


def lora_settings(rank: int | None) -> dict[str, Any] | None:
    """The LoRA adapters of ``--lora-rank``, the same for both frameworks: every linear layer, alpha = 2 r."""
    return None if rank is None else {"r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "target_modules": "all-linear"}


def run_ours(args: argparse.Namespace, workload: Workload, paths: dict[str, str], dtype: str, precision: str) -> dict[str, Any]:
    import lightning as L

    from grpo_lightning.data import PromptDataModule
    from grpo_lightning.variants import GRPO, PPO

    L.seed_everything(args.seed, verbose=False)
    recorder = make_step_recorder()
    callbacks = [recorder]  # the others after it: their work at a step's end is outside its timing
    if args.dump_first_step:
        callbacks.append(make_first_step_dump(Path(args.dump_first_step)))
    profiler = make_step_profiler(args.profile_step, args.profile_trace) if args.profile_step else None
    if profiler is not None:
        callbacks.append(profiler)
    if args.stale_rollouts != "off" or args.max_staleness > 1:
        from grpo_lightning.rollout.stale import StaleRollouts

        callbacks.append(StaleRollouts(overlap=args.stale_rollouts == "overlap", max_staleness=args.max_staleness,
                                       partial_rollouts=args.partial_rollouts))  # fmt: skip
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=make_strategy(args),
        precision=precision,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
        default_root_dir=str(Path(paths["model"]).parent),
    )
    if workload.prompts % trainer.world_size:
        raise SystemExit(f"{workload.prompts} prompts per step do not split over {trainer.world_size} devices")
    module = {"grpo": GRPO, "ppo": PPO}[args.variant](
        model=paths["model"],
        policy={
            "dtype": dtype,
            "peft_config": lora_settings(args.lora_rank),
            "gradient_checkpointing": args.gradient_checkpointing,
        },
        rewards={"funcs": [benchmark_reward]},
        sampling={
            "group_size": workload.group_size,
            "max_new_tokens": workload.max_new_tokens,
            "temperature": 1.0,
            # Random weights almost never sample EOS; forcing full length makes it so on every framework
            # (with stop lengths the forcing is theirs).
            "min_new_tokens": 0 if workload.stop_lengths else workload.max_new_tokens,
            "seed": args.rollout_seed,
            "dtype": args.rollout_dtype,
            # configs/rollout/one_step_stale.yaml; bounded_staleness.yaml
            "correction": "m2po" if args.max_staleness > 1 else "token_truncate" if args.stale_rollouts != "off" else None,
        },
        kl={"beta": 0.04},
        optim=micro_batches(args, workload),
        engine=engine_options(args),
    )
    data = PromptDataModule(
        path=paths["prompts"], val_split=None, batch_size=workload.prompts // trainer.world_size, seed=args.seed
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    forced, undo = None, None
    if workload.stop_lengths:
        from stop_lengths import install_forced_stops, length_summary

        forced, undo = install_forced_stops(workload.max_new_tokens, args.seed)
    recorder.marks["fit_called"] = time.time()
    try:
        trainer.fit(module, data)
    finally:
        if undo is not None:
            undo()
    if forced is not None and len(forced.lengths) < args.steps:
        raise SystemExit(f"stop lengths: {len(forced.lengths)} rollouts went through the static engine, not {args.steps}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Every process ends the process group once all have trained: left to the interpreter's exit,
        # gloo's threads at times aborted a CPU run ("terminate called without an active exception").
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    if not trainer.is_global_zero:
        sys.exit(0)  # processes other than rank 0 only train
    profile = None
    if profiler is not None and profiler.events is not None:
        recorder.steps[args.profile_step - 1]["profiled"] = True
        text, profile = profile_report(profiler.events, args.profile_step, profiler.on_cuda)
        if args.out:
            Path(args.out).with_suffix(".profile.txt").write_text(text + "\n")
        else:
            print(text, flush=True)
    tokens_per_step = workload.prompts // trainer.world_size * workload.group_size * workload.max_new_tokens
    if forced is not None:  # the drawn lengths of the timed steps (2..N)
        tokens_per_step = length_summary(forced.lengths[1:] or forced.lengths, workload.max_new_tokens)["tokens_per_rollout"]
    result = summarize(recorder.steps, tokens_per_step, trainer.world_size)
    if forced is not None:
        result["stop_lengths"] = stop_length_report(forced, recorder.steps)
    if profile is not None:
        result["profile"] = profile
    result["steps_detail"] = recorder.steps
    later_peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    result["peak_mem_gib"] = max(recorder.first_step_peak, later_peak)
    result["steady_peak_mem_gib"] = later_peak if len(recorder.steps) > 1 else None  # steps 2..N
    result["memory_held_gib"] = recorder.memory
    result["world_size"] = trainer.world_size
    plan = dataclasses.asdict(recorder.engine_plan)
    result["engine_resolved"] = {k: v for k, v in plan.items() if k not in ("notes", "warnings", "record")}
    result["strategy"] = type(trainer.strategy).__name__
    result["precision"] = precision
    result["dtype"] = dtype
    result["torch_threads"] = recorder.threads
    result["first_step_end_time"] = recorder.first_step_end_time
    result["first_step_marks"] = {"imports_end": IMPORTS_END_TIME, **recorder.marks}
    return result


def stop_length_report(forced, steps: list[dict[str, float]]) -> dict[str, Any]:
    """The forced stops' figures: the drawn lengths, the mean length the run produced (its logged
    ``completions/mean_length``, mean over steps) and the decode-time profile."""
    produced = [s["completions/mean_length"] for s in steps if "completions/mean_length" in s]
    return {"mean_completion_length": statistics.mean(produced) if produced else None, **forced.summary()}


def run_trl(args: argparse.Namespace, workload: Workload, paths: dict[str, str], dtype: str,
            kinds: tuple[str, ...] = (), cache_root: Path | None = None) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same files, in its own process (its own peak-memory counter) on empty
    compile caches under ``cache_root``: its first step from the process's start is ``first_step_s``;
    with ``"warm"`` in ``kinds`` a second process of one step on those caches gives ``first_step_warm_s``."""
    command = [
        sys.executable, str(Path(__file__).with_name("trl_compare.py")),
        "--model", paths["model"], "--prompts", paths["prompts"],
        "--num-prompts", str(workload.prompts), "--group-size", str(workload.group_size),
        "--max-new-tokens", str(workload.max_new_tokens), "--micro-batch-size", str(workload.micro_batch_size),
        "--steps", str(args.trl_steps or args.steps), "--dtype", dtype, "--seed", str(args.seed), "--beta", "0.04",
    ]
    if args.accelerator == "cpu" or not torch.cuda.is_available():
        command.append("--cpu")
    if args.lora_rank is not None:
        command += ["--lora-rank", str(args.lora_rank)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if workload.stop_lengths:
        command += ["--stop-lengths", workload.stop_lengths]
    from first_step import cache_env, first_step_s, timed_process

    result, launched = timed_process(command, cache_env(cache_root) if kinds else dict(os.environ))
    end = result.pop("first_step_end_time")
    if "cold" in kinds:  # a new process, on empty compile caches
        result["first_step_s"] = end - launched
    if "warm" in kinds:
        steps = command.index("--steps") + 1
        warm, launched = timed_process([*command[:steps], "1", *command[steps + 1:]], cache_env(cache_root))
        result["first_step_warm_s"] = first_step_s(warm, launched)
    return result


def print_table(result: dict[str, Any]) -> None:
    columns = ("wall_s",) + tuple(name for name in PHASES if name in result["phases"])
    print()
    print(f"{result['workload']} on {result['world_size']} x {result['device']}  ({result['dtype']} weights, "
          f"precision {result['precision']}, {result['strategy']}, {result['torch_threads']} CPU threads)")
    print("engine: " + ", ".join(f"{k} {v}" for k, v in result.get("engine_resolved", {}).items()))
    print("step " + " ".join(f"{c:>10}" for c in columns))
    for index, step in enumerate(result["steps_detail"], start=1):
        print(f"{index:>4} " + " ".join(f"{step.get(c, float('nan')):>10.3f}" for c in columns))
    phases = result["phases"]
    skipped = f", not {result['profile']['step']} (profiled)" if "profile" in result else ""
    print("med  " + " ".join(f"{(result['median_step_s'] if c == 'wall_s' else phases.get(c, float('nan'))):>10.3f}" for c in columns)
          + f"   (median of steps 2..{skipped})")
    steady = result.get("steady_peak_mem_gib")
    print(f"generated tokens/s: {result['tokens_per_s']:.1f}   peak GPU memory: {result['peak_mem_gib']:.2f} GiB"
          + (f" (steps 2..: {steady:.2f} GiB)" if steady is not None else ""))
    if result.get("memory_held_gib"):
        print("GPU memory after the last step, GiB: " + ", ".join(f"{k} {v}" if isinstance(v, str) else f"{k} {v:.2f}"
                                                                  for k, v in result["memory_held_gib"].items()))
    if "first_step_s" in result:
        line = f"first step from process start: ours {result['first_step_s']:.1f} s cold"
        line += f", {result['first_step_warm_s']:.1f} s warm" if "first_step_warm_s" in result else ""
        for kind in ("cold", "warm"):
            if f"first_step_{kind}_phases" in result:
                phases = ", ".join(f"{k} {v:.1f}" for k, v in result[f"first_step_{kind}_phases"].items())
                line += f" ({kind}: {phases})"
        trl = result.get("trl", {})
        if "first_step_s" in trl:
            line += f"; TRL {trl['first_step_s']:.1f} s cold"
            line += f", {trl['first_step_warm_s']:.1f} s warm" if "first_step_warm_s" in trl else ""
        print(line)
    if "stop_lengths" in result:
        print_stop_lengths(result)
    if "trl" in result:
        trl = result["trl"]
        print(f"TRL {trl['version']}: median step {trl['median_step_s']:.3f} s, peak GPU memory {trl['peak_mem_gib']:.2f} GiB "
              f"(steps 2..: {trl.get('steady_peak_mem_gib') or 0:.2f} GiB), "
              f"phases {json.dumps({k: round(v, 3) for k, v in trl.get('phases', {}).items()})}")
        print(f"speedup (TRL / ours): {result['speedup']:.2f}x")
    print(flush=True)


def print_stop_lengths(result: dict[str, Any]) -> None:
    """The forced stops: drawn and produced mean lengths, and ms per decode step as rows finish."""
    ours, trl = result["stop_lengths"], result.get("trl", {}).get("stop_lengths")
    drawn = ours["drawn"]
    line = (f"stop lengths: drawn mean {drawn['mean_length']:.1f} ({100 * drawn['at_limit']:.0f}% at the limit), "
            f"produced mean: ours {ours['mean_completion_length']:.1f} ({ours['rows_off']} of {ours['rows']} rows off)")
    if trl is not None:
        line += (f", TRL {trl['mean_completion_length']:.1f} ({trl['rows_off']} of {trl['rows']} rows off; "
                 f"drawn for its steps {trl['drawn']['mean_length']:.1f})")
    print(line)
    bucket = ours["bucket_steps"]
    print(f"decode ms/step by steps ({bucket} a bucket; rollouts after the first):")
    print(f"{'steps':>11} {'rows running':>13} {'ours':>8}" + (f" {'TRL':>8}" if trl else ""))
    for j, ms in enumerate(ours["decode_ms_per_step"]):
        running = ours["rows_running"][j] if j < len(ours["rows_running"]) else float("nan")
        theirs = trl["decode_ms_per_step"] if trl else []
        other = f" {theirs[j]:>8.3f}" if j < len(theirs) else (f" {'-':>8}" if trl else "")
        print(f"{j * bucket + 1:>5}-{(j + 1) * bucket:<5} {running:>13.1f} {ms:>8.3f}" + other)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--steps", type=int, default=5, help="training steps; medians skip the first")
    parser.add_argument("--compare", choices=["trl"], default=None, help="also run TRL's GRPOTrainer on the same workload")
    parser.add_argument("--trl-steps", type=int, default=None, help="TRL's steps (default --steps; medians skip the first)")
    parser.add_argument("--variant", choices=["grpo", "ppo"], default="grpo",
                        help="the module: GRPO, or PPO with a critic (same workload and settings; recorded in the JSON)")
    parser.add_argument("--lora-rank", type=int, default=None,
                        help="train LoRA adapters of this rank on every linear layer (alpha 2 r), ours and TRL's")
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--devices", default="1", help="Trainer devices (W2: 2 with --strategy fsdp)")
    parser.add_argument("--strategy", default="auto", help="Trainer strategy, e.g. fsdp or ddp")
    parser.add_argument("--dtype", default=None, help="weights dtype (default: the workload's on GPU, float32 on CPU)")
    parser.add_argument("--precision", default=None, help="Trainer precision (default 32-true: the weights stay in --dtype)")
    parser.add_argument("--workdir", default=None, help="keep the model and prompts here and reuse them (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    # The module's engine options (--model.engine.*); "auto" leaves one to the module's choice for
    # the device, which is what a run without any of these flags measures.
    parser.add_argument(
        "--rollout", "--rollout-engine", choices=["auto", "static", "hf"], default="auto", help="engine.rollout"
    )
    parser.add_argument(
        "--rollout-seed", type=int, default=None,
        help="the module's rollout_seed: keyed sampling, the same completions on any number of devices",
    )
    parser.add_argument(
        "--mixed-precision", choices=["bf16", "none"], default="bf16",
        help="with --strategy fsdp: compute dtype of the gathered weights (none: the weights' dtype)",
    )
    parser.add_argument("--reference-weights", choices=["sharded", "unsharded"], default="sharded",
                        help="with --strategy fsdp: shard the reference model, or keep a whole copy per device")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="the module's gradient_checkpointing: larger micro-batches fit (W3: 16 ran out of memory without)")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="with --strategy fsdp: recompute the policy's decoder layers in the backward pass (W4)")
    parser.add_argument("--cpu-offload", action="store_true",
                        help="with --strategy fsdp: keep sharded parameters and gradients in CPU memory")
    parser.add_argument("--sharding-strategy", default="FULL_SHARD", help="with --strategy fsdp: e.g. SHARD_GRAD_OP")
    for flag, field in (
        ("--compile", "compile"),
        ("--fuse-projections", "fuse_projections"),
        ("--logprob-compile", "logprob_compile"),
        ("--model-compile", "model_compile"),
        ("--fused-lm-head", "fused_lm_head"),
    ):
        aliases = ["--rollout-compile"] if field == "compile" else []
        parser.add_argument(
            flag, *aliases, dest=field, nargs="?", const="on", choices=list(SWITCH), default="auto",
            help=f"engine.{field} (auto: the module's choice; the flag alone: on)",
        )  # fmt: skip
    parser.add_argument("--decode-attention", choices=list(DECODE_ATTENTION_KINDS), default="auto", help="engine.decode_attention")
    parser.add_argument("--padding-free", action="store_true", help="engine.padding_free")
    parser.add_argument(
        "--stale-rollouts", choices=["off", "stale", "overlap"], default="off",
        help="one-step-stale rollouts (configs/rollout/one_step_stale.yaml): sampled in turn (stale), or the next "
        "batch's while the current one trains (overlap)",
    )
    parser.add_argument("--max-staleness", type=int, default=1,
                        help="rollouts up to K updates stale, sampled in turn (StaleRollouts(max_staleness=K), as "
                        "configs/rollout/bounded_staleness.yaml, with the M2PO correction for its old log-prob pass); "
                        "the first K batches only sample")  # fmt: skip
    parser.add_argument("--partial-rollouts", action="store_true",
                        help="with --max-staleness K > 1: each completion sampled in K chunks across the updates")
    parser.add_argument("--rollout-dtype", default=None, help="the module's rollout_dtype, e.g. bfloat16 with --dtype float32")
    parser.add_argument(
        "--rollout-weights", choices=["replica", "gather"], default="replica",
        help="with --strategy fsdp: sample from an unsharded replica, or gather layers at each token",
    )
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch CPU threads, for this run and TRL's (default: torch's). On a CPU shared with other "
        "processes, 1 avoids threads waiting on each other and gives steadier figures",
    )
    parser.add_argument(
        "--dump-first-step", default=None, metavar="DIR",
        help="write DIR/rank{r}.pt: the first step's completions and (rank 0) per-parameter gradient statistics",
    )
    parser.add_argument(
        "--profile-step", type=int, default=None, metavar="K",
        help="profile step K (>= 2; left out of the medians): a table beside --out (<stem>.profile.txt), "
        "or on stdout, and the top ops in the JSON under 'profile'",
    )
    parser.add_argument(
        "--profile-trace", default=None, metavar="PATH",
        help="with --profile-step: also write that step's Chrome trace to PATH (.json, or .json.gz)",
    )
    parser.add_argument(
        "--first-step", choices=list(FIRST_STEP_KINDS), default="both",
        help="first_step_s: seconds from a new process's start to the end of its first optimizer step, ours and "
        "TRL's, on empty compile caches (cold) and then on the caches that filled (warm; both: cold and warm), "
        "each in its own process; one device only",
    )
    parser.add_argument("--first-step-child", action="store_true", help=argparse.SUPPRESS)  # one step on the parent's files
    scale = parser.add_argument_group("workload overrides (smaller runs, e.g. tests; the result records them)")
    for name in ("prompts", "group_size", "prompt_tokens", "max_new_tokens", "micro_batch_size"):
        scale.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, dest=name)
    scale.add_argument(
        "--micro-batch-tokens", type=int, default=None,
        help="optim.micro_batch_tokens instead of the rows of --micro-batch-size: a token budget per pass "
        "(packed with --padding-free); ours only",
    )
    scale.add_argument(
        "--stop-lengths", choices=["lognormal", "none"], default=None,
        help="lognormal: each completion stops at a drawn length, median max-new-tokens x 600/2048, 10%% at the "
        "limit (W5's default; benchmarks/stop_lengths.py); needs the static engine and one device",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.profile_step is not None and not 2 <= args.profile_step <= args.steps:
        parser.error("--profile-step must be between 2 and --steps (the first step pays for warm-up)")
    if args.profile_trace and args.profile_step is None:
        parser.error("--profile-trace needs --profile-step")
    args.devices = int(args.devices) if args.devices.isdigit() else args.devices
    if args.compare == "trl" and args.variant != "grpo":
        parser.error("--compare trl runs TRL's GRPO: compare --variant ppo with --variant grpo instead")
    if args.compare == "trl" and args.micro_batch_tokens is not None:
        parser.error("--micro-batch-tokens is ours only: TRL's side runs --micro-batch-size rows a pass")
    if not 1 <= args.max_staleness <= 16:
        parser.error("--max-staleness must be from 1 (synchronous) to 16")
    if args.max_staleness > 1 and args.stale_rollouts != "off":
        parser.error("--max-staleness K > 1 samples in turn: leave out --stale-rollouts (one-step staleness)")
    if args.partial_rollouts and args.max_staleness < 2:
        parser.error("--partial-rollouts continues completions across updates: give --max-staleness 2 or more")
    if args.compare == "trl" and args.devices not in (1, "1"):
        parser.error("--compare trl runs on one device: use --devices 1 (compare multi-device runs with the 1-device one)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    workload = WORKLOADS[args.workload]
    overrides = {k: getattr(args, k) for k in ("prompts", "group_size", "prompt_tokens", "max_new_tokens", "micro_batch_size")}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if args.stop_lengths is not None:
        overrides["stop_lengths"] = None if args.stop_lengths == "none" else args.stop_lengths
    workload = dataclasses.replace(workload, **overrides)
    on_gpu = torch.cuda.is_available() and args.accelerator not in ("cpu",)
    if workload.stop_lengths and (args.rollout == "hf" or (args.rollout == "auto" and not on_gpu)):
        raise SystemExit("--stop-lengths forces stops in the static engine: pass --rollout static (a CPU's default is hf)")
    if workload.stop_lengths and args.devices not in (1, "1"):
        raise SystemExit("--stop-lengths runs on one device: use --devices 1")
    dtype = args.dtype or (workload.dtype if on_gpu else "float32")
    # The weights are loaded in `dtype`; "32-true" leaves them so and keeps float32 the default dtype
    # for the module's own tensors (under "bf16-true" its step metrics would be rounded to bf16).
    precision = args.precision or "32-true"

    if args.first_step_child:
        return first_step_child(args, workload, dtype, precision)

    created = caches = None
    workdir = args.workdir or os.environ.get(WORKDIR_ENV)
    if workdir is None:
        workdir = created = tempfile.mkdtemp(prefix=f"grpo-bench-{args.workload}-")
    os.environ[WORKDIR_ENV] = workdir
    try:
        build_start = time.perf_counter()
        paths = build_workdir(Path(workdir), dataclasses.replace(workload, dtype=dtype), rows=workload.prompts * (args.steps + (args.max_staleness if args.max_staleness > 1 else 0)), seed=args.seed)
        build_s = time.perf_counter() - build_start

        result: dict[str, Any] = {"workload": args.workload, "variant": args.variant, "lora": lora_settings(args.lora_rank), "engine": dataclasses.asdict(engine_options(args)), "rollout_dtype": args.rollout_dtype, "device": device_name(), **versions()}
        result["commit"], result["dirty"] = git_commit()
        result["date"] = time.strftime("%Y-%m-%d")
        result["command"] = " ".join(["python", "benchmarks/run.py", *(sys.argv[1:] if argv is None else argv)])
        result["shape"] = {k: v for k, v in dataclasses.asdict(workload).items()}
        result["overrides"] = overrides
        result["micro_batch_tokens"] = args.micro_batch_tokens
        result["max_staleness"], result["partial_rollouts"] = args.max_staleness, args.partial_rollouts
        result["steps"] = args.steps
        result["build_s"] = build_s
        result.update(run_ours(args, workload, paths, dtype, precision))
        result.pop("first_step_end_time")  # this process also built the files: its first step is not a user's
        result.pop("first_step_marks")
        kinds = FIRST_STEP_KINDS[args.first_step] if args.devices in (1, "1") else ()
        caches = Path(tempfile.mkdtemp(prefix="grpo-bench-caches-"))
        if kinds:
            from first_step import measure_ours

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            result.update(measure_ours(sys.argv[1:] if argv is None else list(argv), workdir, kinds, caches / "ours"))
        if args.out:  # ours is kept even if the comparison does not finish
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"ours: median step {result['median_step_s']:.3f} s, peak {result['peak_mem_gib']:.2f} GiB", flush=True)
        if args.compare == "trl":
            gc.collect()  # our models and optimizer states must not hold GPU memory while TRL runs
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            trl = run_trl(args, workload, paths, dtype, kinds, caches / "trl" if kinds else None)
            result["trl"] = trl
            result["speedup"] = trl["median_step_s"] / result["median_step_s"]
        print_table(result)
        line = json.dumps(result)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(line, flush=True)
        return result
    finally:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        if caches is not None:
            shutil.rmtree(caches, ignore_errors=True)


def first_step_child(args: argparse.Namespace, workload: Workload, dtype: str, precision: str) -> dict[str, Any]:
    """``--first-step-child``: one step of ours on the files the parent wrote (``--workdir``); the last
    line is ``{"first_step_end_time": ...}`` (``benchmarks/first_step.py``)."""
    args.steps, args.profile_step, args.profile_trace, args.dump_first_step = 1, None, None, None
    paths = {"model": str(Path(args.workdir) / "model"), "prompts": str(Path(args.workdir) / "prompts")}
    result = run_ours(args, workload, paths, dtype, precision)
    line = {"first_step_end_time": result["first_step_end_time"], "step_s": result["step_s"],
            "first_step_marks": result["first_step_marks"]}
    print(json.dumps(line), flush=True)
    return line


if __name__ == "__main__":
    main()
