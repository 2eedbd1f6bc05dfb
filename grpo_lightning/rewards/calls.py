"""Calling reward functions contained: a deadline per call, async functions on a private event loop,
and worker processes that a call past its deadline costs their life.

A call is one function on one batch (or, in workers, one chunk of it). When it raises, it is retried
on each *unit* of the batch (one sample, or one group for functions whose score depends on the
group) to find which inputs it fails on; a deadline bounds the call and its retries together.

Standard library only: a worker process imports this module and the reward functions' own modules,
not torch (the ``grpo_lightning.rewards`` package imports it), so it starts in well under a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import multiprocessing
import pickle
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from grpo_lightning.errors import ConfigError

#: How long past its deadline a private event loop may stay busy before it counts as blocked (an
#: async function that calls blocking code cannot be cancelled): its unfinished calls time out.
LOOP_GRACE_S = 1.0


class CallLost(Exception):
    """A call that did not end: no score and no exception came back."""


class RewardTimeout(CallLost):
    """A call ran past its deadline."""


class ResultLost(CallLost):
    """A call returned, in a worker process, a value that could not be sent back to the trainer."""


UNSENDABLE = "returned a value that cannot be sent back from its worker process"


#: What a reward function raises that is its own failure: any ``Exception``, and ``SystemExit``
#: (``sys.exit()`` in a reward ends a call, not the fit). ``KeyboardInterrupt`` stays the user's.
CALL_FAILURES = (Exception, SystemExit)


class RemoteError(Exception):
    """What a reward function raised in a worker process, as text (exceptions need not pickle)."""


def describe_error(error: BaseException) -> str:
    """``"Type: message"`` of an exception, or of the one a worker raised (an exception whose
    ``__str__`` raises too is named by its type alone)."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - a user's exception may fail to print; its type still names it
        return f"{type(error).__name__}: <message could not be printed>"
    return text if isinstance(error, RemoteError) else f"{type(error).__name__}: {text}"


@dataclass
class Outcome:
    """How one call went: what the function returned, or what it raised (or ``RewardTimeout``) and,
    then, each retried unit's ``(unit, returned, error)``."""

    returned: Any = None
    error: BaseException | None = None
    retries: list[tuple[int, Any, BaseException | None]] = field(default_factory=list)


def take(values: Any, rows: Sequence[int]) -> Any:
    """``values`` at ``rows`` for a per-sample column (a slice where the rows are contiguous, so
    tensors stay tensors); any other value as is."""
    if isinstance(values, (str, bytes)) or not (hasattr(values, "__getitem__") and hasattr(values, "__len__")):
        return values
    start = rows[0] if rows else 0
    if list(rows) == list(range(start, start + len(rows))):
        return values[start : start + len(rows)]
    return [values[row] for row in rows]


def arguments(prompts: list, completions: list, columns: dict[str, Any], rows: Sequence[int]) -> tuple:
    """``(prompts, completions, columns)`` of ``rows``."""
    return take(prompts, rows), take(completions, rows), {key: take(value, rows) for key, value in columns.items()}


@dataclass(frozen=True)
class Parameters:
    """What a reward function's signature says: ``named``, its parameters passable by keyword;
    ``any_keyword``, whether it takes ``**kwargs``; ``by_keyword``, whether it gets ``prompts=`` and
    ``completions=`` as keywords, as TRL passes them to every reward function, rather than as its first
    two positional arguments: when it has fewer than two positional parameters (TRL's
    ``reward_func(completions, **kwargs)``, ``reward_func(environments, **kwargs)``), or names ``prompts``
    or ``completions`` elsewhere than first and second (``reward_func(completions, ground_truth, **kwargs)``)."""

    named: frozenset[str] = frozenset()
    any_keyword: bool = False
    by_keyword: bool = False


# Each reward function's parameters, inspected once (functions that cannot be weakly referenced: per call).
_PARAMETERS: weakref.WeakKeyDictionary[Any, Parameters] = weakref.WeakKeyDictionary()


def parameters_of(function: Callable) -> Parameters:
    """``function``'s :class:`Parameters`; a callable without a signature (some builtins): none named, positional."""
    try:
        return _PARAMETERS[function]
    except (KeyError, TypeError):
        pass
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        found = Parameters()
    else:
        positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        starred = any(p.kind is p.VAR_POSITIONAL for p in parameters)
        by_keyword = not starred and (len(positional) < 2 or (positional[:2] != ["prompts", "completions"] and
                                                              bool({"prompts", "completions"} & set(positional))))  # fmt: skip
        found = Parameters(frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)),
                           any(p.kind is p.VAR_KEYWORD for p in parameters), by_keyword)  # fmt: skip
    with contextlib.suppress(TypeError):
        _PARAMETERS[function] = found
    return found


