"""Output is a courtesy: a closed stdout or stderr silences a command's printing, never stops its work.

A fit piped to a reader that exits early (``| head``), or whose ``tee`` died with the Ctrl+C that stops the
fit, writes to a closed pipe: Python ignores SIGPIPE, so the write raises ``BrokenPipeError`` (a terminal
that hung up raises ``OSError`` EIO) wherever it happens, in a progress bar's refresh in the middle of a
step, and the fit ended without its checkpoint. :func:`guard_standard_streams` puts ``sys.stdout`` and
``sys.stderr`` behind :class:`GuardedStream`: the first write or flush that fails points the stream's file
descriptor at ``os.devnull``, as CPython's documentation advises for SIGPIPE, so that every later write to
it goes nowhere, whoever makes it (a progress bar, a logging handler, native code, the interpreter's last
flush at exit, which would otherwise end the process with status 120). When stdout closes, stderr says so
in one line. Installed before Lightning is imported, so that the handlers it makes then hold the guarded
streams.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class GuardedStream:
    """A text stream that, once a write or flush to it fails with an ``OSError``, sends its file descriptor's
    output to ``os.devnull`` for the rest of the process; every other attribute is the stream's own."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as error:
            self._silence(error)
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            self._silence(error)

    def _silence(self, error: OSError) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        self._stream.flush()  # what the stream still holds goes to devnull, not to the next flush's error
        if self._name == "stdout" and sys.stderr is not None:  # None: the process started with stderr closed
            notice = f"stdout is closed ({error.strerror}): the rest of the output is dropped, the work goes on\n"
            sys.stderr.write(notice)
            sys.stderr.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_standard_streams() -> None:
    """Put ``sys.stdout`` and ``sys.stderr`` behind :class:`GuardedStream` (each one that has a file descriptor)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream) and _has_descriptor(stream):
            setattr(sys, name, GuardedStream(stream, name))


def _has_descriptor(stream: TextIO) -> bool:
    try:
        stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return True
