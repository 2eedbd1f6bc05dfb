"""Ending a command's process without the interpreter's teardown.

Once a command has done its work, CPython's finalization tears down every module and collects, several
times over, a heap of about a million objects that torch, Lightning and transformers made: 1.6-2.2 s of a
2-step CLI fit's 8.4 s on the 2-core CPU, paid again by every cell of a sweep. So the command line's
processes, and a sweep's cells forked from its cell server, end as ``os._exit`` ends them, but only after
what a normal exit does first: the non-daemon threads are joined and every ``atexit`` handler runs (a W&B
run's finish, the process pools' shutdown, logging's flush). The files still open are flushed, as their
collection would have done. A command line that fails with an exception ends as usual; a cell whose fit
failed has printed its traceback and ends early too.

:func:`arm` registers the end before any other ``atexit`` handler, so that it runs after all of them; a
process where another was registered first (by a start-up hook of the interpreter's, as on the GPU machine
measured, whose ``certifi`` hook registers one) is left alone. :func:`finished` gives the exit status; without
it the process ends as usual (a Python caller of the CLI's ``main`` keeps its own exit).
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys

#: The file objects that hold written data until flushed (``open`` returns them; ``FileIO`` writes at once).
_BUFFERED = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
_armed = False
_status: int | None = None


def arm() -> bool:
    """Register the early end as this process's first ``atexit`` handler, so that it runs last; whether it is."""
    global _armed
    registered = getattr(atexit, "_ncallbacks", lambda: 1)()  # CPython's count; unknown elsewhere: not armed
    if not _armed and registered == 0:  # a handler registered before ours would not run
        atexit.register(_end)
        _armed = True
    return _armed


def finished(status: int) -> None:
    """The command has done its work: the process ends with ``status`` once the ``atexit`` handlers have run."""
    global _status
    _status = status


def exit_status(stop: SystemExit) -> int:
    """The status the interpreter gives a ``SystemExit``: its code, 0 for ``None``, 1 for a message."""
    return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)


def _end() -> None:
    if _status is None:
        return
    for candidate in gc.get_objects():  # files left open (a reward module's log, say) keep their last writes
        if issubclass(type(candidate), _BUFFERED):  # by type: no attribute of a million objects is read
            try:
                if not candidate.closed:
                    candidate.flush()
            except Exception:  # noqa: BLE001 - a pipe whose reader has gone, a file the user closed under us
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(_status)
