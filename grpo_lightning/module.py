"""The shared LightningModule of the GRPO family.

One training step (manual optimization)::

    rollout      = generate(prompts)                  G completions per prompt
    rewards      = score(rollout)                     weighted reward functions       [P * G]
    rollout      = select(rollout)                    hook (DAPO: dynamic sampling); None = no update yet
    old/ref logp                                      only when needed
    rewards      = shape_rewards(rewards, rollout)    hook (DAPO: overlong; RLOO: KL in the reward)
    advantages   = advantages(rewards.view(P, G))     hook
    for epoch in range(ppo_epochs):
        for minibatch:                                one optimizer step each
            for micro-batch:                          memory only: the gradient does not depend on it
                loss = aggregate(token_loss(...) + beta * kl, mask)    hooks

Variants (``variants/``) override only the hooks: ``advantages``, ``token_loss``, ``aggregate``,
and where their paper asks, ``select`` and ``shape_rewards``.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
import torchmetrics
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.profiler import record_function
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from grpo_lightning import functional as F
from grpo_lightning.engine import DECODE_ATTENTION_KINDS, StaticCacheGenerator, fast_generate_group
from grpo_lightning.logprobs import completion_logprobs, supports_packed_sequences
from grpo_lightning.rewards import resolve_reward_function, score_completions, weighted_reward
from grpo_lightning.rollout import Rollout, SamplingParams, completion_mask_from_ids, generate_group
from grpo_lightning.strategies import (
    RolloutReplica,
    clip_grad_norm_,
    full_parameters,
    full_state_dict,
    is_sharded,
    shard,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ConfigError(ValueError):
    """An invalid setting, raised before any work is done."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _disable_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


#: How two partial states ``(value, weight)`` of a step metric combine: a mean's weighted sums and
#: weights add up; a minimum or maximum keeps the extreme (its weight counts the values seen).
_COMBINE = {
    "mean": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "min": lambda a, b: (min(a[0], b[0]), a[1] + b[1]),
    "max": lambda a, b: (max(a[0], b[0]), a[1] + b[1]),
}

#: The state of a metric updated with NaN only: its value is NaN.
_NOTHING = {"mean": (0.0, 0.0), "min": (float("inf"), 0.0), "max": (float("-inf"), 0.0)}


class StepMetrics:
    """A step's metrics: weighted running means, or minima/maxima, logged and reset once per step.
    NaN values are left out.

    Values computed on an accelerator stay there until the step's metrics are read: moving each to
    the CPU as it is added would make the host wait for the device mid-step (several times per
    micro-batch), leaving the device idle while the host launches the next work. They are read
    together, in one copy."""

    def __init__(self) -> None:
        self._states: dict[str, tuple[str, tuple[float, float]]] = {}
        self._pending: list[tuple[str, str, Tensor, Tensor]] = []

    def update(self, name: str, value: Tensor | float, weight: Tensor | float = 1.0, reduce: str = "mean") -> None:
        """Add ``value`` to metric ``name``; ``reduce``: ``"mean"`` (weighted by ``weight``), ``"min"``, ``"max"``."""
        if reduce not in _COMBINE:
            raise ValueError(f"reduce must be one of {', '.join(_COMBINE)}, got {reduce!r}")
        # Copies: a tensor changed in place later must not change what was logged.
        value = torch.as_tensor(value, dtype=torch.float32).detach().reshape(()).clone()
        weight = torch.as_tensor(weight, dtype=torch.float32, device=value.device).detach().reshape(()).clone()
        self._pending.append((name, reduce, value, weight))

    def _apply_pending(self) -> None:
        """Read the values added since the last read (one copy to the CPU) into the states, in order."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        device = next((value.device for _, _, value, _ in pending if value.device.type != "cpu"), torch.device("cpu"))
        pairs = torch.stack([torch.stack([value.to(device), weight.to(device)]) for _, _, value, weight in pending])
        for (name, reduce, _, _), (value, weight) in zip(pending, pairs.tolist()):
            if value != value:  # NaN: counts as an update, adds nothing
                state = _NOTHING[reduce]
            else:
                state = (value * weight, weight) if reduce == "mean" else (value, 1.0)
            if name in self._states:
                state = _COMBINE[reduce](self._states[name][1], state)
            self._states[name] = (reduce, state)

    def compute_and_reset(self, gather: Callable[[Any], list[Any]] | None = None) -> dict[str, float]:
        """Each metric's value since the last reset. ``gather`` (e.g. an all-gather over processes)
        merges the states of every process first, so the values are over all devices' data."""
        self._apply_pending()
        states, self._states = self._states, {}
        if gather is not None:
            merged: dict[str, tuple[str, tuple[float, float]]] = {}
            for part in gather(states):
                for name, (reduce, state) in part.items():
                    if name in merged:
                        state = _COMBINE[reduce](merged[name][1], state)
                    merged[name] = (reduce, state)
            states = merged
        values = {}
        for name, (reduce, (value, weight)) in states.items():
            if reduce == "mean":
                values[name] = value / weight if weight else float("nan")
            else:
                values[name] = value if weight else float("nan")
        return values

    def state_dict(self) -> dict[str, tuple[str, Tensor, Tensor]]:
        """States of the metrics updated since the last reset (a step in progress)."""
        self._apply_pending()
        return {
            name: (reduce, torch.tensor(value), torch.tensor(weight))
            for name, (reduce, (value, weight)) in self._states.items()
        }

    def load_state_dict(self, state: dict[str, tuple[str, Tensor, Tensor]]) -> None:
        self._pending = []
        self._states = {name: (reduce, (float(value), float(weight))) for name, (reduce, value, weight) in state.items()}


