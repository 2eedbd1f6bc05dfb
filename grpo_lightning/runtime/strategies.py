"""Training over many devices: FSDP sharding of the policy and the frozen reference model.

Switch with one line: ``--config configs/strategy/fsdp.yaml`` (or
``--trainer.strategy grpo_lightning.runtime.strategies.PolicyFSDPStrategy``). DDP needs nothing from this
file: ``--config configs/strategy/ddp.yaml`` or ``--trainer.strategy ddp``.

How the module is sharded (FSDP1, Lightning's :class:`~lightning.pytorch.strategies.FSDPStrategy`):

* ``configure_model`` passes the policy and the reference model through :func:`shard`. Inside the
  strategy's wrapping context each becomes an FSDP root of its own, with one FSDP unit per
  decoder layer (the block classes the model names in ``_no_split_modules``); anywhere else
  :func:`shard` returns the model unchanged. Two roots keep the frozen reference weights out of
  the policy's flat parameters and out of its optimizer, and let every backward pass through the
  policy end in FSDP's own gradient finalisation, which manual optimization (backward inside
  ``training_step``) relies on: the LightningModule itself is not wrapped.
* Rollouts (``rollout_weights``): by default each device samples from a :class:`RolloutReplica`,
  an unsharded copy of the policy in the compute dtype, refreshed from the shards once after each
  optimizer step (one all-gather per unit). Decoding then reads local weights at every token and
  can use the static-cache engine and its CUDA graph; the replica costs one copy of the weights in
  bf16 per device (3 GB for a 1.5B model). With ``"gather"`` the sharded policy's decoder layers
  gather their shards in every forward, i.e. at every decoded token, which made the rollout several
  times slower than one card's (``benchmarks/JOURNAL.md``, W2). Use ``"gather"`` only when a bf16
  copy does not fit next to the shards.
* The frozen reference model is sharded too, unless ``reference_weights="unsharded"``: then each
  device holds a whole copy in the compute dtype, and the reference pass gathers nothing (one more
  copy of the weights per device).
* Gradient clipping by norm goes through the policy root's ``clip_grad_norm_``
  (:func:`clip_grad_norm_`); Lightning's FSDP precision plugin refuses norm clipping.
* Checkpoints (``state_dict_type="full"``) hold the gathered policy under its plain parameter
  names, so they load with or without FSDP, on any number of devices. Rank 0 writes the file
  through the trainer's CheckpointIO (atomically with :mod:`grpo_lightning.runtime.checkpoint_io`'s).

:class:`PolicyFSDPStrategy` also runs on CPU processes (gloo), which the tests use.
"""

from __future__ import annotations

import copy
import contextlib
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any, Literal

import torch
from lightning.pytorch.strategies import FSDPStrategy, ParallelStrategy
from torch import Tensor, nn
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, enable_wrap, wrap

from grpo_lightning.runtime.checkpoint_io import check_checkpoint
from grpo_lightning.errors import ConfigError

_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}


def decoder_layer_classes(model: nn.Module) -> frozenset[type[nn.Module]]:
    """The block classes of a Hugging Face model (``model._no_split_modules``, e.g.
    ``Qwen2DecoderLayer``) that occur in it: the units FSDP shards and checkpoints one by one."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return frozenset(type(m) for m in model.modules() if type(m).__name__ in names)


def decoder_layer_policy(model: nn.Module) -> ModuleWrapPolicy:
    """FSDP auto-wrap policy with one unit per decoder layer of ``model``."""
    return ModuleWrapPolicy(decoder_layer_classes(model))


def shard(model: nn.Module) -> nn.Module:
    """``model`` as an FSDP root with a unit per decoder layer, when called inside the wrapping
    context FSDP strategies open around ``configure_model``; otherwise ``model`` itself.

    The rest of the FSDP settings (mixed precision, CPU offload, sharding strategy, device) come
    from the strategy.
    """
    return wrap(model, auto_wrap_policy=decoder_layer_policy(model))


def is_sharded(model: nn.Module | None) -> bool:
    return isinstance(model, FullyShardedDataParallel)


def full_parameters(model: nn.Module) -> contextlib.AbstractContextManager:
    """Context in which ``model.generate`` can run: for an FSDP root, its own parameters are
    gathered (read-only); its decoder-layer units gather theirs in their forward."""
    if is_sharded(model):
        return FullyShardedDataParallel.summon_full_params(model, recurse=False, writeback=False)
    return contextlib.nullcontext()


_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def _plain_name(name: str) -> str:
    """A parameter name without the FSDP and activation-checkpointing wrapper components."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _unit_tensors(unit: FullyShardedDataParallel, prefix: str) -> Iterator[tuple[str, Tensor]]:
    """Parameters and buffers that belong to FSDP ``unit`` itself (not to FSDP units inside it), by
    their names under the root."""
    stack = [(prefix, unit.module)]
    while stack:
        path, module = stack.pop()
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is not None:
                yield path + name, tensor
        for name, child in module._modules.items():
            if child is not None and not isinstance(child, FullyShardedDataParallel):
                stack.append((f"{path}{name}.", child))


