"""Whether two math answers are equal by math-verify (the optional ``math`` extra), in a child process.

math-verify's own timeouts use ``signal.alarm``, which only a main thread may set, and without them some
answers take longer than any training step (``10^{10^{10}}``). So the comparisons run in a child process
with those timeouts off; one that runs past ``DEADLINE_SECONDS`` ends the child (its memory with it) and
counts as a mismatch, and the next comparison starts a new child. This works from any thread.

The child's imports (math-verify and sympy) take 0.5 s on a desktop and over 3 s on some GPU images, so a
fit starts it in the background while it loads its model (:func:`start_in_background`): the first
comparison then finds it ready instead of waiting for them.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import queue
import re
import subprocess
import sys
import threading
import warnings

DEADLINE_SECONDS = 5.0
"""Longest a single comparison may take before it counts as a mismatch."""
STARTUP_SECONDS = 120.0
"""Longest the child may take to import math-verify (and sympy)."""
READY = "ready"

UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_lock = threading.RLock()
_child: subprocess.Popen | None = None
_replies: queue.SimpleQueue | None = None
_ready = False  # the child has said READY
_failed_to_start = False


def available() -> bool:
    """Whether math-verify is installed (``pip install 'grpo-lightning[math]'``)."""
    return importlib.util.find_spec("math_verify") is not None


def as_latex(text: str) -> str:
    """``text`` in ``$...$`` unless it has math delimiters already: math-verify's parser reads LaTeX.
    An escaped dollar (``\\$18``, money in MATH's answers) is text, not a delimiter."""
    text = text.strip()
    delimited = UNESCAPED_DOLLAR.search(text) or any(mark in text for mark in ("\\(", "\\["))
    return text if delimited else f"${text}$"


def equivalent(predicted: str, reference: str) -> bool | None:
    """math-verify's verdict on ``predicted`` against the gold ``reference``; ``None`` when it is not installed."""
    if _failed_to_start or not available():
        return None
    with _lock:
        replies = _started()
        if replies is None:
            return None
        try:
            _child.stdin.write(json.dumps([as_latex(predicted), as_latex(reference)]) + "\n")
            _child.stdin.flush()
            reply = replies.get(timeout=DEADLINE_SECONDS)
        except (OSError, queue.Empty):
            reply = None
        if reply is None:  # past the deadline, or the child died (out of memory, say)
            stop()
        return reply == "1"


def start_in_background() -> None:
    """Start the child without waiting for its imports, unless one runs (or math-verify is missing)."""
    if _failed_to_start or not available():
        return
    with _lock:
        if _child is None or _child.poll() is not None:
            stop()  # a child that has exited on its own
            _spawn()


def _spawn() -> None:
    from grpo_lightning.bytecode import child_environment  # here: the child runs this file alone, without the package

    global _child, _replies
    try:
        _child = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env=child_environment(),  # it imports sympy: from the package's bytecode cache, where it keeps one
        )
    except OSError:
        _child = None
        return
    _replies = queue.SimpleQueue()
    threading.Thread(target=_forward, args=(_child.stdout, _replies), daemon=True).start()


def _started() -> queue.SimpleQueue | None:
    """The running child's reply queue, once it is ready; a child is started if none runs (or has
    exited); ``None`` if it cannot start."""
    global _ready, _failed_to_start
    if _child is None or (_ready and _child.poll() is not None):  # none, or one that has exited after its start
        stop()
        _spawn()
    if not _ready:
        try:
            _ready = _child is not None and _replies.get(timeout=STARTUP_SECONDS) == READY
        except queue.Empty:
            _ready = False
    if not _ready:
        stop()
        _failed_to_start = True
        warnings.warn("math-verify did not start (see the error above); answers are compared without it.")
        return None
    return _replies


def _forward(stream, replies: queue.SimpleQueue) -> None:
    """Each line the child writes, then ``None`` when it exits."""
    with stream:
        for line in stream:
            replies.put(line.strip())
    replies.put(None)


@atexit.register
def stop() -> None:
    """End the child; the next comparison starts a new one."""
    global _child, _ready
    with _lock:
        _ready = False
        if _child is not None:
            _child.kill()
            _child.wait()
            with contextlib.suppress(OSError):
                _child.stdin.close()
            _child = None


def serve() -> None:
    """The child: ``READY``, then for each line ``[predicted, reference]`` (JSON) a line ``1`` or ``0``."""
    import logging

    from math_verify import parse, verify

    logging.disable(logging.CRITICAL)  # unparsable model output is common; the verdict is 0 either way
    print(READY, flush=True)
    for line in sys.stdin:
        try:
            predicted, reference = json.loads(line)
            gold, target = parse(reference, parsing_timeout=None), parse(predicted, parsing_timeout=None)
            match = bool(gold and target and verify(gold, target, timeout_seconds=None))
        except Exception:  # noqa: BLE001 - any failure on a model's output is a mismatch
            match = False
        print(int(match), flush=True)


if __name__ == "__main__":
    serve()
