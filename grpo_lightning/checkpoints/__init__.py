"""Checkpoints: the final checkpoint of every fit, exact resume and export (their files: :mod:`grpo_lightning.runtime.checkpoint_io`)."""
