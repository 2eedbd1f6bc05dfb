"""The command line: ``grpo-lightning fit | validate | test | generate | export`` (:mod:`.app`)."""

from __future__ import annotations

from grpo_lightning import bytecode, closed_output, process_end
from grpo_lightning.import_pause import import_module


def main(args=None, **options):
    """The command line as a call (a script's, a notebook's, a test's; its process ends as usual): imported on
    call, so that the configs and run folders of this package load without Lightning."""
    run = import_module("grpo_lightning.cli.app").main  # the first import with the collector paused
    return run(args, **options)


def console_main() -> None:
    """``grpo-lightning`` and ``python -m grpo_lightning.cli``: :func:`main` in a process that ends, once it is
    done, without the interpreter's teardown (:mod:`grpo_lightning.process_end`), and where a closed stdout or
    stderr silences the output, never the work (:mod:`grpo_lightning.closed_output`); Python's bytecode goes to
    the package's cache where it may not write its own (:mod:`grpo_lightning.bytecode`)."""
    bytecode.use_own_bytecode_cache()  # before torch is imported
    closed_output.guard_standard_streams()  # before Lightning's import makes its logging handler
    process_end.arm()
    try:
        main()
    except SystemExit as stop:
        process_end.finished(process_end.exit_status(stop))
        raise
    process_end.finished(0)
