"""Stale rollouts: each rollout sampled with the weights the policy had ``k`` updates before the
one that trains on it (``max_staleness``, 1 to 16), as in an asynchronous pipeline whose sampler
runs ``k`` policy versions ahead of the trainer.

``k = 1`` (verl's and OpenRLHF's one-step off-policy pipelines) makes rollout ``k`` come from the
weights after ``k - 1`` update phases instead of ``k``. Before each update this callback copies the
policy into a replica (:meth:`grpo_lightning.rollout.generation.RolloutWeights.snapshot`), and
training rollouts sample from that replica until the next one. With ``overlap`` (the default on
CUDA) the next batch's rollout is generated on a worker thread and its own CUDA stream
(:class:`grpo_lightning.rollout.generation.ahead.SamplesAhead`) while the current batch's reference
pass and update run: when ``training_step`` takes its rollout, the callback snapshots the weights its
update starts from and starts the next batch's rollout from them. The samples are those of the run
without overlap (with ``rollout_seed``, the same tokens), and the ``rollout`` phase
(``perf/rollout_s``) is the wait for the worker. The next batch is the one the project's dataloaders
(:class:`grpo_lightning.data.loaders.ResumableDataLoader`) hold ahead; the first batch of each epoch
and the one after a validation are sampled in place, and so is every batch of another dataloader. A
``training_step`` that samples otherwise than the base module's turns the overlap off, with a
warning. Without overlap (the CPU's default) the same staleness lets a variant's learning with
samples a step old be measured anywhere. The snapshot goes into checkpoints (under
:data:`SNAPSHOT_KEY`: a copy of the weights in the sampling dtype, with LoRA the merged model's), so
the first rollout of a resumed fit samples from the weights the uninterrupted fit's did.

``k >= 2`` keeps the sampled rollouts in a queue (:class:`StaleQueue`): each training batch is
sampled with the current weights and queued, and the update trains on the one queued ``k`` batches
before (the first ``k`` batches only sample: no optimizer step). The queue goes into checkpoints
(it is a :class:`~grpo_lightning.rollout.types.RolloutBuffer` of the module), so a fit resumed from
one trains on the rollouts the uninterrupted fit trained on; nothing is rebuilt. Resumed with another
``k`` the queue drops its oldest rollouts or fills, with a warning (:meth:`StaleQueue.load_state_dict`;
partial rollouts are refused); resumed without this callback, the module warns that it drops them. Without overlap.
With ``partial_rollouts`` generation goes on across the updates: a batch's completions are sampled
in ``k`` chunks, the first cut from its sampled rollout (the tokens a chunk-long sample draws; the
rest is dropped), each next one at the start of a later batch with that batch's weights, the prefix
recomputed (:mod:`grpo_lightning.rollout.partial`, by the engine the rollouts sample with: the static-cache
engine or the HF generate path; keyed sampling keys the first chunk only).

The engine records each sampled token's log-prob and policy version (``rollout.sampling_logp``,
``rollout.sampling_version``), so the update's importance correction (``sampling.correction``, e.g.
``token_truncate`` or ``m2po``) and the ``sampling/*`` metrics see the staleness; ``rollout/staleness``
logs how many optimizer steps the sampling weights were behind (with ``k >= 2`` the mean over the
trained tokens, with ``/max`` and ``rollout/version_spread``, the range of the policy versions they
were sampled with). Validation samples from the current policy.

    grpo-lightning fit ... --config configs/rollout/one_step_stale.yaml
    grpo-lightning fit ... --config configs/rollout/bounded_staleness.yaml
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

import math
from collections.abc import Callable

from grpo_lightning.errors import ConfigError, require
from grpo_lightning.rollout.partial import continue_rollouts, cut
from grpo_lightning.rollout.types import Rollout, RolloutBuffer

#: The most policy versions sampling may run ahead of the update.
MAX_STALENESS = 16

#: The checkpoint key of one-step staleness's snapshot (:meth:`RolloutWeights.snapshot_state`).
SNAPSHOT_KEY = "stale_rollouts_snapshot"


def upcoming_batch(trainer: Any) -> Any | None:
    """The training batch after the current one, where the training dataloader tells it ahead
    (:class:`grpo_lightning.data.loaders.ResumableDataLoader`'s ``upcoming``; ``None`` at an epoch's end)."""
    return getattr(trainer.train_dataloader, "upcoming", None)


def sampler_arguments(module: Any, batch: Any, number: int) -> tuple:
    """What the base module's ``generate(batch, group_size, sampling, with_logprobs=True)`` passes
    :meth:`~grpo_lightning.rollout.generation.RolloutSampler.sample` after the model, as rollout ``number``."""
    texts = [module.format_prompt(prompt) for prompt in batch["prompt"]]
    return (module.tokenizer, texts, module.settings.group_size, module.sampling, number, True)


def was_sampled_ahead(module: Any, arguments: tuple) -> bool:
    """Whether the rollout of ``arguments`` was started ahead and not taken yet."""
    if module.rollout_weights.snapshot_version is None:
        return False  # nothing was sampled yet (and asking for the model would take the first snapshot)
    with module.rollout_model() as model:
        return module.sampler.has_ahead(model, *arguments)


def sample_ahead(module: Any, arguments: tuple) -> None:
    """Start the rollout of ``arguments`` on the sampler's worker, from the model training rollouts sample from."""
    with module.rollout_model() as model:
        module.sampler.sample_ahead(model, *arguments)


