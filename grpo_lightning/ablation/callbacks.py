"""``ValidateBeforeTraining``: the Lightning callback every cell adds (``validate_before_training``),
so reports show ``val/*`` of the start model. The sweep runner itself does not import Lightning."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback


class ValidateBeforeTraining(Callback):
    """Run the validation loop once before the first training step, so ``val/*`` has a
    value for the untrained model (logged at step 0, before any training metric)."""

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step > 0:  # resumed from a checkpoint: the untrained model is gone
            return
        loop = trainer.fit_loop.epoch_loop.val_loop
        trainer.validating = True
        loop.run()
        trainer.training = True
