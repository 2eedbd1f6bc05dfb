"""The final checkpoint of every fit: however a fit ends, ``last.ckpt`` holds the state after its last
completed optimizer step.

A ``ModelCheckpoint`` saves every ``every_n_train_steps``; Lightning writes ``last.ckpt`` at the end
of a fit only when it never wrote one, so a 120-step fit checkpointed every 50 steps ended with
``last.ckpt`` at step 100. :class:`FinalCheckpoint` (in every ``grpo-lightning fit``; with a plain
Trainer, add it to ``callbacks``) writes ``last.ckpt`` through each ``ModelCheckpoint`` that has
``save_last`` (the first ``ModelCheckpoint`` gets ``save_last`` when none has it) when the fit ends:

- at ``max_steps``, ``max_time`` or an early stop (``trainer.should_stop``): in ``on_train_end``;
- on SIGTERM (a scheduler's time limit, ``timeout``): Lightning's own handler lets the step in
  progress finish, then raises ``SIGTERMException``; the checkpoint is written in ``on_exception``;
- on SIGINT (Ctrl+C): the first one stops the same way as SIGTERM; a second one stops at once,
  without a checkpoint (Lightning's ``KeyboardInterrupt`` handling).

Files are written through the trainer's ``CheckpointIO`` (atomic under
:class:`~grpo_lightning.runtime.checkpoint_io.AtomicCheckpointIO`). A fit stopped by a signal exits with status
128 + the signal's number (143 for SIGTERM, 130 for SIGINT), not 0: it did not reach its end.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info


class FinalCheckpoint(Callback):
    """Write ``last.ckpt`` when a fit ends (see the module docstring). ``stopped_by``: the signal
    that stopped the fit (``"SIGTERM"``, ``"SIGINT"``) or ``None``."""

    def __init__(self) -> None:
        self.stopped_by: str | None = None
        self._sigint: bool = False
        self._previous_sigint: Any = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        if checkpoints and not any(c.save_last for c in checkpoints):
            checkpoints[0].save_last = True

    # ------------------------------------------------------------------ when the fit ends

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore_sigint()
        self.save_last(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return  # an error in the middle of a step: its state is not one to continue from
        self.stopped_by = "SIGINT" if self._sigint else "SIGTERM"
        number = signal.SIGINT if self._sigint else signal.SIGTERM
        if trainer.global_step > 0:  # none before the first step: the start model is not a run's result
            self.save_last(trainer)
        exception.code = 128 + int(number)  # SIGTERMException is a SystemExit of status 0 otherwise

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._restore_sigint()

    @staticmethod
    def save_last(trainer) -> None:
        """Write ``last.ckpt`` through each ``ModelCheckpoint`` with ``save_last`` that has not saved
        the current step yet (every process calls it: saving is collective)."""
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint) or not callback.save_last:
                continue
            if callback._last_global_step_saved == trainer.global_step and callback.last_model_path:
                continue
            candidates = callback._monitor_candidates(trainer)
            if callback.save_last == "link":  # a link to a file of this step, not to an older one
                callback._save_checkpoint(trainer, callback.format_checkpoint_name(candidates))
            callback._save_last_checkpoint(trainer, candidates)

    @staticmethod
    def continue_last_checkpoint(trainer) -> None:
        """A fit resumed from a checkpoint in its own checkpoint folder writes its ``last.ckpt`` over the
        one there. Lightning restores where that file is only for the folder path the checkpoint recorded,
        so a run folder copied or moved wrote ``last-v1.ckpt`` beside a ``last.ckpt`` left at the step it
        resumed from (called after the restore, before the first step)."""
        if not trainer.ckpt_path:
            return
        resumed = Path(trainer.ckpt_path).resolve()
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint) or not callback.save_last or callback.last_model_path:
                continue
            if callback.dirpath and resumed.parent == Path(callback.dirpath).resolve():
                last = callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)
                if Path(last).is_file():
                    callback.last_model_path = last

    # ------------------------------------------------------------------ SIGINT as a graceful stop

    def on_train_start(self, trainer, pl_module) -> None:
        self.continue_last_checkpoint(trainer)
        # Lightning registered its SIGTERM handler before this hook and restores every handler at teardown.
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_sigint = signal.getsignal(signal.SIGINT)

        def stop_after_this_step(signum: int, frame: FrameType | None) -> None:
            if self._sigint:  # the second Ctrl+C: at once, without a checkpoint
                raise KeyboardInterrupt
            self._sigint = True
            trainer._signal_connector.received_sigterm = True  # what Lightning's SIGTERM handler sets
            rank_zero_info(
                "\nSIGINT: stopping after the step in progress and saving last.ckpt "
                "(press Ctrl+C again to stop at once, without a checkpoint)"
            )

        signal.signal(signal.SIGINT, stop_after_this_step)

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