class StaleQueue(RolloutBuffer):
    """Training rollouts sampled and not yet trained on, oldest first (``parts``), at most
    ``max_staleness`` of them between two updates; a module attribute, so checkpoints hold it."""

    def __init__(self, max_staleness: int, first_chunk: Callable[[Rollout], Rollout] | None = None) -> None:
        super().__init__()
        self.max_staleness = max_staleness
        self.first_chunk = first_chunk  # partial rollouts: what of a sampled rollout is queued
        self.exchanges = 0  # rollouts queued: the callback checks that training_step queues each

    def exchange(self, rollout: Rollout, version: int, metrics: Any) -> Rollout | None:
        """Queue ``rollout`` and return the one queued ``max_staleness`` batches before (on its
        device), logging its staleness against the policy ``version`` into ``metrics``; ``None``
        while the queue fills."""
        self.exchanges += 1
        self.parts.append(rollout if self.first_chunk is None else self.first_chunk(rollout))
        if len(self.parts) <= self.max_staleness:
            return None
        oldest = self.parts.pop(0).to(rollout.device)
        if oldest.sampling_version is not None:
            kept = oldest.completion_mask > 0
            sampled = oldest.sampling_version[kept].float()
            lag = version - sampled
            metrics.update("rollout/staleness", lag.mean(), kept.sum())
            metrics.update("rollout/staleness/max", lag.max(), reduce="max")
            metrics.update("rollout/version_spread", sampled.max() - sampled.min(), reduce="max")
        return oldest

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "max_staleness": self.max_staleness, "partial_rollouts": self.first_chunk is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's queue into this one, whose ``max_staleness`` may differ from the one it
        was saved with: a deeper queue drops its oldest rollouts (each update then trains on the
        rollout ``max_staleness`` batches before, as from the start), a shallower one fills (batches
        that only sample) and either says so; a queue of partial rollouts (or one resumed with them)
        is refused, since its completions were cut in chunks for the saved depth."""
        super().load_state_dict(state)
        k, held, partial = self.max_staleness, len(self.parts), self.first_chunk is not None
        # Checkpoints from before the depth was saved: a queue longer than k tells a deeper one.
        saved = state.get("max_staleness", max(k, held))
        saved_partial = state.get("partial_rollouts", partial)
        if saved == k and saved_partial == partial:
            return
        if partial or saved_partial:
            raise ConfigError(
                f"StaleRollouts: the checkpoint's queue of {held} rollouts was saved with max_staleness={saved}, "
                f"partial_rollouts={str(saved_partial).lower()} and this fit has max_staleness={k}, "
                f"partial_rollouts={str(partial).lower()}: partial rollouts are cut in chunks for their queue's depth, "
                f"so they resume only with the settings they were sampled with; set max_staleness to {saved} and "
                f"partial_rollouts to {str(saved_partial).lower()}, or start a new fit."
            )
        if held > k:
            self.parts = self.parts[held - k :]
            rank_zero_warn(
                f"StaleRollouts: the checkpoint was saved with max_staleness={saved} and this fit has max_staleness={k}: "
                f"the {held - k} oldest of its {held} queued rollouts are dropped (the batches they were sampled from "
                f"are not trained on), so that the next update trains on the rollout {k} batches old. To keep them, "
                f"resume with max_staleness={saved}."
            )
        elif saved < k:
            rank_zero_warn(
                f"StaleRollouts: the checkpoint was saved with max_staleness={saved} and this fit has max_staleness={k}: "
                f"the queue holds {held} rollouts and fills to {k}, so the next {k - held} training batches only sample "
                f"(no optimizer step) before the updates train on rollouts {k} batches old."
            )


class StaleRollouts(Callback):
    """Training rollouts from the weights of ``max_staleness`` update phases before their own.

    Args:
        overlap: sample each next batch's rollout while the current batch trains; ``None``: on CUDA
            with ``max_staleness`` 1 (only then).
        max_staleness: ``k``, 1 to 16: update phases between the weights that sample a rollout and
            the update that trains on it; 1 by a snapshot of the weights, more by a queue of rollouts.
        partial_rollouts: with ``max_staleness`` ``k >= 2``, sample each completion in ``k`` chunks of
            ``ceil(max_new_tokens / k)`` tokens, each with the weights of its batch's start
            (:mod:`grpo_lightning.rollout.partial`): a completion spans up to ``k`` policy versions.
    """

    def __init__(self, overlap: bool | None = None, max_staleness: int = 1, partial_rollouts: bool = False) -> None:
        require(isinstance(max_staleness, int) and 1 <= max_staleness <= MAX_STALENESS,
                f"StaleRollouts.max_staleness: must be an integer from 1 to {MAX_STALENESS} (got {max_staleness!r}); "
                "e.g. 4.")  # fmt: skip
        require(not (overlap and max_staleness > 1), "StaleRollouts.overlap: only one-step staleness samples ahead "
                "on a worker; set overlap to false or max_staleness to 1.")  # fmt: skip
        require(not partial_rollouts or max_staleness > 1, "StaleRollouts.partial_rollouts: a completion continues "
                "across the updates of its queue; set max_staleness to 2 or more.")  # fmt: skip
        self.overlap = False if max_staleness > 1 else overlap
        self.max_staleness, self.partial_rollouts = max_staleness, partial_rollouts
        self._exchanges = 0
        self._snapshot_due = False
        self._ahead_version: int | None = None  # the policy version the rollout sampled ahead saw
        self.sampled_in_place = 0  # with overlap: training batches not sampled ahead
        self._resume_snapshot: dict[str, Any] | None = None  # one step: the checkpoint's snapshot, until loaded

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if self.partial_rollouts:
            require(getattr(module, "environment", None) is None and not module.sampling.beam_search,
                    "StaleRollouts.partial_rollouts: continues sampled completions, not episodes or beams; set it to false.")  # fmt: skip
        if self.max_staleness > 1:  # before a checkpoint's training state is loaded into it

            def first_chunk(rollout: Rollout) -> Rollout:
                return cut(rollout, self.chunk(module), module.tokenizer, module.sampling.end_ids(module.tokenizer))

            module.stale_queue = StaleQueue(self.max_staleness, first_chunk if self.partial_rollouts else None)

    def chunk(self, module: Any) -> int:
        """Tokens of each chunk of a partial rollout: ``ceil(max_new_tokens / k)``."""
        return math.ceil(module.sampling.max_new_tokens / self.max_staleness)

    def _continue_partial(self, module: Any) -> None:
        """Sample the next chunk of the queued rollouts that have fewer than ``k``, the newest ``k - 1``,
        together (one call for all of them, where their chunks have the same bounds). A static engine is
        not grown past one rollout's rows: it serves every rollout at its size (rows are padded to it),
        so the rows of several run in chunks of that size."""
        queue = module.stale_queue
        first = max(0, len(queue.parts) - (self.max_staleness - 1))
        if first == len(queue.parts):
            return
        parts = [part.to(module.device) for part in queue.parts[first:]]
        most = max(len(part.completions) for part in parts)
        with module.rollout_model() as model:

            def engine_for(rows: int) -> Any:  # None: the HF generate path
                return module.sampler.turn_engine(model, min(rows, most), module.sampling)

            queue.parts[first:], added = continue_rollouts(model, module.tokenizer, parts, module.sampling,
                                                           self.chunk(module), module.policy_version, engine_for)  # fmt: skip
        module.generated_tokens += added

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        module.stale_queue = None

    def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        # One step: the weights the next rollout samples from (those the last update started from), so
        # that a resumed fit samples it as the uninterrupted one does. Bounded: the queue is the module's.
        if self.max_staleness == 1 and (snapshot := module.rollout_weights.snapshot_state()) is not None:
            checkpoint[SNAPSHOT_KEY] = snapshot

    def on_load_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        # Loaded at the start of training, once the policy is on its device (and sharded, if it is).
        self._resume_snapshot = checkpoint.get(SNAPSHOT_KEY) if self.max_staleness == 1 else None

    def on_train_start(self, trainer: Any, module: Any) -> None:
        if self._resume_snapshot is not None:
            module.rollout_weights.load_snapshot(module.policy, self._resume_snapshot)
            self._resume_snapshot = None

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        queue = module.stale_queue
        if queue is not None:
            require(queue.exchanges > self._exchanges, "StaleRollouts.max_staleness: this module's training_step "
                    "does not queue its rollouts (exchange_stale); set max_staleness to 1.")  # fmt: skip
            self._exchanges = queue.exchanges

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if self.max_staleness > 1:  # sampled with the current weights, trained on k batches later
            if self.partial_rollouts:
                self._continue_partial(module)
            return
        weights = module.rollout_weights
        weights.stale = True
        multi_turn = getattr(module, "environment", None) is not None
        if self.overlap is None:
            self.overlap = module.device.type == "cuda" and not multi_turn
        if self.overlap and multi_turn:
            raise ConfigError("StaleRollouts.overlap: multi-turn rollouts (environment) are not sampled ahead; set overlap to false.")
        if self.overlap:
            arguments = sampler_arguments(module, batch, module.rollouts)
            sampled_ahead = was_sampled_ahead(module, arguments)
            if module.sampler.ahead.pending > sampled_ahead:  # training_step did not take the last one
                self._stop_overlap(module)
            else:
                return self._sample_ahead(trainer, module, arguments, sampled_ahead)
        if weights.snapshot_version is not None:  # the first rollout takes the starting weights
            self._log_staleness(module, weights.snapshot_version)
        self._snapshot_due = True

    def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
        if self._snapshot_due:  # the weights this step's update starts from: the next rollout's
            module.rollout_weights.snapshot(module.policy, module.policy_version)
            self._snapshot_due = False

    def _stop_overlap(self, module: Any) -> None:
        rank_zero_warn(
            "StaleRollouts: this module's training_step does not sample as the base module's does, so the "
            "rollout sampled ahead was not used; overlap is off for the rest of the fit."
        )
        module.sampler.ahead.clear()
        self.overlap = False
        self._snapshot_due = True  # the weights of this step's update: the next rollout's

    def _sample_ahead(self, trainer: Any, module: Any, arguments: tuple, sampled_ahead: bool) -> None:
        """Have this batch's rollout on the worker (sampled ahead, or now from the last snapshot);
        once ``training_step`` takes it, snapshot the weights its update starts from and start the
        next batch's rollout from them (:meth:`_start_next`)."""
        version = self._ahead_version
        if not sampled_ahead:  # the first batch of an epoch, the one after a validation
            version = module.rollout_weights.snapshot_version  # None: the first rollout
            sample_ahead(module, arguments)
            self.sampled_in_place += 1
        if version is not None:
            self._log_staleness(module, version)
        upcoming = upcoming_batch(trainer)
        if 0 < trainer.max_steps <= trainer.global_step + 1:
            upcoming = None  # the last step: nothing after it
        module.sampler.ahead.on_take = lambda: self._start_next(module, upcoming)

    def _start_next(self, module: Any, upcoming: Any | None) -> None:
        module.sampler.ahead.on_take = None
        module.rollout_weights.snapshot(module.policy, module.policy_version)
        self._ahead_version = None
        if upcoming is not None:
            sample_ahead(module, sampler_arguments(module, upcoming, module.rollouts + 1))  # generate() counts after
            self._ahead_version = module.policy_version

    def _log_staleness(self, module: Any, version: int) -> None:
        module.step_metrics.update("rollout/staleness", float(module.policy_version - version))

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        # Validation samples on the same engine, with rollout numbers (keys of keyed sampling) that training
        # reuses after it (ExactResume.apart_from_training): the batch after it is sampled again, in place.
        module.sampler.ahead.clear()
        self._ahead_version = None
        module.rollout_weights.stale = False  # until the next training batch

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        self._stop(module)

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        self._stop(module)

    def _stop(self, module: Any) -> None:
        module.sampler.ahead.clear()
        module.rollout_weights.stale = False
