"""What the model writes: tables of completions in TensorBoard and, on request, every completion as JSONL.

:class:`CompletionLog` reads the rollout each update trained on (``module.last_rollout`` and
``module.last_advantages``). Every ``grpo-lightning fit`` has one, configured by ``--completions.*``.

The JSONL file holds one object per completion of every update, with exactly these keys::

    {"step": 0, "group": 0, "prompt": "12+3=", "completion": "15", "rewards": {"accuracy_reward": 1.0},
     "reward": 1.0, "advantage": 0.87, "truncated": false}

``step`` is the optimizer step that trained on the completion (0-based: ``global_step`` when the
update began), ``group`` the prompt's index within the update (over every process's prompts, rank 0's
first), ``prompt`` the prompt's text (a chat
prompt's last user message), ``rewards`` each reward function's score (``null`` where it gave
none), ``reward`` their weighted sum (``rewards.weights``; ``null`` scores count 0) and
``advantage`` the variant's advantage. Reward shaping (DAPO's overlong penalty) is in the
advantage, not in ``reward``. Multi-turn runs (:mod:`grpo_lightning.agents`) add ``conversation``:
the episode's turns in order, each ``{"role": ..., "content": ...}`` with its source as the role
(``assistant`` for the model, ``tool`` or ``user`` for the environment); tables show it.
"""

from __future__ import annotations

import json
import math
import weakref
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from grpo_lightning.checkpoints.resume import gather_over_ranks
from grpo_lightning.errors import ConfigError
from grpo_lightning.evaluation.loggers import log_dir, table_writers
from grpo_lightning.rollout.types import Rollout

#: The tag (TensorBoard, W&B) or artifact folder (MLflow) of the tables.
TABLE_TAG = "completions"