class RolloutReplica:
    """A whole copy of a causal LM, in another dtype or unsharded, to sample rollouts from.

    For an FSDP-sharded model: built in its compute dtype (its mixed-precision ``param_dtype``,
    else its parameters' dtype) unless ``dtype`` is given; :meth:`refresh` copies the current
    weights in one FSDP unit at a time (every process must call it), so the gathered
    full-precision weights of only one unit exist at a time. For a plain model (e.g. fp32 weights
    trained under bf16 autocast): built in ``dtype`` and refreshed parameter by parameter. Either
    way it lives on the model's device, and its parameter addresses never change, so a CUDA graph
    captured on it stays valid across refreshes. Its weights are ordinary tensors even when it is
    built under ``torch.inference_mode``, so it can be refreshed in any mode.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None) -> None:
        sharded = is_sharded(model)
        inner = model.module if sharded else model
        if dtype is None:
            mixed = getattr(model, "mixed_precision", None) if sharded else None
            dtype = getattr(mixed, "param_dtype", None) or next(model.parameters()).dtype
        # Its own config: the engine switches the attention implementation of the model it samples from
        # (grouped_query_attention), which must not reach the policy, e.g. while a rollout is sampled
        # ahead on another thread during the update (compiled forwards guard on it).
        config = copy.deepcopy(inner.config)
        device = model.compute_device if sharded else next(model.parameters()).device
        # Initialising the copy must not draw from the generators the rollouts sample from. Its
        # weights are made outside inference mode, whatever the caller's (a first rollout may come
        # from ``trainer.validate``): refreshes after optimizer steps update them in place.
        with (
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
            torch.device(device),
            torch.inference_mode(False),
        ):
            self.model = type(inner)._from_config(
                config, dtype=dtype, attn_implementation=getattr(config, "_attn_implementation", None)
            )
        self.model.eval().requires_grad_(False)
        self.version: int | None = None  # what the owner last refreshed it to

    @torch.no_grad()
    def refresh(self, model: nn.Module, tensors: Iterable[tuple[str, Tensor]] | None = None) -> None:
        """Copy the weights of ``model`` (and its buffers) into the replica; or ``tensors``, named
        as the replica's parameters (LoRA's merged weights: :func:`grpo_lightning.models.lora.merged_weights`)."""
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(self.model.named_buffers(remove_duplicate=False))
        written: set[str] = set()

        def copy(name: str, tensor: Tensor) -> None:
            name = _plain_name(name)
            target = targets.get(name)
            if target is None:
                raise RuntimeError(f"RolloutReplica: the model has {name!r}, the replica does not.")
            target.copy_(tensor.view(target.shape))
            written.add(name)

        if tensors is not None:
            for name, tensor in tensors:
                copy(name, tensor)
        elif not is_sharded(model):
            for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
                copy(name, tensor)
        units = [(name, m) for name, m in model.named_modules() if isinstance(m, FullyShardedDataParallel)]
        for unit_name, unit in units:
            prefix = f"{unit_name}." if unit_name else ""
            with FullyShardedDataParallel.summon_full_params(unit, recurse=False, writeback=False):
                for name, tensor in _unit_tensors(unit, prefix):
                    copy(name, tensor)
        missing = set(dict(self.model.named_parameters(remove_duplicate=False))) - written
        if missing:
            raise RuntimeError(f"RolloutReplica: no weights found for {sorted(missing)[:5]} (of {len(missing)}).")


def clip_grad_norm_(model: nn.Module, max_norm: float) -> Tensor:
    """Clip the gradients of the FSDP root ``model`` to a total norm over all shards."""
    return model.clip_grad_norm_(max_norm)


def clip_policy_gradients(
    module: Any, optimizer: Any, max_norm: float | None, model: nn.Module | None = None
) -> Tensor | None:
    """Clip ``module.policy``'s gradient (or ``model``'s, e.g. a critic's) to ``max_norm`` (``None``:
    no clipping) and return its total norm before clipping. Under FSDP the norm is over all shards
    (the FSDP root clips: Lightning's FSDP precision plugin refuses norm clipping); under fp16 with
    a gradient scaler Lightning unscales before it clips and no norm is returned."""
    policy = module.policy if model is None else model
    if is_sharded(policy):
        return clip_grad_norm_(policy, float("inf") if max_norm is None else max_norm)
    if getattr(module.trainer.precision_plugin, "scaler", None) is not None:
        if max_norm is not None:
            module.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
        return None
    parameters = [p for p in policy.parameters() if p.grad is not None]
    return torch.nn.utils.clip_grad_norm_(parameters, float("inf") if max_norm is None else max_norm)


def no_gradient_sync(strategy: Any) -> contextlib.AbstractContextManager:
    """Context for the backward passes of all but a minibatch's last micro-batch: under DDP the
    gradients accumulate locally and are averaged over devices once, in the last backward pass,
    instead of once per micro-batch. Under FSDP, each backward pass still reduce-scatters (the
    sharded gradients are what keep memory low)."""
    return strategy.block_backward_sync() if isinstance(strategy, ParallelStrategy) else contextlib.nullcontext()


@contextlib.contextmanager
def full_state_dict(model: nn.Module) -> Iterator[None]:
    """Inside, ``model.state_dict()`` (and ``FullyShardedDataParallel.optim_state_dict``) give the
    full, unsharded state, on the CPU, on rank 0 only. Every process must take part."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType

    # Offloading what already lives on the CPU frees the memory the copies point to.
    offload = next(model.parameters()).device.type != "cpu"
    with FullyShardedDataParallel.state_dict_type(
        model,
        StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(offload_to_cpu=offload, rank0_only=True),
        FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=True),
    ):
        yield