def call(function: Callable, prompts: list, completions: list, columns: dict[str, Any]) -> Any:
    """``function``'s call on a batch (:class:`Parameters` says how prompts and completions go)."""
    if parameters_of(function).by_keyword:
        return function(prompts=prompts, completions=completions, **columns)
    return function(prompts, completions, **columns)


def call_batch(
    function: Callable, prompts: list, completions: list, columns: dict[str, Any], units: list[list[int]],
    first_only: bool,
) -> Outcome:  # fmt: skip
    """Call ``function`` on the batch; if it raises, on each unit (rows of the batch) in turn, up to
    the first that fails too when ``first_only``."""
    try:
        return Outcome(returned=call(function, prompts, completions, columns))
    except CALL_FAILURES as error:  # whatever a user's function raises is its outcome
        outcome = Outcome(error=error)
    for unit, rows in enumerate(units):
        unit_prompts, unit_completions, unit_columns = arguments(prompts, completions, columns, rows)
        try:
            outcome.retries.append((unit, call(function, unit_prompts, unit_completions, unit_columns), None))
        except CALL_FAILURES as error:
            outcome.retries.append((unit, None, error))
            if first_only:
                break
    return outcome


def with_deadline(call: Callable[[], Outcome], timeout_s: float | None) -> Outcome:
    """``call()``, in a daemon thread when there is a deadline: past it the thread is left running
    (Python cannot stop a thread) and the outcome is a ``RewardTimeout``."""
    if timeout_s is None:
        return call()
    box: list[Outcome] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as error:  # noqa: BLE001 - SystemExit and the like: the call's failure
            box.append(Outcome(error=error))

    thread = threading.Thread(target=run, name="reward-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else Outcome(error=RewardTimeout(f"took longer than {timeout_s:g} s"))


async def call_batch_async(
    function: Callable, prompts: list, completions: list, columns: dict[str, Any], units: list[list[int]]
) -> Outcome:
    """:func:`call_batch` for an ``async`` function: its retries are awaited together."""
    try:
        return Outcome(returned=await call(function, prompts, completions, columns))
    except CALL_FAILURES as error:
        outcome = Outcome(error=error)

    async def retry(rows: list[int]) -> Any:
        unit_prompts, unit_completions, unit_columns = arguments(prompts, completions, columns, rows)
        try:
            return await call(function, unit_prompts, unit_completions, unit_columns)
        except SystemExit as error:  # a task that raises it would stop the event loop: returned as a failure
            return error

    results = await asyncio.gather(*(retry(rows) for rows in units), return_exceptions=True)
    for unit, result in enumerate(results):
        failed = isinstance(result, BaseException)
        outcome.retries.append((unit, None if failed else result, result if failed else None))
    return outcome


def _run_until_stopped(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_forever()
    finally:
        loop.close()


class EventLoop:
    """A private event loop in a daemon thread, kept across steps (clients of reward servers bound to
    it stay usable) and replaced when a call leaves it blocked."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    def run(self, calls: list[Callable[[], Any]], timeout_s: float | None) -> list[Outcome]:
        """Await every coroutine ``calls[i]()`` together, each under ``timeout_s``."""
        if self.loop is None or self.loop.is_closed():
            self.loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_run_until_stopped, args=(self.loop,), name="reward-event-loop", daemon=True)
            thread.start()
        outcomes: list[Outcome | None] = [None] * len(calls)

        async def one(index: int) -> None:
            try:
                outcomes[index] = await asyncio.wait_for(calls[index](), timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                outcomes[index] = Outcome(error=RewardTimeout(f"took longer than {timeout_s:g} s"))

        async def every() -> None:
            await asyncio.gather(*(one(index) for index in range(len(calls))))

        future = asyncio.run_coroutine_threadsafe(every(), self.loop)
        try:
            future.result(None if timeout_s is None else timeout_s + LOOP_GRACE_S)
        except FutureTimeout:  # blocked by synchronous code: leave it, start a new loop next time
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.loop = None
        blocked = f"took longer than {timeout_s:g} s (blocking its event loop)" if timeout_s is not None else ""
        return [outcome or Outcome(error=RewardTimeout(blocked)) for outcome in outcomes]

    def close(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop = None


# ---------------------------------------------------------------- worker processes


def _serve(connection: Connection, payload: bytes) -> None:
    """A worker: load the functions, say so, then run ``(index, prompts, completions, columns, units,
    first_only)`` tasks until the pipe closes. Ctrl-C is the trainer's to handle: ignored here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        functions = pickle.loads(payload)
    except Exception as error:  # noqa: BLE001 - reported to the trainer, which raises
        connection.send(describe_error(error))
        return
    connection.send("ready")
    while True:
        try:
            task = connection.recv()
        except (EOFError, OSError):
            return
        index, *rest = task
        outcome = call_batch(functions[index], *rest)
        outcome.error = _sendable(outcome.error)
        outcome.retries = [(unit, returned, _sendable(error)) for unit, returned, error in outcome.retries]
        try:
            connection.send(outcome)
        except Exception as error:  # noqa: BLE001 - what the function returned does not pickle
            connection.send(Outcome(error=ResultLost(f"{UNSENDABLE} ({describe_error(error)})")))


def _received(data: bytes) -> Outcome:
    """The outcome a worker sent; one that does not unpickle here (a class the trainer cannot
    import, a ``__reduce__`` that raises) is the call's failure, not the trainer's."""
    try:
        return pickle.loads(data)
    except CALL_FAILURES as error:  # whatever unpickling a user's value raises
        return Outcome(error=ResultLost(f"{UNSENDABLE} ({describe_error(error)})"))


def _sendable(error: BaseException | None) -> RemoteError | None:
    return None if error is None else RemoteError(describe_error(error))


class _Worker:
    def __init__(self, context: Any, payload: bytes) -> None:
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, payload), name="reward-worker", daemon=True)
        self.process.start()
        child.close()
        try:
            ready = self.connection.recv()
        except (EOFError, OSError):
            ready = f"the process exited with code {self.process.exitcode}"
        if ready != "ready":
            self.stop()
            raise ConfigError(
                f"rewards.execution.workers: a worker process could not load the reward functions ({ready}); "
                "make their modules importable from the working directory, or set rewards.execution.workers 0."
            )

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.connection.close()


