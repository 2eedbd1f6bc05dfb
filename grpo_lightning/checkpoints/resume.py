"""State an exact resume needs beyond weights, optimizer and loops: the random generators' states,
gathered over every process into the checkpoint; and validation kept apart from that state
(:meth:`ExactResume.apart_from_training`)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from grpo_lightning.models.fingerprint import CHECKPOINT_KEY, check_same_base
from grpo_lightning.models.lora import has_adapters, trainable_keys
from grpo_lightning.rollout.types import RolloutBuffer


def rng_state() -> dict[str, Any]:
    """States of the global generators: torch (CPU and the current CUDA device), numpy, python."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if cuda else None,
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    random.setstate(state["python"])


def _process_group_ready() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_over_ranks(value: Any) -> list[Any]:
    """``value`` of every process, by global rank (every process must call it)."""
    if not _process_group_ready():
        return [value]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, value)
    return gathered


def min_over_ranks(value: int, device: torch.device) -> int:
    """The smallest ``value`` over all processes (every process must call it); ``value`` alone
    outside a multi-process run. ``device``: where the collective's tensor lives."""
    if not _process_group_ready():
        return value
    tensor = torch.tensor(value, device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN)
    return int(tensor)


class ExactResume:
    """LightningModule hooks of an exact resume: every process's :meth:`training_state` goes into
    the checkpoint under ``"training_state"`` (a list by global rank) and comes back from it; the
    RNG states are set in ``on_train_start``, after everything a resumed fit does before its first
    batch (loading, data loader iterators), so the rollouts draw the numbers the uninterrupted run drew.

    Lightning saves the rest: weights, optimizer, scheduler, loop progress, and the data position
    of a resumable train loader.

    Validation runs :meth:`apart_from_training`, so that training does not depend on it.
    """

    _resume_rng: dict[str, Any] | None = None
    #: While validating: the generators' states and :meth:`validation_counters` from before it.
    _before_validation: tuple[dict[str, Any], dict[str, Any]] | None = None

    def training_state(self) -> dict[str, Any]:
        """This process's state beyond weights, optimizer and loops; subclasses add theirs."""
        return {"rng": rng_state()}

    def validation_counters(self) -> dict[str, Any]:
        """The attributes of training's state that validation advances too, by name; subclasses add theirs."""
        return {}

    @contextlib.contextmanager
    def apart_from_training(self) -> Iterator[None]:
        """Leave training's randomness as it was before the validation inside the block: this process's
        global generators (:func:`rng_state`; under DDP each rank's own) and :meth:`validation_counters`
        are restored after it, and a checkpoint saved inside it holds them. A fit then trains the same
        whether and wherever it validates (before the first step, every ``val_check_interval`` steps, at
        the end), and a fit resumed from a checkpoint saved at a step that validates (``ModelCheckpoint``
        saves before that step's validation; the resumed fit does not validate there) is exact."""
        self._before_validation = (rng_state(), self.validation_counters())
        try:
            yield
        finally:
            rng, counters = self._before_validation
            self._before_validation = None
            set_rng_state(rng)
            for name, value in counters.items():
                setattr(self, name, value)

    def load_training_state(self, state: dict[str, Any]) -> None:
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        self._resume_rng = state["rng"] if fitting else None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = self.training_state()
        if self._before_validation is not None:  # saved while validating: the state training goes on from
            rng, counters = self._before_validation
            state.update(rng=rng, **counters)
        checkpoint["training_state"] = gather_over_ranks(state)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("training_state")
        if states and self.global_rank < len(states):
            self.load_training_state(states[self.global_rank])

    def on_train_start(self) -> None:
        if self._resume_rng is not None:
            set_rng_state(self._resume_rng)
            self._resume_rng = None