def mixed_precision_config(precision: Literal["bf16", "fp16"] | None) -> MixedPrecision | None:
    """FSDP mixed precision: weights gathered and computed in ``precision``, gradients reduced and
    sharded weights kept (for the optimizer) in fp32. Every unit casts its inputs, so a layer gets
    inputs of its own dtype whatever the unit before it ran in."""
    if precision is None:
        return None
    if precision not in _PRECISIONS:
        raise ValueError(f"mixed_precision: {precision!r} is not one of {sorted(_PRECISIONS)} or null.")
    dtype = _PRECISIONS[precision]
    # Buffers keep their dtype: the rotary inverse frequencies rounded to bf16 would shift the
    # positions of late tokens (Hugging Face models keep them in fp32 in bf16 models too).
    return MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32, buffer_dtype=None, cast_forward_inputs=True)


class PolicyFSDPStrategy(FSDPStrategy):
    """Lightning's FSDP strategy set up for the GRPO-family module (see the module docstring).

    Args:
        mixed_precision: ``"bf16"`` (default) or ``"fp16"``: compute dtype of the gathered weights;
            the sharded weights the optimizer updates, and the reference shards, are float32 under
            ``trainer.precision: 32-true`` (Lightning's FSDP casts the module to it, whatever
            ``--model.policy.dtype`` loaded). ``null`` leaves it to ``trainer.precision``.
        rollout_weights: ``"replica"`` (default): rollouts sample from an unsharded copy of the
            policy in the compute dtype, refreshed after each optimizer step; ``"gather"``: from the
            sharded policy, which gathers each layer at every decoded token (slow; for models
            whose bf16 copy does not fit a device). See the module docstring.
        reference_weights: ``"sharded"`` (default): the frozen reference model is sharded like the
            policy; ``"unsharded"``: every device keeps a whole copy in the compute dtype, so the
            reference pass gathers no weights.
        activation_checkpointing: recompute the policy's decoder layers in the backward pass.
        cpu_offload: keep sharded parameters and gradients in CPU memory.
        sharding_strategy: ``"FULL_SHARD"``, ``"SHARD_GRAD_OP"``, ``"HYBRID_SHARD"``, ``"NO_SHARD"``.
        state_dict_type: ``"full"`` (one checkpoint file, portable to any device count) or
            ``"sharded"`` (a directory with one shard per rank).
        **kwargs: other arguments of :class:`~lightning.pytorch.strategies.FSDPStrategy` and of
            ``FullyShardedDataParallel``.
    """

    def __init__(
        self,
        mixed_precision: Literal["bf16", "fp16"] | None = "bf16",
        rollout_weights: Literal["replica", "gather"] = "replica",
        reference_weights: Literal["sharded", "unsharded"] = "sharded",
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        sharding_strategy: str = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            mixed_precision=mixed_precision_config(mixed_precision),
            cpu_offload=cpu_offload,
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            **kwargs,
        )
        if rollout_weights not in ("replica", "gather"):
            raise ValueError(f"rollout_weights: {rollout_weights!r} is not 'replica' or 'gather'.")
        self.rollout_weights = rollout_weights
        if reference_weights not in ("sharded", "unsharded"):
            raise ValueError(f"reference_weights: {reference_weights!r} is not 'sharded' or 'unsharded'.")
        self.reference_weights = reference_weights
        self.activation_checkpointing = activation_checkpointing

    @contextlib.contextmanager
    def model_sharded_context(self) -> Iterator[None]:
        if self.root_device.type != "cpu":
            with super().model_sharded_context():
                yield
            return
        if self.cpu_offload.offload_params:
            raise ConfigError("cpu_offload: the weights already live in CPU memory on a CPU run; set it on CUDA only.")
        # FSDP picks the accelerator unless given a device: on the CPU (gloo: tests, debugging) name it.
        with enable_wrap(
            wrapper_cls=FullyShardedDataParallel,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,
            **self.kwargs,
        ):
            yield

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self.root_device.type != "cpu" or self._state_dict_type != "full":
            return super().lightning_module_state_dict()
        with full_state_dict(self.model):  # Lightning's offloads to the CPU: not from the CPU
            return self.model.state_dict()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if self.root_device.type != "cpu" or self._state_dict_type != "full":
            return super().optimizer_state(optimizer)
        with full_state_dict(self.model):
            return FullyShardedDataParallel.optim_state_dict(self.model, getattr(optimizer, "_optimizer", optimizer))

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        # FSDP reads checkpoints itself, not through the CheckpointIO: a truncated file fails here,
        # naming the checkpoint to resume from instead (grpo_lightning.runtime.checkpoint_io).
        check_checkpoint(checkpoint_path)
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        model = super()._setup_model(model)
        for frozen in ("ref_model", "teacher_model"):  # the frozen models (grpo_lightning.models.policy)
            reference = getattr(self.lightning_module, frozen, None)
            if reference is not None and not is_sharded(reference):
                # Kept whole: on this device, its weights in the dtype the sharded models compute in (its
                # buffers, such as rotary frequencies, keep theirs).
                reference.to(self.root_device)
                compute_dtype = getattr(self.mixed_precision_config, "param_dtype", None)
                if compute_dtype is not None:
                    for parameter in reference.parameters():
                        parameter.data = parameter.data.to(compute_dtype)
        policy = getattr(self.lightning_module, "policy", None)
        if self.activation_checkpointing and policy is not None:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                CheckpointImpl,
                apply_activation_checkpointing,
                checkpoint_wrapper,
            )

            layers = tuple(decoder_layer_classes(policy))
            apply_activation_checkpointing(
                policy,
                checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
                check_fn=lambda module: isinstance(module, layers),
            )
        return model
