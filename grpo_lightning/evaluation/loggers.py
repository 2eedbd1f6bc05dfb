"""Where the run's files go, and the completion tables in each logger's own table type.

``Trainer.log_dir`` broadcasts rank 0's directory: a collective that every process must join, so
code that runs on rank 0 alone (writing ``health.json`` or ``completions.jsonl``) would wait for
partners that never come. :func:`log_dir` gives the same directory without the broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

#: ``write(markdown, columns, rows, step)``: one table of completions at optimizer step ``step``.
TableWriter = Callable[[str, list[str], list[list[Any]], int], None]


def log_dir(trainer) -> str | None:
    """``trainer.log_dir`` without its broadcast (on rank 0, the same value): the first logger's
    version directory (TensorBoard, CSV), another first logger's ``save_dir``, or, without a
    logger, ``default_root_dir``."""
    if not trainer.loggers:
        return trainer.default_root_dir
    first = trainer.loggers[0]
    return first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir


def table_writers(loggers, tag: str) -> list[TableWriter]:
    """One writer per logger that shows tables: Weights & Biases gets a ``wandb.Table`` under
    ``tag``; MLflow a table artifact ``<tag>/step_<step>.json`` (``MlflowClient.log_table``, shown
    in the run's artifacts and Evaluation view); any other logger whose experiment has ``add_text``
    (TensorBoard's Text tab) the Markdown text. Loggers of none of these kinds are skipped."""
    writers: list[TableWriter] = []
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            writers.append(_wandb_writer(logger, tag))
        elif isinstance(logger, MLFlowLogger):
            writers.append(_mlflow_writer(logger, tag))
        else:
            add_text = getattr(getattr(logger, "experiment", None), "add_text", None)
            if callable(add_text):
                writers.append(lambda text, columns, rows, step, add_text=add_text: add_text(tag, text, global_step=step))
    return writers


def _wandb_writer(logger: WandbLogger, tag: str) -> TableWriter:
    def write(text: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        logger.log_table(key=tag, columns=columns, data=rows, step=step)

    return write


def _mlflow_writer(logger: MLFlowLogger, tag: str) -> TableWriter:
    def write(text: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        data = {name: [row[i] for row in rows] for i, name in enumerate(columns)}
        logger.experiment.log_table(logger.run_id, data=data, artifact_file=f"{tag}/step_{step}.json")

    return write