class WorkerPool:
    """``size`` worker processes, each holding the pickled reward functions (``payload``), started
    with ``forkserver`` where the platform has it (else ``spawn``): a worker never inherits the
    trainer's threads or CUDA state. A task past its deadline kills its worker, and one that dies
    (a crash in native code) fails its task; either is replaced."""

    def __init__(self, payload: bytes, size: int) -> None:
        methods = multiprocessing.get_all_start_methods()
        self.context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self.payload, self.size = payload, size
        self.workers: list[_Worker] = []

    def run(self, tasks: list[tuple], timeout_s: float | None) -> list[Outcome]:
        """Outcomes of ``(function index, prompts, completions, columns, units, first_only)`` tasks, in order."""
        while len(self.workers) < self.size:
            self.workers.append(_Worker(self.context, self.payload))
        outcomes: list[Outcome | None] = [None] * len(tasks)
        pending, idle = deque(range(len(tasks))), list(range(self.size))
        busy: dict[int, tuple[int, float]] = {}  # worker -> (task, deadline)
        while pending or busy:
            while pending and idle:
                worker, task = idle.pop(), pending.popleft()
                self._send(worker, tasks[task])
                busy[worker] = (task, time.monotonic() + timeout_s if timeout_s is not None else float("inf"))
            soonest = min(deadline for _, deadline in busy.values())
            ready = wait([self.workers[w].connection for w in busy], None if soonest == float("inf") else
                         max(0.0, soonest - time.monotonic()))  # fmt: skip
            for worker, (task, deadline) in list(busy.items()):
                connection = self.workers[worker].connection
                if connection in ready or connection.poll():
                    try:
                        received = connection.recv_bytes()
                    except (EOFError, OSError):
                        self.workers[worker].process.join(5)
                        code = self.workers[worker].process.exitcode
                        outcomes[task] = Outcome(error=CallLost(f"ended its worker process (exit code {code})"))
                        self._replace(worker)
                    else:
                        outcomes[task] = _received(received)
                elif time.monotonic() >= deadline:
                    outcomes[task] = Outcome(error=RewardTimeout(f"took longer than {timeout_s:g} s"))
                    self._replace(worker)
                else:
                    continue
                del busy[worker]
                idle.append(worker)
        return outcomes  # type: ignore[return-value]

    def _send(self, worker: int, task: tuple) -> None:
        """Hand ``task`` to ``worker``, first replacing it if it died while idle (killed, or ended by
        a thread a reward function left running): its pipe is broken, and no task of its was lost."""
        if not self.workers[worker].process.is_alive():
            self._replace(worker)
        try:
            self.workers[worker].connection.send(task)
        except (BrokenPipeError, ConnectionResetError):  # it died between the check and the send
            self._replace(worker)
            self.workers[worker].connection.send(task)

    def _replace(self, worker: int) -> None:
        self.workers[worker].stop()
        self.workers[worker] = _Worker(self.context, self.payload)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []
