"""How reward functions are called (``--model.rewards.execution.*``), and what a failing one does.

A reward function *fails* on a sample when it raises (``SystemExit`` too; on the batch, and then
again when retried on that sample alone, or on its group), returns anything but a finite number that
float32 holds (scores are float32: ``1e39`` would be inf) or ``None`` for it, or runs past
``timeout_s`` (every sample of that call fails). ``on_error`` says what follows:

* ``raise`` (default): :class:`RewardFunctionError`, naming the function, the sample and the failure;
* ``zero``: the sample scores 0 for that function; each function's first failure is warned
  (:class:`RewardFunctionWarning`) and every one counted in ``rewards/<function>/error_rate``;
* ``skip_group``: as ``zero``, and each group with a failed sample is left out of the update
  (``rewards/frac_groups_skipped``); validation, which has no update, scores them 0.

``None`` is no failure: it means "does not apply" and is left out of the weighted reward.

An ``async def`` function (or callable whose ``__call__`` is one) gets the batch as a synchronous
one does; the async functions of a batch are awaited together on a private event loop, kept across
steps, before the synchronous ones run (in order, or in ``workers`` processes).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import pickle
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards.calls import CallLost, EventLoop, Outcome, RewardTimeout, WorkerPool, call_batch
from grpo_lightning.rewards.calls import call_batch_async, describe_error, with_deadline
from grpo_lightning.rewards.calls import arguments as take_rows
from grpo_lightning.rewards.scoring import GROUP_INDEX, RESERVED_COLUMNS, RewardFunction, RewardFunctionError
from grpo_lightning.rewards.scoring import accepts_group_index, check_column_names, names_group_index, passed_keywords
from grpo_lightning.rewards.sandbox.returned_scores import Failure, as_scores, preview

ON_ERROR = ("raise", "zero", "skip_group")


class RewardFunctionWarning(UserWarning):
    """A reward function failed on a sample and ``on_error`` scored it 0 or left its group out."""


@dataclass(frozen=True)
class RewardExecution:
    """How reward functions are called, and what one that fails does (see the module docstring)."""

    on_error: str = "raise"
    """``raise``: stop with an error naming the function and the sample. ``zero``: the sample scores
    0 for that function (warned once per function, counted every step). ``skip_group``: as ``zero``,
    and the sample's group is left out of the update."""

    timeout_s: float | None = None
    """Seconds one call of a reward function may run, with its retries on single samples; past it,
    every sample of the call fails. In the trainer's process the call's thread is left running
    (Python cannot stop a thread); in a worker process (``workers``) the process is killed and replaced."""

    workers: int = 0
    """Processes that run the synchronous reward functions (``forkserver``, else ``spawn``), each
    batch split across them in chunks of whole groups; scores come back in order. Each function must
    pickle: a module-level function, or an instance of a module-level class. 0: in the trainer's process."""

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"rewards.execution.on_error: {self.on_error!r} is not one of {', '.join(ON_ERROR)}.")
        seconds = self.timeout_s
        if seconds is not None and not (isinstance(seconds, numbers.Real) and 0 < seconds < math.inf):
            raise ConfigError(f"rewards.execution.timeout_s: must be seconds > 0 or null, got {self.timeout_s!r}.")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ConfigError(f"rewards.execution.workers: must be an integer >= 0 (0: none), got {self.workers!r}.")

    @classmethod
    def of(cls, value: RewardExecution | dict[str, Any]) -> RewardExecution:
        """``value`` itself, or built from a dict of its fields (a checkpoint's hyperparameters)."""
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(asdict(cls())))
            if unknown:
                raise ConfigError(f"rewards.execution: no option {unknown[0]!r}; give on_error, timeout_s or workers.")
            return cls(**value)
        if not isinstance(value, cls):
            raise ConfigError(f"rewards.execution: give RewardExecution or a dict of its fields, got {value!r}.")
        return value


@dataclass
class RewardScores:
    """``per_function`` ``[N, F]`` float32 (NaN: "does not apply"; 0 where a function failed),
    ``failed`` ``[N, F]``: the samples each function failed on, and ``nan`` ``[N, F]``: those it
    returned NaN for (failures too)."""

    per_function: Tensor
    failed: Tensor
    nan: Tensor


class _Plan(NamedTuple):
    name: str
    function: RewardFunction
    arguments: dict[str, Any]  # the columns it is called with
    groups: list[list[int]]  # rows it is called on together: a worker's chunk holds whole ones
    per_sample: bool  # retried per sample (else per group, as its score depends on the group)

    def units(self) -> list[list[int]]:
        return _units(self.groups, self.per_sample)


def is_async(function: Callable) -> bool:
    """Whether calling ``function`` gives a coroutine to await (``async def``, or such a ``__call__``)."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)


class RewardScorer:
    """Scores completions with reward functions under a :class:`RewardExecution`. Holds what lasts
    across steps: the worker processes, the event loop, which functions have warned, and
    ``nan_counts``: the NaN scores of training rollouts so far, by function (the health checks read them)."""

    def __init__(
        self, execution: RewardExecution = RewardExecution(), functions: Sequence[tuple[str, RewardFunction]] = ()
    ) -> None:
        self.execution = execution
        self.nan_counts: dict[str, int] = {}
        self._warned: set[str] = set()
        self._pool: WorkerPool | None = None
        self._pooled: list[RewardFunction] = []  # the functions the workers hold, in task order
        self._loop = EventLoop()
        weakref.finalize(self, self._loop.close)
        if execution.workers:
            self._payload(functions)  # a function that cannot reach a worker is an error before any work

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None, "_pooled": [], "_loop": EventLoop()}

    def close(self) -> None:
        """Stop the worker processes and the event loop (started again when needed)."""
        if self._pool is not None:
            self._pool.close()
        self._pool, self._pooled = None, []
        self._loop.close()

    # ---------------------------------------------------------------- scoring

    def score(
        self,
        functions: Sequence[tuple[str, RewardFunction]],
        prompts: list[Any],
        completions: list[Any],
        columns: dict[str, list[Any]],
        group_index: Sequence[int] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: Any = None,
    ) -> RewardScores:
        """Score every completion with every function (see :func:`score_completions`)."""
        count = len(completions)
        columns = _checked_columns(prompts, completions, columns, group_index, completion_ids)
        first_only = self.execution.on_error == "raise"  # only the first failing sample is reported
        plans = []
        for name, function in functions:
            arguments = {**columns, **passed_keywords(function, completion_ids, trainer_state)}
            groups, per_sample = [[row] for row in range(count)], True
            if group_index is not None and accepts_group_index(function):
                arguments, groups = {**arguments, GROUP_INDEX: list(group_index)}, _groups(group_index)
                per_sample = first_only or not names_group_index(function)
            plans.append(_Plan(name, function, arguments, groups, per_sample))
        pieces: list[list[tuple[list[int], list[list[int]], Outcome]]] = [[] for _ in plans]
        self._run_async(plans, pieces, prompts, completions)
        self._run_sync(plans, pieces, prompts, completions, first_only)

        per_function = torch.full((count, len(plans)), math.nan, dtype=torch.float32)
        failed = torch.zeros(count, len(plans), dtype=torch.bool)
        nan = torch.zeros(count, len(plans), dtype=torch.bool)
        for index, (plan, parts) in enumerate(zip(plans, pieces)):
            name = plan.name
            values, failures = self._collect(name, parts, prompts, completions)
            per_function[:, index] = torch.tensor(values, dtype=torch.float32)
            nan[[row for failure in failures if failure.nan for row in failure.rows], index] = True
            if failures:
                self._apply_policy(index, name, failures, per_function, failed)
        return RewardScores(per_function, failed, nan)

    def _run_async(self, plans: list[_Plan], pieces, prompts: list, completions: list) -> None:
        """The async functions, awaited together on the private event loop."""
        chosen = [(index, plan) for index, plan in enumerate(plans) if is_async(plan.function)]
        calls = [functools.partial(call_batch_async, plan.function, prompts, completions, plan.arguments, plan.units())
                 for _, plan in chosen]  # fmt: skip
        for (index, plan), outcome in zip(chosen, self._loop.run(calls, self.execution.timeout_s) if calls else []):
            pieces[index].append((list(range(len(completions))), plan.units(), outcome))

    def _run_sync(self, plans: list[_Plan], pieces, prompts: list, completions: list, first_only: bool) -> None:
        """The other functions, one after the other: here, or split across the worker processes."""
        chosen = [(index, plan) for index, plan in enumerate(plans) if not is_async(plan.function)]
        if not self.execution.workers:
            for index, plan in chosen:
                units = plan.units()
                call = functools.partial(call_batch, plan.function, prompts, completions, plan.arguments, units,
                                         first_only)  # fmt: skip
                outcome = with_deadline(call, self.execution.timeout_s)
                pieces[index].append((list(range(len(completions))), units, outcome))
            return
        if not chosen or not completions:
            return
        pool = self._worker_pool([(plan.name, plan.function) for _, plan in chosen])
        tasks, owners = [], []
        for position, (index, plan) in enumerate(chosen):
            for rows, units in _chunks(plan.groups, self.execution.workers, plan.per_sample):
                tasks.append((position, *take_rows(prompts, completions, plan.arguments, rows), units, first_only))
                owners.append((index, rows, [[rows[i] for i in unit] for unit in units]))
        for (index, rows, units), outcome in zip(owners, pool.run(tasks, self.execution.timeout_s)):
            pieces[index].append((rows, units, outcome))

    def _worker_pool(self, functions: list[tuple[str, RewardFunction]]) -> WorkerPool:
        """The workers, started with ``functions`` (again when they change)."""
        held = [function for _, function in functions]
        if self._pool is None or len(held) != len(self._pooled) or any(a is not b for a, b in zip(held, self._pooled)):
            if self._pool is not None:
                self._pool.close()
            self._pool, self._pooled = WorkerPool(self._payload(functions), self.execution.workers), held
            weakref.finalize(self, self._pool.close)
        return self._pool

    @staticmethod
    def _payload(functions: Sequence[tuple[str, RewardFunction]]) -> bytes:
        sync = [(name, function) for name, function in functions if not is_async(function)]
        for name, function in sync:
            try:
                pickle.dumps(function)
            except Exception as error:  # any pickling failure says the same
                raise ConfigError(
                    f"rewards.execution.workers: reward function {name!r} cannot be sent to a worker process "
                    f"({describe_error(error)}); define it at the top level of an importable module (or make it "
                    "an instance of such a class), or set rewards.execution.workers 0."
                ) from error
        return pickle.dumps([function for _, function in sync])

    # ---------------------------------------------------------------- outcomes and the policy

    def _collect(self, name: str, parts, prompts: list, completions: list) -> tuple[list[float], list[Failure]]:
        """The function's scores (NaN where it did not score) and its failures, from its calls' outcomes."""
        values, failures = [math.nan] * len(completions), []

        def where(rows: list[int], what: str | None = None) -> str:
            row = rows[0]
            shown = f"prompt={preview(prompts[row])!r}, completion={preview(completions[row])!r}"
            return f"{what or _where(rows)}; {shown}"

        def take_scores(returned: Any, rows: list[int]) -> None:
            scores, bad = as_scores(name, returned, rows, where)
            failures.extend(bad)
            for row, score in zip(rows, scores):
                values[row] = score

        for rows, units, outcome in parts:
            if outcome.error is None:
                take_scores(outcome.returned, rows)
            elif isinstance(outcome.error, CallLost):  # past the deadline, or its worker process died
                limit = " (rewards.execution.timeout_s)" if isinstance(outcome.error, RewardTimeout) else ""
                batch = f"a batch of {len(rows)} completions{limit}"
                failures.append(Failure(rows, f"reward function {name!r} {outcome.error} on {where(rows, batch)}."))
            elif all(error is None for _, _, error in outcome.retries):
                batch = f"the batch of {len(rows)} (no sample fails alone)"
                message = f"reward function {name!r} raised {describe_error(outcome.error)} at {where(rows, batch)}."
                failures.append(Failure(rows, message, outcome.error))
            else:
                for unit, returned, error in outcome.retries:
                    if error is not None:
                        message = f"reward function {name!r} raised {describe_error(error)} at {where(units[unit])}."
                        failures.append(Failure(units[unit], message, error))
                    else:
                        take_scores(returned, units[unit])
        return values, sorted(failures, key=lambda failure: min(failure.rows))

    def _apply_policy(self, index: int, name: str, failures: list[Failure], per_function: Tensor, failed: Tensor):
        first = failures[0]
        if self.execution.on_error == "raise":
            raise RewardFunctionError(first.message) from first.error
        rows = sorted({row for failure in failures for row in failure.rows})
        per_function[rows, index] = 0.0
        failed[rows, index] = True
        if name not in self._warned:
            self._warned.add(name)
            dropped = self.execution.on_error == "skip_group"
            consequence = "scored 0" + (" and its group left out of the update" if dropped else "")
            warnings.warn(
                f"{first.message} It is {consequence} (rewards.execution.on_error={self.execution.on_error}); "
                f"{len(rows)} of {per_function.shape[0]} samples failed in this batch. Further failures of {name!r} "
                f"are counted in rewards/{name}/error_rate, not shown.",
                RewardFunctionWarning,
                stacklevel=4,
            )

    # ---------------------------------------------------------------- training

    def contain(self, module: Any, rollout: Any, scores: RewardScores) -> Any:
        """After a training rollout is scored: count its NaN scores, log each function's
        ``error_rate`` and, under ``skip_group``, keep only the groups no function failed on: the
        same number on every device (the fewest any device kept), as each update runs collectives.
        ``None`` when no group is left: the step then counts without changing a weight
        (``module.skip_update``)."""
        names = [name for name, _ in module.reward_functions]
        for name, count in zip(names, scores.nan.sum(0).tolist()):
            self.nan_counts[name] = self.nan_counts.get(name, 0) + count
        if self.execution.on_error == "raise":
            return rollout
        for name, column in zip(names, scores.failed.unbind(1)):
            module.step_metrics.update(f"rewards/{name}/error_rate", column.float().mean(), len(column))
        if self.execution.on_error != "skip_group":
            return rollout
        bad = scores.failed.any(1).view(-1, rollout.group_size).any(1)  # [P]
        module.step_metrics.update("rewards/frac_groups_skipped", bad.float().mean(), len(bad))
        kept = module.min_over_ranks(int((~bad).sum()))
        if kept == 0:
            module.skip_update(rollout.num_groups)
            return None
        if kept == rollout.num_groups:
            return rollout
        return rollout.select_groups((~bad).nonzero().flatten()[:kept])


def score_completions(
    reward_functions: Sequence[tuple[str, RewardFunction]],
    prompts: list[Any],
    completions: list[Any],
    columns: dict[str, list[Any]],
    group_index: Sequence[int] | None = None,
    execution: RewardExecution | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
    trainer_state: Any = None,
) -> Tensor:
    """Score every completion with every function: a float32 tensor ``[N, F]``.

    Each function is called as ``function(prompts, completions, **columns)``, or with ``prompts=`` and
    ``completions=`` as keywords where it takes them so (TRL's style, :class:`~grpo_lightning.rewards.calls.Parameters`); the keys ``prompt``,
    ``prompts``, ``completions`` and ``group_index`` are dropped from ``columns``. ``group_index``
    (one int per completion, e.g. :func:`~grpo_lightning.rewards.group_indices`), ``completion_ids``
    (one list of token ids per completion) and ``trainer_state`` (a
    :class:`~grpo_lightning.rewards.scoring.TrainerState`), when given, are passed to the functions
    that take them (a parameter of that name, or ``**kwargs``); a column of the last two names is a
    :class:`ConfigError`. ``None`` scores become NaN. A failure is handled as ``execution`` says
    (default: :class:`RewardFunctionError`).
    """
    scorer = RewardScorer(execution or RewardExecution(), reward_functions)
    try:
        scores = scorer.score(reward_functions, prompts, completions, columns, group_index, completion_ids, trainer_state)
        return scores.per_function
    finally:
        scorer.close()


# ---------------------------------------------------------------- helpers

def _checked_columns(
    prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]], group_index: Sequence[int] | None,
    completion_ids: Sequence[Sequence[int]] | None,
) -> dict[str, list[Any]]:  # fmt: skip
    count = len(completions)
    if len(prompts) != count:
        raise ValueError(f"got {len(prompts)} prompts for {count} completions; pass one prompt per completion.")
    for name, values in ((GROUP_INDEX, group_index), ("completion_ids", completion_ids)):
        if values is not None and len(values) != count:
            raise ValueError(f"got {len(values)} {name} values for {count} completions; pass one per completion.")
    check_column_names(columns)
    columns = {key: values for key, values in columns.items() if key not in RESERVED_COLUMNS}
    for key, values in columns.items():
        if hasattr(values, "__len__") and len(values) != count:
            raise ValueError(
                f"column {key!r} has {len(values)} values for {count} completions; "
                "repeat each row's value once per completion of its group."
            )
    return columns


def _groups(group_index: Sequence[int]) -> list[list[int]]:
    """The rows of each group, groups in order of first appearance."""
    rows: dict[int, list[int]] = {}
    for row, group in enumerate(group_index):
        rows.setdefault(group, []).append(row)
    return list(rows.values())


def _units(groups: list[list[int]], per_sample: bool) -> list[list[int]]:
    """What a raising call is retried on: each sample, or each group (the score a function that
    names ``group_index`` gives a sample alone is not its score within the group)."""
    return [[row] for group in groups for row in group] if per_sample else groups


def _chunks(groups: list[list[int]], parts: int, per_sample: bool) -> list[tuple[list[int], list[list[int]]]]:
    """At most ``parts`` chunks of whole groups, in order: ``(rows, retry units as positions in rows)``."""
    size = -(-len(groups) // parts) if groups else 0
    chunks = []
    for start in range(0, len(groups), max(size, 1)):
        part = groups[start : start + size]
        rows = [row for group in part for row in group]
        position = {row: i for i, row in enumerate(rows)}
        chunks.append((rows, [[position[row] for row in unit] for unit in _units(part, per_sample)]))
    return chunks


def _where(rows: list[int]) -> str:
    if len(rows) == 1:
        return f"sample {rows[0]}"
    contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
    return f"the group of samples {rows[0]}-{rows[-1]}" if contiguous else f"the group of samples {rows}"
