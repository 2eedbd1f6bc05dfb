"""The command line: ``grpo-lightning fit | validate | test | generate | export`` (:mod:`.app`)."""

from __future__ import annotations

from grpo_lightning.import_pause import import_module


def main(args=None, **options):
    """``grpo-lightning``: imported on call, so that the configs and run folders of this package load without Lightning."""
    run = import_module("grpo_lightning.cli.app").main  # the first import with the collector paused
    return run(args, **options)