class CompletionLog(Callback):
    """What the model writes: tables in TensorBoard's Text tab, and every completion as JSONL.

    A table of prompt, completion, each reward function's score, the reward and the advantage goes
    to every logger that shows tables, under the tag ``completions``: TensorBoard's Text tab, a
    ``wandb.Table``, an MLflow table artifact (:func:`grpo_lightning.evaluation.loggers.table_writers`). Only rank 0 writes tables, of its own share of
    the batch; the JSONL file gets every process's completions.

    An update gets a table when :func:`is_table_step` says so of one of its optimizer steps ``s``
    (0-based) and the loggers write its metrics (Lightning's ``log_every_n_steps``). The table goes
    to the TensorBoard step of those metrics, the optimizer steps taken after the update, so that it
    is beside the reward and advantages of the completions it shows. With the shipped
    ``log_every_n_steps: 1`` every scheduled table is written; otherwise give an ``every_n_steps``
    that is a multiple of ``log_every_n_steps``. The JSONL file gets every update, whatever the
    schedule, with the 0-based step of the update's start.

    Args:
        every_n_steps: a table every ``every_n_steps`` optimizer steps: at steps ``s`` with
            ``(s + 1) % every_n_steps == 0``, after 50, 100, ... steps (Lightning's rule for
            ``log_every_n_steps``).
        first_steps: a table at each of the first ``first_steps`` steps too.
        max_rows: completions per table, whole groups first; 0 writes no table.
        max_chars: longer prompts and completions are shortened in the middle, with an ellipsis.
        jsonl: ``true``: every completion to ``<log_dir>/completions.jsonl``; a path: to that file;
            ``false``: none. A fit from step 0 starts the file afresh; a resumed fit keeps the
            lines of the steps before its checkpoint and appends.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        first_steps: int = 5,
        max_rows: int = 16,
        max_chars: int = 400,
        jsonl: bool | str = False,
    ) -> None:
        _check(
            every_n_steps >= 1, f"every_n_steps: must be 1 or more (got {every_n_steps}); max_rows 0 writes no table."
        )
        _check(first_steps >= 0, f"first_steps: must be 0 or more (got {first_steps}).")
        _check(max_rows >= 0, f"max_rows: must be 0 (no tables) or more (got {max_rows}).")
        _check(max_chars >= 8, f"max_chars: must be at least 8 (got {max_chars}); longer texts are shortened to it.")
        _check(jsonl not in (None, ""), "jsonl: give true, false or a file path (got an empty value).")
        self.every_n_steps, self.first_steps = every_n_steps, first_steps
        self.max_rows, self.max_chars, self.jsonl = max_rows, max_chars, jsonl
        self.path: Path | None = None  # the JSONL file, on rank 0
        self._step = 0  # global_step when the current batch began
        self._logged: weakref.ref | None = None  # the last rollout logged (a rollout without update is not new)

    def on_train_start(self, trainer, pl_module) -> None:
        every = trainer.log_every_n_steps
        if self.max_rows and every and self.every_n_steps % every:
            rank_zero_warn(
                f"completions.every_n_steps ({self.every_n_steps}) is not a multiple of trainer.log_every_n_steps "
                f"({every}): tables come only with logged metrics, every {math.lcm(every, self.every_n_steps)} "
                f"steps here; give a multiple of {every}."
            )
        if self.jsonl is False or not trainer.is_global_zero:
            return
        path = Path(self.jsonl).expanduser() if isinstance(self.jsonl, str) else Path(log_dir(trainer) or ".")
        path = path / "completions.jsonl" if self.jsonl is True else path
        path.parent.mkdir(parents=True, exist_ok=True)
        keep_steps_before(path, trainer.global_step)
        self.path = path

    def on_train_batch_start(self, trainer, *_: Any) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, *_: Any) -> None:
        rollout, advantages = getattr(pl_module, "last_rollout", None), getattr(pl_module, "last_advantages", None)
        if rollout is None or advantages is None or (self._logged is not None and self._logged() is rollout):
            return
        self._logged = weakref.ref(rollout)
        names = [name for name, _ in pl_module.reward_functions]
        records = every_process_records(rollout, advantages, names, self._step) if self.jsonl is not False else []
        if not trainer.is_global_zero:
            return
        connector = getattr(trainer, "_logger_connector", None)
        loggers_write = bool(getattr(connector, "should_update_logs", True))
        writers = table_writers(trainer.loggers, TABLE_TAG) if self.max_rows and loggers_write else []
        steps = range(self._step, max(trainer.global_step, self._step + 1))  # the update's optimizer steps
        if writers and any(is_table_step(step, self.every_n_steps, self.first_steps) for step in steps):
            rows = completion_records(rollout, advantages, names, self._step, limit=self.max_rows)
            text = completion_table(rows, names, self.max_chars, total=len(rollout), group_size=rollout.group_size)
            columns, cells = completion_columns(rows, names, self.max_chars)
            for write in writers:
                write(text, columns, cells, trainer.global_step)  # the step its metrics are logged at
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in records)


def _check(holds: bool, message: str) -> None:
    if not holds:
        raise ConfigError(f"completions.{message}")


def is_table_step(step: int, every_n_steps: int, first_steps: int) -> bool:
    """Whether optimizer step ``step`` (0-based) gets a table: the first ``first_steps`` steps,
    then every ``every_n_steps``-th (steps ``every_n_steps - 1``, ``2 * every_n_steps - 1``, ...)."""
    return step < first_steps or (step + 1) % every_n_steps == 0


def keep_steps_before(path: Path, step: int) -> None:
    """Keep the lines of ``path`` whose ``step`` is below ``step`` (all lines go at step 0): a fit
    resumed from a checkpoint at ``step`` writes the later steps again."""
    if not path.exists():
        return
    kept = []
    if step > 0:
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            try:
                if json.loads(line)["step"] < step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short when the interrupted fit stopped
    path.write_text("".join(kept), encoding="utf-8")


def prompt_text(prompt: Any) -> str:
    """The text of a prompt: itself, or a chat prompt's last user message (its last message without one)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        users = [m for m in prompt if m.get("role") == "user"] or list(prompt)
        content = users[-1].get("content")
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
            return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
        return "" if content is None else str(content)
    return str(prompt)


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def every_process_records(rollout: Rollout, advantages: Tensor, names: list[str], step: int) -> list[dict[str, Any]]:
    """:func:`completion_records` of every process's rollout (every process must call it), by rank,
    with ``group`` counted over all of them: rank 1's first group follows rank 0's last."""
    records, offset = [], 0
    for part in gather_over_ranks(completion_records(rollout, advantages, names, step)):
        records += [{**record, "group": record["group"] + offset} for record in part]
        offset += max((record["group"] for record in part), default=-1) + 1
    return records


