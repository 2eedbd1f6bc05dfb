"""When a fit validates and checkpoints: at optimizer steps, and validation when training ends.

Lightning counts an integer ``val_check_interval`` in training batches. Here a batch is one
rollout, which makes ``ppo_epochs x minibatches`` optimizer steps, and DAPO's dynamic sampling
draws several batches for one update; counted in batches, the arms of a sweep would validate at
different points of training, and the last validation could fall well before the end. So every
module of the family schedules validation itself (:meth:`GroupPolicyOptimization.configure_callbacks`):

* an integer ``val_check_interval`` counts optimizer steps (``trainer.global_step``) over the
  whole fit, whatever the epochs: validation runs after the first batch whose update reaches a
  multiple of it. Where updates make several steps, the interval is best a multiple of them; a
  validation that falls later than the multiple is named once in a warning;
* a fraction of an epoch, or a time, keeps Lightning's schedule;
* either way, training ends with a validation (``max_steps``, the last epoch, an early stop or
  ``max_time``) unless one ran at that step, so the last ``val/*`` is that of the final weights.

A batch without an update (DAPO filling its batch) never validates: the weights did not change.

Each validation of a fit (the sanity check, the one before the first step, those of the schedule)
runs inside the module's ``apart_from_training``
(:meth:`~grpo_lightning.checkpoints.resume.ExactResume.apart_from_training`): it leaves the random
generators and the rollout count as it found them, so training does not depend on validation, and a
fit resumed from a checkpoint of a step that validated is exact.

``ModelCheckpoint(every_n_train_steps=n)`` counts optimizer steps too, but saves only where
``global_step`` is a multiple of ``n``: with four steps per rollout and ``n = 50`` it would save at
steps 100, 200, ... only. :class:`CheckpointSchedule` also saves after an update that stepped over
a multiple of ``n``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn


def counts_optimizer_steps(trainer: Any) -> bool:
    """Whether ``trainer.val_check_interval`` is a number of steps (an integer, not a time)."""
    interval = trainer.val_check_interval
    return isinstance(interval, int) and not isinstance(interval, bool) and getattr(trainer, "_val_check_time_interval", None) is None


def training_ends(trainer: Any) -> bool:
    """Whether the fit stops after the current batch: ``max_steps`` reached, the last batch of the
    last epoch, or a stop asked for (early stopping, ``max_time``) that the loop will honour."""
    if 0 < trainer.max_steps <= trainer.global_step:
        return True
    fit_loop = trainer.fit_loop
    if trainer.should_stop and getattr(fit_loop, "_can_stop_early", True):
        return True
    last_epoch = trainer.max_epochs is not None and trainer.max_epochs > 0 and trainer.current_epoch + 1 >= trainer.max_epochs
    return last_epoch and fit_loop.epoch_loop.batch_progress.is_last_batch


class ValidationSchedule(Callback):
    """Validation every ``val_check_interval`` optimizer steps and at the end of training (see the
    module docstring). It replaces the training loop's own decision for the fit it is attached to, and
    runs each validation of that fit inside ``pl_module.apart_from_training()`` where the module has one."""

    def __init__(self) -> None:
        self.last_validated: int | None = None  # the optimizer step of the last validation
        self._warned = False

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and counts_optimizer_steps(trainer):
            # Counted over the whole fit: Lightning's check of the interval against one epoch's batches does not apply.
            trainer.check_val_every_n_epoch = None
        apart = getattr(pl_module, "apart_from_training", None)
        if stage == "fit" and apart is not None:
            # Every run of the fit's validation loop (its data loader's iterator draws from the generators too).
            loop = trainer.fit_loop.epoch_loop.val_loop
            run = type(loop).run.__get__(loop)

            def run_apart() -> Any:
                with apart():
                    return run()

            loop.run = run_apart

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            trainer.fit_loop.epoch_loop.val_loop.__dict__.pop("run", None)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        loop = trainer.fit_loop.epoch_loop
        lightning_decides = type(loop)._should_check_val_fx.__get__(loop)
        loop._should_check_val_fx = lambda data_fetcher: self.due(trainer, lightning_decides, data_fetcher)
        # The validation before training (or the one of the run resumed from) was at this step.
        self.last_validated = trainer.global_step

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        trainer.fit_loop.epoch_loop.__dict__.pop("_should_check_val_fx", None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        trainer.fit_loop.epoch_loop.__dict__.pop("_should_check_val_fx", None)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.last_validated = trainer.global_step

    def due(self, trainer: Any, lightning_decides: Any, data_fetcher: Any) -> bool:
        """Whether to validate after the batch that just ended."""
        step = trainer.global_step
        if not trainer.enable_validation or step == self.last_validated:
            return False
        if not counts_optimizer_steps(trainer):
            return lightning_decides(data_fetcher) or training_ends(trainer)
        interval = trainer.val_check_interval
        last = self.last_validated or 0
        reached = step // interval > last // interval
        if reached and step % interval and not self._warned:
            self._warned = True
            rank_zero_warn(
                f"val_check_interval {interval} counts optimizer steps, and this fit's updates did not stop at "
                f"step {step // interval * interval}: it validated at step {step}. Give --trainer.val_check_interval "
                "a multiple of the optimizer steps each rollout makes (ppo_epochs x rollout / minibatch_size), so "
                "that runs validate at the same steps."
            )
        return reached or training_ends(trainer)


class CheckpointSchedule(Callback):
    """Save through each ``ModelCheckpoint`` with ``every_n_train_steps = n`` after an update that
    stepped over a multiple of ``n`` (where ``global_step`` is a multiple, the ``ModelCheckpoint``
    saves itself; it runs after this callback)."""

    def __init__(self) -> None:
        self.previous_step = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.previous_step = trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step, previous = trainer.global_step, self.previous_step
        self.previous_step = step
        for checkpoint in trainer.checkpoint_callbacks:
            every = getattr(checkpoint, "_every_n_train_steps", 0) if isinstance(checkpoint, ModelCheckpoint) else 0
            if every < 1 or step % every == 0 or step // every == previous // every:
                continue
            if checkpoint._should_skip_saving_checkpoint(trainer):
                continue
            candidates = checkpoint._monitor_candidates(trainer)  # what ModelCheckpoint.on_train_batch_end saves
            checkpoint._save_topk_checkpoint(trainer, candidates)
            checkpoint._save_last_checkpoint(trainer, candidates)