class GroupPolicyState(ExactResume):
    """The checkpoint hooks of :class:`~grpo_lightning.training.module.GroupPolicyOptimization`: the frozen
    reference model (and under LoRA the frozen base weights) is left out (reloaded from ``model``), a
    distillation teacher too (reloaded from ``teacher``), and the training state holds the generated-token,
    rollout and generation-batch counts, the metrics of a step in progress and every
    :class:`~grpo_lightning.rollout.types.RolloutBuffer` attribute by name (DAPO's dynamic-sampling buffer)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("state_dict", {})
        # LoRA: the frozen base weights are reloaded from ``model`` too; the adapters are kept.
        kept = trainable_keys(self.policy, "policy.") if has_adapters(self.policy) else None
        frozen = [k for k in state if kept is not None and k.startswith("policy.") and k not in kept]
        for key in [k for k in state if k.startswith(("ref_model.", "teacher_model."))] + frozen:
            del state[key]
        checkpoint[CHECKPOINT_KEY] = getattr(self.policy, "base_fingerprint", None)  # what is reloaded from ``model``
        super().on_save_checkpoint(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint whose base (the weights ``model`` names, reloaded for the reference model
        and LoRA's frozen base) is not the one it was trained from (:func:`check_same_base`)."""
        check_same_base(checkpoint.get(CHECKPOINT_KEY), getattr(self.policy, "base_fingerprint", None),
                        self.model_name, "--ckpt_path", "Put the weights the run started from back at that path "
                        "(a hub model: the revision it had then), or start a new fit.")  # fmt: skip
        super().on_load_checkpoint(checkpoint)

    def training_state(self) -> dict[str, Any]:
        buffers = {name: value for name, value in vars(self).items() if isinstance(value, RolloutBuffer)}
        return {
            **super().training_state(),
            "generated_tokens": self.generated_tokens,
            "compute": self.compute.state_dict(),
            "rollouts": self.rollouts,
            "policy_version": self.policy_version,
            "logged_steps": self.logged_steps,
            "generation_batches": self.generation_batches,
            "trained_rollouts": self.trained_rollouts,
            "step_metrics": self.step_metrics.state_dict(),
            "nonfinite": self.nonfinite.state_dict(),
            "buffers": {name: buffer.state_dict() for name, buffer in buffers.items()},
        }

    def validation_counters(self) -> dict[str, Any]:
        # Validation's generate() calls count too: the number is part of the keys of keyed sampling.
        return {**super().validation_counters(), "rollouts": self.rollouts}

    def load_training_state(self, state: dict[str, Any]) -> None:
        super().load_training_state(state)
        self.generated_tokens, self.rollouts = state["generated_tokens"], state.get("rollouts", 0)
        self.policy_version = state.get("policy_version", self.policy_version)
        self.compute.load_state_dict(state.get("compute", {}))
        self.logged_steps = state.get("logged_steps", self.trainer.global_step if self._trainer else 0)
        self.generation_batches = state.get("generation_batches", self.logged_steps)
        self.trained_rollouts = state.get("trained_rollouts", self.logged_steps)
        self.nonfinite.load_state_dict(state.get("nonfinite", {}))
        self.step_metrics.load_state_dict(state["step_metrics"])
        for name, buffer in state.get("buffers", {}).items():
            if isinstance(getattr(self, name, None), RolloutBuffer):
                getattr(self, name).load_state_dict(buffer)
            elif buffer.get("kept"):
                rank_zero_warn(dropped_buffer_message(name, buffer))


def dropped_buffer_message(name: str, buffer: dict[str, Any]) -> str:
    """What a resumed fit that holds no buffer ``name`` says of the checkpoint's rollouts in it."""
    held = len(buffer["kept"])
    k = buffer.get("max_staleness")
    if name == "stale_queue" or k is not None:  # grpo_lightning.rollout.stale.StaleQueue
        k = k if k is not None else held
        return (f"The checkpoint holds {held} rollouts queued by StaleRollouts(max_staleness={k}) ({name!r}), and this "
                "fit queues none (no StaleRollouts callback, or max_staleness=1): they are dropped, so the batches "
                f"they were sampled from are never trained on. To train on them, resume with StaleRollouts(max_staleness={k}) "
                "(--config rollout/bounded_staleness).")  # fmt: skip
    return (f"The checkpoint holds {held} rollouts in {name!r}, a buffer this module does not have (another variant "
            "or settings than the checkpoint's): they are dropped.")