def completion_records(
    rollout: Rollout, advantages: Tensor, names: list[str], step: int, limit: int | None = None
) -> list[dict[str, Any]]:
    """The JSONL objects of the rollout's first ``limit`` completions (all by default); per-token
    advantages ``[N, T]`` (process supervision, PPO) are given as each completion's token mean."""
    count = len(rollout) if limit is None else min(limit, len(rollout))
    rewards = rollout.rewards[:count].tolist()
    per_function = rollout.reward_per_function[:count].tolist()
    if advantages.dim() == 2:
        mask = rollout.completion_mask[:count].to(advantages.device)
        advantages = (advantages[:count] * mask).sum(1) / mask.sum(1).clamp(min=1)
    advantage = advantages[:count].tolist()
    truncated = rollout.truncated[:count].tolist()
    conversations = rollout.columns.get("conversation")
    records = [
        {
            "step": int(step),
            "group": i // rollout.group_size,
            "prompt": prompt_text(rollout.prompts[i]),
            "completion": rollout.completions[i],
            "rewards": {name: _number(score) for name, score in zip(names, per_function[i])},
            "reward": rewards[i],
            "advantage": advantage[i],
            "truncated": bool(truncated[i]),
        }
        for i in range(count)
    ]
    for record, conversation in zip(records, conversations or ()):
        record["conversation"] = conversation
    return records


def shown_completion(row: dict[str, Any]) -> str:
    """A record's completion as tables show it: a multi-turn episode's turns, each after its source."""
    if "conversation" not in row:
        return row["completion"]
    return "\n".join(f"[{turn['role']}] {turn['content']}" for turn in row["conversation"])


def shorten(text: str, max_chars: int) -> str:
    """``text`` if it has at most ``max_chars`` characters, else its start and end around ``…``."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def markdown_cell(text: str) -> str:
    """``text`` as one Markdown table cell that shows it as written: ``|``, backslashes and Markdown
    emphasis escaped, HTML characters as entities, line breaks as ``<br>``."""
    text = text.replace("\\", "\\\\")
    for char in "|*_`[]":
        text = text.replace(char, "\\" + char)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "<br>")


def _format(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def completion_columns(rows: list[dict[str, Any]], names: list[str], max_chars: int) -> tuple[list[str], list[list]]:
    """The table of :func:`completion_table` as column names and rows of plain values, for loggers
    with a table type of their own (W&B, MLflow)."""
    columns = ["prompt", "completion", *names, "reward", "advantage"]
    cells = [
        [shorten(row["prompt"], max_chars), shorten(shown_completion(row), max_chars), *(row["rewards"][n] for n in names),
         row["reward"], row["advantage"]]
        for row in rows
    ]  # fmt: skip
    return columns, cells


def completion_table(rows: list[dict[str, Any]], names: list[str], max_chars: int, total: int, group_size: int) -> str:
    """A Markdown table of ``rows`` (:func:`completion_records`): prompt, completion, each reward
    function's score, the reward and the advantage; a line above says how many completions it shows."""
    header = ["prompt", "completion", *names, "reward", "advantage"]
    lines = [
        f"{len(rows)} of {total} completions ({total // group_size} prompts x {group_size})",
        "",
        "| " + " | ".join(markdown_cell(name) for name in header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in rows:
        cells = [markdown_cell(shorten(row["prompt"], max_chars)), markdown_cell(shorten(shown_completion(row), max_chars))]
        cells += [_format(row["rewards"][name]) for name in names]
        cells += [_format(row["reward"]), _format(row["advantage"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