def _rng_state() -> dict[str, Any]:
    """States of the global generators: torch (CPU and the current CUDA device), numpy, python."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if cuda else None,
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    random.setstate(state["python"])


def _gather_over_ranks(value: Any) -> list[Any]:
    """``value`` of every process, by global rank (every process must call it)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


#: Step metrics given to ``self.log`` at every training step (the progress bar shows the reward and
#: the KL); the others reach ``trainer.callback_metrics`` on the steps whose metrics the loggers
#: get, and every step's values are in ``GroupPolicyOptimization.last_step_metrics``.
EVERY_STEP_METRICS = ("loss", "reward", "kl")


class GroupPolicyOptimization(L.LightningModule):
    """Base module of the GRPO family: rollout, rewards, reference model, clipped update, logging.

    Args:
        model: Hugging Face hub id or local directory of a causal LM (loaded in ``configure_model``).
        tokenizer: hub id or directory of the tokenizer; defaults to ``model``.
        dtype: weights dtype, ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"``.
        gradient_checkpointing: recompute activations in the backward pass to save memory.
        attn_implementation: passed to ``from_pretrained`` (e.g. ``"sdpa"``, ``"flash_attention_2"``).
        disable_dropout: zero every dropout of the policy, so that the log-probs of the update are
            those of the distribution the rollout sampled from.
        rollout_engine: ``"hf"`` samples with ``model.generate``; ``"static"`` with a preallocated
            static KV cache and, on CUDA, a decode step captured in a CUDA graph
            (``grpo_lightning.engine``; sdpa/eager attention).
        rollout_dtype: dtype of the weights rollouts sample from, e.g. ``"bfloat16"`` for fp32
            weights trained under bf16 autocast: a copy in that dtype, refreshed after every
            optimizer step, decodes in bf16. ``None``: the policy's own weights (no copy); under
            FSDP, a replica in the strategy's compute dtype.
        rollout_compile: with the static engine, compile its decode step with ``torch.compile``
            (on CUDA before capturing it in the CUDA graph): faster decoding; the first rollout
            compiles.
        decode_attention: with the static engine, how a decode step's attention is computed
            (:data:`grpo_lightning.engine.attention.DECODE_ATTENTION_KINDS`): ``"auto"`` (``"triton"`` on
            CUDA when Triton is installed, ``"math"`` on a CPU, else ``"sdpa"``), ``"sdpa"``
            (PyTorch's choice of kernel), ``"efficient"`` (its memory-efficient kernel), ``"math"``
            (matrix products around an fp32 softmax, which ``rollout_compile`` fuses) or
            ``"triton"`` (one Triton kernel per step, the fastest on CUDA; on a CPU it computes as
            ``"math"``). Measured in ``benchmarks/attention_decode.py``.
        fuse_projections: with the static engine, decode with each layer's q/k/v and gate/up
            products as one matrix product each (Llama, Mistral, Qwen2 and Qwen3 models; others decode
            as usual). The policy's q/k/v and gate/up parameters become views of one buffer per
            layer (same parameters and values, no copy; ``grpo_lightning.engine.fused_decode``).
        qkv_kernel: with ``fuse_projections``, compute each decode layer's norm, q/k/v product,
            rotary embedding and cache write as one Triton kernel (``grpo_lightning.engine.kernels.qkv``).
            ``None``: on CUDA when Triton is installed, for Llama, Mistral and Qwen2 models;
            ``True`` raises where it cannot run.
        sampling_kernel: with the static engine, draw the tokens with Triton kernels whenever the
            temperature is positive and neither top_k nor top_p truncates
            (``grpo_lightning.engine.kernels.sampling``). ``None``: on CUDA when Triton is installed;
            ``True`` raises where it cannot run.
        logprob_compile: on CUDA, fuse the fp32 log-softmax arithmetic of the log-prob passes
            (reference, old policy, update) with ``torch.compile``.
        model_compile: in the log-prob passes (reference, old policy, update), run the model's
            forward and backward pass through ``torch.compile``, which fuses each decoder layer's
            element-wise work and saves fewer activations (the first passes compile; new sequence
            lengths recompile once, then run with dynamic shapes). Sharded models (FSDP) run eagerly.
        fused_lm_head: in the log-prob passes, run the LM head chunk by chunk inside the fp32
            log-softmax (:func:`grpo_lightning.logprobs.linear_token_logprobs`), so a micro-batch's
            ``[rows, tokens, vocabulary]`` logits and their gradient never exist whole. Applies to
            models whose logits are exactly ``lm_head(hidden)`` and that are not sharded
            (:func:`grpo_lightning.logprobs.plain_lm_head`); others take the unfused path.
            ``None``: on CUDA only (on a CPU, memory is rarely the limit and the recomputed head
            in the backward pass costs time).
        padding_free: in the log-prob passes, run each micro-batch as one packed sequence without
            padding (:func:`grpo_lightning.logprobs.completion_logprobs` with ``packed=True``): the
            prompts' left padding and the completions' padding after EOS cost no work. Pays off
            with an attention implementation that attends within each packed row only
            (``attn_implementation: flash_attention_2`` or ``flex_attention``, on a GPU); under
            ``sdpa`` or ``eager`` the rows are kept apart by a dense mask over the whole packed
            sequence, which usually costs more than the padding saves (measured on a CPU:
            ``benchmarks/padding_free.py``), and a warning says so. Needs a transformers release
            that detects packing from the position ids.
        rollout_seed: with the static engine, draw each completion's tokens from counter-based
            random numbers keyed by (this seed, the rollout's number, the prompt text, the
            completion's index in its group) instead of the global generator: the same prompts then
            sample the same completions whatever the batch composition, micro-batching or number of
            devices (up to floating-point differences between batch shapes). ``None``: the global
            generator, seeded by ``seed_everything``.
        reward_funcs: reward functions ``(prompts, completions, **columns) -> list[float]``, as
            callables or import paths (``"grpo_lightning.rewards.accuracy_reward"``).
        reward_weights: one weight per reward function (default: all 1).
        group_size: completions sampled per prompt, ``G``.
        max_new_tokens: completion length limit, ``L``.
        min_new_tokens: EOS is not sampled before this many tokens (benchmarks use ``L``).
        temperature, top_p, top_k: rollout sampling (``top_k = 0`` disables it).
        beta: KL coefficient; 0 loads no reference model.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (Schulman 2020; DeepSeekMath uses k3).
        clip_eps_low, clip_eps_high: ratio clip range ``[1 - low, 1 + high]``.
        ppo_epochs: passes over each rollout (``mu`` in DeepSeekMath).
        minibatch_size: completions per optimizer step; ``None`` = the whole rollout (one step).
        micro_batch_size: completions per forward/backward pass (memory only).
        learning_rate, weight_decay, warmup_steps, max_grad_norm: AdamW with linear warm-up,
            then constant; gradient norm clipping (``None`` disables it).
        val_temperature: sampling temperature of validation completions; 0 is greedy.
        val_max_new_tokens: completion limit in validation (default ``max_new_tokens``).
        accuracy_func: the function whose mean is ``val/accuracy``.
        use_chat_template: wrap plain-text prompts in the tokenizer's chat template when it has one.
    """

    #: Whether the KL term is added to the per-token loss (RLOO puts it in the reward instead).
    kl_in_loss: bool = True
    #: RNG states of the checkpoint a fit resumes from, applied in ``on_train_start``.
    _resume_rng: dict[str, Any] | None = None

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        dtype: str = "auto",
        gradient_checkpointing: bool = False,
        attn_implementation: str | None = None,
        disable_dropout: bool = True,
        rollout_engine: Literal["hf", "static"] = "hf",
        rollout_dtype: str | None = None,
        rollout_compile: bool = False,
        decode_attention: str = "auto",
        fuse_projections: bool = False,
        qkv_kernel: bool | None = None,
        sampling_kernel: bool | None = None,
        logprob_compile: bool = False,
        model_compile: bool = False,
        fused_lm_head: bool | None = None,
        padding_free: bool = False,
        rollout_seed: int | None = None,
        reward_funcs: Sequence[str | Callable] = ("grpo_lightning.rewards.accuracy_reward",),
        reward_weights: Sequence[float] | None = None,
        group_size: int = 8,
        max_new_tokens: int = 256,
        min_new_tokens: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        beta: float = 0.04,
        kl_estimator: str = "k3",
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        ppo_epochs: int = 1,
        minibatch_size: int | None = None,
        micro_batch_size: int = 8,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_grad_norm: float | None = 1.0,
        val_temperature: float = 0.0,
        val_max_new_tokens: int | None = None,
        accuracy_func: str | Callable = "grpo_lightning.rewards.accuracy_reward",
        use_chat_template: bool = True,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints leave the frozen reference model out

        _require(isinstance(model, str) and model != "", "model: give a hub id or a local directory of a causal LM.")
        _require(dtype == "auto" or dtype in _DTYPES, f"dtype: {dtype!r} is not one of 'auto', {', '.join(map(repr, _DTYPES))}.")
        _require(group_size >= 2, f"group_size: must be at least 2 (got {group_size}); group-relative advantages compare completions of one prompt.")
        _require(max_new_tokens >= 1, f"max_new_tokens: must be at least 1 (got {max_new_tokens}).")
        _require(
            0 <= min_new_tokens <= max_new_tokens,
            f"min_new_tokens: must be between 0 and max_new_tokens ({max_new_tokens}), got {min_new_tokens}.",
        )
        _require(temperature > 0, f"temperature: rollouts must be sampled, so it must be > 0 (got {temperature}).")
        _require(
            not padding_free or supports_packed_sequences(),
            "padding_free: this transformers release does not detect packed sequences from their position ids; "
            "upgrade transformers or set padding_free to false.",
        )
        _require(0 < top_p <= 1, f"top_p: must be in (0, 1] (got {top_p}).")
        _require(top_k >= 0, f"top_k: must be >= 0, 0 disables it (got {top_k}).")
        _require(
            decode_attention in DECODE_ATTENTION_KINDS,
            f"decode_attention: {decode_attention!r} is not one of {', '.join(map(repr, DECODE_ATTENTION_KINDS))}.",
        )
        _require(
            not fuse_projections or rollout_engine == "static",
            "fuse_projections: the fused decode step is the static engine's; set rollout_engine to 'static' "
            "or fuse_projections to false.",
        )
        _require(
            not qkv_kernel or fuse_projections,
            "qkv_kernel: the kernel computes the fused q/k/v projection; set fuse_projections to true "
            "or qkv_kernel to null.",
        )
        _require(
            not sampling_kernel or rollout_engine == "static",
            "sampling_kernel: the kernels draw the static engine's tokens; set rollout_engine to 'static' "
            "or sampling_kernel to null.",
        )
        _require(beta >= 0, f"beta: the KL coefficient must be >= 0 (got {beta}).")
        _require(kl_estimator in F.KL_ESTIMATORS, f"kl_estimator: {kl_estimator!r} is not one of {F.KL_ESTIMATORS}.")
        _require(0 <= clip_eps_low < 1, f"clip_eps_low: must be in [0, 1) (got {clip_eps_low}).")
        _require(clip_eps_high >= 0, f"clip_eps_high: must be >= 0 (got {clip_eps_high}).")
        _require(ppo_epochs >= 1, f"ppo_epochs: must be at least 1 (got {ppo_epochs}).")
        _require(micro_batch_size >= 1, f"micro_batch_size: must be at least 1 (got {micro_batch_size}).")
        if minibatch_size is not None:
            _require(minibatch_size >= 1, f"minibatch_size: must be at least 1 or null (got {minibatch_size}).")
            _require(
                minibatch_size % micro_batch_size == 0,
                f"minibatch_size ({minibatch_size}) must be a multiple of micro_batch_size ({micro_batch_size}): "
                "change one of them so micro-batches tile each minibatch.",
            )
        _require(
            rollout_dtype is None or rollout_dtype in _DTYPES,
            f"rollout_dtype: {rollout_dtype!r} is not one of {', '.join(map(repr, _DTYPES))} or null.",
        )
        _require(
            rollout_seed is None or rollout_engine == "static",
            "rollout_seed: keyed sampling needs the static engine: add --model.rollout_engine static, "
            "or leave rollout_seed unset.",
        )
        _require(val_temperature >= 0, f"val_temperature: must be >= 0, 0 is greedy (got {val_temperature}).")

        self.reward_functions = [
            resolve_reward_function(spec, field=f"reward_funcs[{i}]") for i, spec in enumerate(reward_funcs)
        ]
        _require(len(self.reward_functions) > 0, "reward_funcs: give at least one reward function.")
        weights = [1.0] * len(self.reward_functions) if reward_weights is None else list(reward_weights)
        _require(
            len(weights) == len(self.reward_functions),
            f"reward_weights: {len(weights)} weights for {len(self.reward_functions)} reward functions; give one per function.",
        )
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        self.accuracy_function = resolve_reward_function(accuracy_func, field="accuracy_func")

        self.model_name = model
        self.tokenizer_name = tokenizer or model
        self.group_size = group_size
        self.beta = beta
        self.kl_estimator = kl_estimator
        self.clip_eps_low = clip_eps_low
        self.clip_eps_high = clip_eps_high
        self.ppo_epochs = ppo_epochs
        self.minibatch_size = minibatch_size
        self.micro_batch_size = micro_batch_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.sampling = SamplingParams(max_new_tokens, temperature, top_p, top_k, min_new_tokens)
        self.val_sampling = SamplingParams(val_max_new_tokens or max_new_tokens, val_temperature, top_p, top_k)

        self.policy: PreTrainedModel | None = None
        self.ref_model: PreTrainedModel | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._engine: StaticCacheGenerator | None = None
        self._replica: RolloutReplica | None = None
        self.policy_version = 0  # optimizer steps taken: a rollout replica older than this is refreshed
        self.rollouts = 0  # generate() calls so far: part of the keys of keyed sampling
        self.step_metrics = StepMetrics()
        self.val_accuracy = torchmetrics.MeanMetric()
        self.val_reward = torchmetrics.MeanMetric()
        self.val_length = torchmetrics.MeanMetric()
        self.generated_tokens = 0
        self.last_step_metrics: dict[str, float] = {}  # every metric of the last training step

    # ------------------------------------------------------------------ algorithm hooks

    def advantages(self, rewards: Tensor) -> Tensor:
        """Advantage of each completion. ``rewards`` ``[P, G]`` -> ``[P, G]``."""
        raise NotImplementedError(f"{type(self).__name__} must implement advantages(rewards [P, G]) -> [P, G]")

    def token_loss(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
        """Per-token policy loss ``[N, T]`` (no KL): the clipped surrogate of PPO / DeepSeekMath eq. 3.

        ``logp``, ``old_logp``, ``mask``: ``[N, T]``; ``advantages``: ``[N]``.
        """
        loss, clipped_low, clipped_high = F.clipped_surrogate(
            logp, old_logp, advantages, self.clip_eps_low, self.clip_eps_high
        )
        self.record_clipping(clipped_low, clipped_high, mask)
        return loss

    def aggregate(
        self, loss: Tensor, mask: Tensor, *, num_sequences: int | None = None, num_tokens: Tensor | None = None
    ) -> Tensor:
        """Reduce the per-token loss ``[N, T]`` to a scalar.

        ``num_sequences`` and ``num_tokens`` are the counts of the whole minibatch (all
        micro-batches, all devices): summing the micro-batch results must equal the result on the
        whole minibatch. When ``None`` they are taken from ``loss`` and ``mask``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement aggregate(loss [N, T], mask [N, T]) -> []")

    def select(self, rollout: Rollout) -> Rollout | None:
        """Groups to train on. Identity here; ``None`` ends the step without an update."""
        return rollout

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """Adjust the ``[N]`` rewards once log-probs are known. Identity here."""
        return rewards

    def needs_old_logprobs(self, rollout_size: int) -> bool:
        """Old log-probs need a forward pass of their own unless the rollout makes one optimizer
        step: then they equal the current log-probs (detached) and that pass is skipped."""
        return self.ppo_epochs > 1 or (self.minibatch_size is not None and rollout_size > self.minibatch_size)

    # ------------------------------------------------------------------ helpers for hooks

    def min_over_ranks(self, value: int) -> int:
        """The smallest ``value`` over all processes (every process must call it); ``value`` alone
        outside a multi-process run."""
        dist = torch.distributed
        if self._trainer is None or self.trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return value
        tensor = torch.tensor(value, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return int(tensor)

    def record_clipping(self, clipped_low: Tensor, clipped_high: Tensor, mask: Tensor) -> None:
        tokens = mask.sum()
        self.step_metrics.update("clip_ratio/low", F.masked_mean(clipped_low.float(), mask), tokens)
        self.step_metrics.update("clip_ratio/high", F.masked_mean(clipped_high.float(), mask), tokens)
        either = (clipped_low | clipped_high).float()
        self.step_metrics.update("clip_ratio/region", F.masked_mean(either, mask), tokens)

    # ------------------------------------------------------------------ model

    def configure_model(self) -> None:
        """Load tokenizer, policy and (when ``beta > 0``) the frozen reference model.

        Under an FSDP strategy each model is sharded on its own (``grpo_lightning.strategies.shard``),
        the reference model unless the strategy keeps it whole (``reference_weights="unsharded"``).
        """
        if self.policy is not None:
            return
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_name)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.policy = self._load_causal_lm().train()
        attention = getattr(self.policy.config, "_attn_implementation", None)
        if self.hparams.padding_free and attention in ("sdpa", "eager"):
            rank_zero_warn(
                f"padding_free with attn_implementation {attention!r}: packed rows are kept apart by a dense "
                "mask over the whole packed sequence, which usually costs more than the padding it saves; "
                "use flash_attention_2 or flex_attention (on a GPU)."
            )
        if self.hparams.disable_dropout:
            _disable_dropout(self.policy)
        if self.hparams.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.policy = shard(self.policy)
        if self.hparams.model_compile and is_sharded(self.policy):
            rank_zero_warn("model_compile: the policy is sharded (FSDP), so its log-prob passes run eagerly.")
        if self.beta > 0:
            self.ref_model = self._load_causal_lm()
            self.ref_model.eval().requires_grad_(False)
            strategy = self.trainer.strategy if self._trainer is not None else None
            if getattr(strategy, "reference_weights", "sharded") == "sharded":
                self.ref_model = shard(self.ref_model)

    def _load_causal_lm(self) -> PreTrainedModel:
        dtype = self.hparams.dtype
        kwargs: dict[str, Any] = {"dtype": dtype if dtype == "auto" else _DTYPES[dtype]}
        if self.hparams.attn_implementation:
            kwargs["attn_implementation"] = self.hparams.attn_implementation
        return AutoModelForCausalLM.from_pretrained(self.model_name, **kwargs)

    def save_pretrained(self, directory: str) -> None:
        """Write the policy and tokenizer as a plain Hugging Face directory (rank 0 writes).

        Under FSDP every process must call it: the shards are gathered first.
        """
        policy, weights = self.policy, None
        if is_sharded(policy):
            with full_state_dict(policy):
                weights = policy.state_dict()
            policy = policy.module
        if self.global_rank == 0:
            policy.save_pretrained(directory, state_dict=weights)
            self.tokenizer.save_pretrained(directory)

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Leave the frozen reference model out (it is reloaded from ``model``) and add every
        process's :meth:`training_state` under ``"training_state"`` (a list by global rank).

        Lightning saves the rest: policy, optimizer, scheduler, loop progress, and the data
        position of the (resumable) train loader.
        """
        state = checkpoint.get("state_dict", {})
        for key in [k for k in state if k.startswith("ref_model.")]:
            del state[key]
        checkpoint["training_state"] = _gather_over_ranks(self.training_state())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("training_state")
        if states and self.global_rank < len(states):
            self.load_training_state(states[self.global_rank])

    def training_state(self) -> dict[str, Any]:
        """This process's state that an exact resume needs beyond weights, optimizer and loops:
        the RNG states the rollouts sample from, the generated-token count and the metrics of a
        step in progress. Variants add theirs (DAPO: the dynamic-sampling buffer)."""
        return {
            "rng": _rng_state(),
            "generated_tokens": self.generated_tokens,
            "rollouts": self.rollouts,
            "step_metrics": self.step_metrics.state_dict(),
        }

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.generated_tokens = state["generated_tokens"]
        self.rollouts = state.get("rollouts", 0)
        self.step_metrics.load_state_dict(state["step_metrics"])
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        self._resume_rng = state["rng"] if fitting else None

    def on_train_start(self) -> None:
        # Set after everything a resumed fit does before its first batch (loading, data loader
        # iterators), so the rollouts draw the numbers the uninterrupted run drew.
        if self._resume_rng is not None:
            _set_rng_state(self._resume_rng)
            self._resume_rng = None

    def configure_optimizers(self):
        parameters = [p for p in self.policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            parameters,
            lr=self.hparams.learning_rate,
            weight_decay=self.hparams.weight_decay,
            # One fused kernel for all parameters on CUDA and on a CPU (W0's step: 0.28 against
            # 1.09 ms for the default foreach implementation, 2 threads); the default elsewhere.
            fused=True if all(p.device.type in ("cuda", "cpu") for p in parameters) else None,
        )
        warmup = self.hparams.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ checks before work

    def on_fit_start(self) -> None:
        datamodule = self.trainer.datamodule
        prompts_per_step = getattr(datamodule, "batch_size", None)
        if prompts_per_step is not None and self.minibatch_size is not None:
            rollout_size = prompts_per_step * self.group_size
            _require(
                rollout_size % self.minibatch_size == 0,
                f"minibatch_size ({self.minibatch_size}) must divide the rollout size data.batch_size x group_size "
                f"= {prompts_per_step} x {self.group_size} = {rollout_size}: change --model.minibatch_size or --data.batch_size.",
            )
        for split in ("train_dataset", "val_dataset"):
            dataset = getattr(datamodule, split, None)
            if dataset is not None:
                self.check_prompt_lengths(dataset["prompt"], split.removesuffix("_dataset"))

    def check_prompt_lengths(self, prompts: Sequence[Any], split: str) -> None:
        """Raise if a prompt plus ``max_new_tokens`` exceeds the model's context."""
        context = getattr(self.policy.config, "max_position_embeddings", None)
        if context is None:
            return
        texts = [self.format_prompt(p) for p in prompts]
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        limit = context - max(self.sampling.max_new_tokens, self.val_sampling.max_new_tokens)
        longest = max(range(len(lengths)), key=lengths.__getitem__, default=None)
        if longest is not None and lengths[longest] > limit:
            raise ConfigError(
                f"prompt of row {longest} in the {split} split has {lengths[longest]} tokens; with max_new_tokens="
                f"{self.sampling.max_new_tokens} it does not fit the model context of {context} tokens. "
                "Filter long prompts from the dataset or lower --model.max_new_tokens."
            )

    # ------------------------------------------------------------------ rollout

    def format_prompt(self, prompt: Any) -> str:
        """Plain text for the model: chat messages (or plain text, when the tokenizer has a chat
        template and ``use_chat_template``) go through the template."""
        if isinstance(prompt, str) and not (self.hparams.use_chat_template and self.tokenizer.chat_template):
            return prompt
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    @contextlib.contextmanager
    def rollout_model(self) -> Iterator[torch.nn.Module]:
        """The model rollouts sample from: the policy itself; or a :class:`RolloutReplica` refreshed
        after every optimizer step, in ``rollout_dtype`` or, under FSDP (the strategy's
        ``rollout_weights="replica"``), unsharded; or under FSDP with ``"gather"`` the sharded policy
        with its root parameters gathered."""
        dtype = _DTYPES[self.hparams.rollout_dtype] if self.hparams.rollout_dtype else None
        if not is_sharded(self.policy) and dtype in (None, next(self.policy.parameters()).dtype):
            yield self.policy
            return
        if is_sharded(self.policy) and getattr(self.trainer.strategy, "rollout_weights", "gather") != "replica":
            with full_parameters(self.policy):
                yield self.policy
            return
        if self._replica is None:
            self._replica = RolloutReplica(self.policy, dtype)
        if self._replica.version != self.policy_version:
            self._replica.refresh(self.policy)
            self._replica.version = self.policy_version
        yield self._replica.model

    def row_keys(self, texts: Sequence[str], group_size: int) -> Tensor:
        """Keys of keyed sampling (``rollout_seed``), one per completion: a hash of the seed, the
        rollout's number, the prompt text, the how-many-th copy of that text in the batch it is, and
        the completion's index in its group. Independent of the prompt's place in the batch."""
        seen: dict[str, int] = {}
        keys = []
        for text in texts:
            copy = seen[text] = seen.get(text, -1) + 1
            for index in range(group_size):
                digest = hashlib.blake2b(
                    f"{self.hparams.rollout_seed}|{self.rollouts}|{copy}|{index}|".encode() + text.encode(), digest_size=8
                ).digest()
                keys.append(int.from_bytes(digest, "little") >> 1)  # non-negative int64
        return torch.tensor(keys, dtype=torch.int64)

    def generate(self, batch: dict[str, list], group_size: int, sampling: SamplingParams) -> Rollout:
        """Sample ``group_size`` completions for each prompt of ``batch``."""
        prompts = batch["prompt"]
        texts = [self.format_prompt(p) for p in prompts]
        with self.rollout_model() as model:
            if self.hparams.rollout_engine == "static":
                rows = len(texts) * group_size
                if self._engine is None or rows > self._engine.max_batch_size or self._engine.model is not model:
                    # Sized to the largest batch seen (a validation batch may come first), not chunked.
                    if self._engine is not None:
                        self._engine.clear()
                    self._engine = StaticCacheGenerator(
                        model,
                        max_batch_size=rows,
                        max_cache_len=sampling.max_new_tokens + 64,
                        compile=self.hparams.rollout_compile,
                        decode_attention=self.hparams.decode_attention,
                        fuse_projections=self.hparams.fuse_projections,
                        qkv_kernel=self.hparams.qkv_kernel,
                        sampling_kernel=self.hparams.sampling_kernel,
                    )
                keys = None if self.hparams.rollout_seed is None else self.row_keys(texts, group_size)
                prompt_ids, prompt_mask, completion_ids = fast_generate_group(
                    self._engine, self.tokenizer, texts, group_size, sampling, row_keys=keys
                )
            else:
                prompt_ids, prompt_mask, completion_ids = generate_group(model, self.tokenizer, texts, group_size, sampling)
        self.rollouts += 1
        completion_mask, truncated = completion_mask_from_ids(completion_ids, self.tokenizer.eos_token_id)
        completions = self.tokenizer.batch_decode(
            completion_ids.masked_fill(completion_mask == 0, self.tokenizer.pad_token_id), skip_special_tokens=True
        )

        def repeat(values: list) -> list:
            return [v for v in values for _ in range(group_size)]

        columns = {k: repeat(v) for k, v in batch.items() if k not in ("prompt", "completion", "completions")}
        return Rollout(
            group_size=group_size,
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            truncated=truncated,
            prompts=repeat(list(prompts)),
            completions=completions,
            columns=columns,
        )

    def score(self, rollout: Rollout) -> None:
        """Fill ``rollout.reward_per_function`` ``[N, F]`` and the weighted ``rollout.rewards`` ``[N]``."""
        per_function = score_completions(self.reward_functions, rollout.prompts, rollout.completions, rollout.columns)
        rollout.reward_per_function = per_function.to(self.device)
        rollout.rewards = weighted_reward(rollout.reward_per_function, self.reward_weights.to(self.device))

    @torch.no_grad()
    def compute_logprobs(self, model: torch.nn.Module, rollout: Rollout) -> Tensor:
        """Log-probs ``[N, T]`` of the rollout's completions under ``model``, in micro-batches."""
        parts = []
        for rows in torch.arange(len(rollout)).split(self.micro_batch_size):
            logp, _ = self._forward(model, rollout, rows, with_entropy=False)
            parts.append(logp)
        return torch.cat(parts)

    def _forward(
        self, model: torch.nn.Module, rollout: Rollout, rows: Tensor, with_entropy: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        rows = rows.to(rollout.completion_ids.device)
        return completion_logprobs(
            model,
            rollout.prompt_ids[rows],
            rollout.prompt_mask[rows],
            rollout.completion_ids[rows],
            rollout.completion_mask[rows],
            temperature=self.temperature,
            with_entropy=with_entropy,
            compiled=self.hparams.logprob_compile,
            fused_head=self.device.type == "cuda" if self.hparams.fused_lm_head is None else self.hparams.fused_lm_head,
            packed=self.hparams.padding_free,
            compiled_model=self.hparams.model_compile,
        )

    # ------------------------------------------------------------------ training

    def _clock(self) -> float:
        """Wall time after the device's queued work, so each phase is charged its own kernels."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def training_step(self, batch: dict[str, list], batch_idx: int) -> None:
        step_start = self._clock()
        with record_function("grpo.rollout"):
            rollout = self.generate(batch, self.group_size, self.sampling)
        rollout_s = self._clock() - step_start
        self.generated_tokens += int(rollout.completion_mask.sum())  # dropped groups cost compute too
        self.log_rollout(rollout)

        score_start = self._clock()
        with record_function("grpo.score"):
            self.score(rollout)
        self.log_rewards(rollout)
        score_s = self._clock() - score_start

        rollout = self.select(rollout)
        if rollout is None:
            self.step_metrics.update("perf/rollout_s", rollout_s)
            return

        logprob_start = self._clock()
        with record_function("grpo.logprobs"):
            if self.needs_old_logprobs(len(rollout)) or (self.beta > 0 and not self.kl_in_loss):
                rollout.old_logp = self.compute_logprobs(self.policy, rollout)
            if self.beta > 0:
                rollout.ref_logp = self.compute_logprobs(self.ref_model, rollout)
        logprob_s = self._clock() - logprob_start

        rewards = self.shape_rewards(rollout.rewards, rollout)
        advantages = self.advantages(rewards.view(-1, rollout.group_size)).flatten()

        update_start = self._clock()
        with record_function("grpo.update"):
            self.update(rollout, advantages)
        update_s = self._clock() - update_start

        total_s = self._clock() - step_start
        tokens = float(rollout.completion_mask.sum())
        self.step_metrics.update("perf/rollout_s", rollout_s)
        self.step_metrics.update("perf/score_s", score_s)
        self.step_metrics.update("perf/logprob_s", logprob_s)
        self.step_metrics.update("perf/update_s", update_s)
        self.step_metrics.update("perf/step_s", total_s)
        self.step_metrics.update("perf/tokens_per_s", tokens / max(total_s, 1e-9))
        self.step_metrics.update("advantages/abs_mean", advantages.abs().mean())
        self.log_step()

    def update(self, rollout: Rollout, advantages: Tensor) -> None:
        """``ppo_epochs`` passes over the rollout; one optimizer step per minibatch."""
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        size = len(rollout)
        minibatch = self.minibatch_size or size
        for _ in range(self.ppo_epochs):
            order = torch.randperm(size) if self.needs_old_logprobs(size) else torch.arange(size)
            for rows in order.split(minibatch):
                optimizer.zero_grad(set_to_none=True)
                self.accumulate_gradients(rollout, advantages, rows)
                self.clip_and_log_gradient_norm(optimizer)
                optimizer.step()
                scheduler.step()
                self.policy_version += 1
        self.step_metrics.update("learning_rate", scheduler.get_last_lr()[0])

    def clip_and_log_gradient_norm(self, optimizer) -> None:
        """Log the policy's total gradient norm (``grad_norm``, before clipping) and clip it to
        ``max_grad_norm``. Under FSDP the norm is over all shards."""
        max_norm = self.hparams.max_grad_norm
        if is_sharded(self.policy):
            # Lightning's FSDP precision plugin refuses norm clipping: the FSDP root clips.
            norm = clip_grad_norm_(self.policy, float("inf") if max_norm is None else max_norm)
        elif getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            # fp16 with a gradient scaler: Lightning unscales before it clips; no norm to log.
            if max_norm is not None:
                self.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
            return
        else:
            parameters = [p for p in self.policy.parameters() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(parameters, float("inf") if max_norm is None else max_norm)
        self.step_metrics.update("grad_norm", norm)

    def accumulate_gradients(self, rollout: Rollout, advantages: Tensor, rows: Tensor) -> None:
        """Backward of one minibatch, ``micro_batch_size`` rows at a time.

        The aggregation gets the minibatch-wide sequence and token counts (summed over devices),
        so the accumulated gradient does not depend on the micro-batch size.
        """
        mask = rollout.completion_mask
        num_sequences = len(rows)
        num_tokens = mask[rows.to(mask.device)].sum()
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1:
            # DDP averages gradients over devices: normalise by the mean count per device.
            num_tokens = self.trainer.strategy.reduce(num_tokens, reduce_op="sum") / world
        total = torch.zeros((), device=mask.device)
        micro_batches = rows.split(self.micro_batch_size)
        for index, micro_rows in enumerate(micro_batches):
            loss = self.micro_batch_loss(rollout, advantages, micro_rows, num_sequences, num_tokens)
            with contextlib.nullcontext() if index == len(micro_batches) - 1 else self.no_gradient_sync():
                self.manual_backward(loss)
            total += loss.detach()
        self.step_metrics.update("loss", total)

    def no_gradient_sync(self) -> contextlib.AbstractContextManager:
        """Context for the backward passes of all but a minibatch's last micro-batch: under DDP the
        gradients accumulate locally and are averaged over devices once, in the last backward pass,
        instead of once per micro-batch. Under FSDP, each backward pass still reduce-scatters (the
        sharded gradients are what keep memory low)."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        return strategy.block_backward_sync() if isinstance(strategy, ParallelStrategy) else contextlib.nullcontext()

    def micro_batch_loss(
        self, rollout: Rollout, advantages: Tensor, rows: Tensor, num_sequences: int, num_tokens: Tensor
    ) -> Tensor:
        """This micro-batch's share of the minibatch loss: ``aggregate(token_loss + beta * kl)``."""
        mask = rollout.completion_mask
        rows = rows.to(mask.device)
        micro_mask = mask[rows]
        tokens = micro_mask.sum()
        logp, entropy = self._forward(self.policy, rollout, rows)
        old_logp = logp.detach() if rollout.old_logp is None else rollout.old_logp[rows]
        loss = self.token_loss(logp, old_logp, advantages[rows], micro_mask)
        if rollout.ref_logp is not None:
            kl = F.kl_estimate(logp, rollout.ref_logp[rows], self.kl_estimator)
            if self.kl_in_loss:
                loss = loss + self.beta * kl
            self.step_metrics.update("kl", F.masked_mean(kl.detach(), micro_mask), tokens)
        self.step_metrics.update("entropy", F.masked_mean(entropy, micro_mask), tokens)
        return self.aggregate(loss, micro_mask, num_sequences=num_sequences, num_tokens=num_tokens)

    # ------------------------------------------------------------------ logging

    def log_rollout(self, rollout: Rollout) -> None:
        lengths = rollout.lengths.float()
        self.step_metrics.update("completions/mean_length", lengths.mean())
        self.step_metrics.update("completions/min_length", lengths.min(), reduce="min")
        self.step_metrics.update("completions/max_length", lengths.max(), reduce="max")
        self.step_metrics.update("completions/clipped_ratio", rollout.truncated.float().mean())

    def log_rewards(self, rollout: Rollout) -> None:
        grouped = rollout.rewards.view(-1, rollout.group_size)
        self.step_metrics.update("reward", grouped.mean())
        self.step_metrics.update("reward_std", grouped.std(dim=1).mean() if rollout.group_size > 1 else 0.0)
        self.step_metrics.update("frac_reward_zero_std", (~F.informative_groups(grouped)).float().mean())
        for (name, _), column in zip(self.reward_functions, rollout.reward_per_function.unbind(1)):
            self.step_metrics.update(f"rewards/{name}/mean", torch.nanmean(column))

    def log_step(self) -> None:
        """Log the step's metrics: means over every device's rollouts, generated tokens summed over
        devices. All of them are kept in ``last_step_metrics``; ``EVERY_STEP_METRICS`` go to
        ``self.log`` at every step, the others on the steps whose metrics the Trainer writes to its
        loggers (``log_every_n_steps``). Lightning's ``self.log`` costs about 0.25 ms per metric,
        most of W0's 8 ms of logging per step (``benchmarks/RESULTS.md``), for values that it only
        keeps in ``trainer.callback_metrics`` between those steps."""
        values = self.step_metrics.compute_and_reset(gather=_gather_over_ranks)
        values["perf/generated_tokens"] = float(sum(_gather_over_ranks(self.generated_tokens)))
        self.last_step_metrics = values
        if self._loggers_write_this_step():
            logged = values
        else:
            logged = {k: values[k] for k in EVERY_STEP_METRICS if k in values}
        progress = {k for k in ("reward", "kl") if k in logged}
        self.log_dict({k: v for k, v in logged.items() if k not in progress}, on_step=True, on_epoch=False)
        self.log_dict({k: logged[k] for k in progress}, on_step=True, on_epoch=False, prog_bar=True)

    def _loggers_write_this_step(self) -> bool:
        """Whether the Trainer writes this step's metrics to its loggers (every ``log_every_n_steps``
        steps, and when it stops); ``True`` where the Trainer does not say."""
        connector = getattr(self._trainer, "_logger_connector", None)
        return bool(getattr(connector, "should_update_logs", True))

    # ------------------------------------------------------------------ validation

    def on_validation_epoch_start(self) -> None:
        # Fresh states in this evaluation's own grad mode: a state made under inference mode (by a
        # ``trainer.validate`` call) cannot be updated by a later validation that runs under no_grad.
        for metric in (self.val_accuracy, self.val_reward, self.val_length):
            metric.reset()

    def accuracy_scores(self, rollout: Rollout) -> Tensor:
        """``[N]`` scores of ``accuracy_func``: its column of the rewards when it is also a reward
        function, so it is not called twice."""
        accuracy = self.accuracy_function[1]
        for column, (_, function) in enumerate(self.reward_functions):
            if function is accuracy:
                return rollout.reward_per_function[:, column]
        return score_completions([self.accuracy_function], rollout.prompts, rollout.completions, rollout.columns)[:, 0]

    def validation_step(self, batch: dict[str, list], batch_idx: int) -> None:
        rollout = self.generate(batch, 1, self.val_sampling)
        self.score(rollout)
        accuracy = self.accuracy_scores(rollout)
        size = len(rollout)
        self.val_accuracy.update(torch.nanmean(accuracy), size)
        self.val_reward.update(rollout.rewards.mean(), size)
        self.val_length.update(rollout.lengths.float().mean(), size)
        self.log("val/accuracy", self.val_accuracy, on_epoch=True, prog_bar=True, batch_size=size)
        self.log("val/reward", self.val_reward, on_epoch=True, batch_size=size)
        self.log("val/mean_length", self.val_length, on_epoch=True, batch_size=size)

