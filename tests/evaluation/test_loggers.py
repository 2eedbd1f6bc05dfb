"""The shipped logger configs (configs/logger/): each runs a real tiny fit offline, and what it logged
is read back with the logger's own tools: the metrics TensorBoard got, and the completion tables in
the logger's table type."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.cli.app import GRPOLightningCLI, main
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()
STEPS = 2
TRAINED = ("loss", "reward", "kl")


def fit_args(model_dir: str, logger: str) -> list[str]:
    """A 2-step GRPO fit on the tiny model with the shipped CPU trainer and ``logger/<logger>.yaml``,
    logging under ``runs/`` of the working directory; a completion table at each step."""
    return [
        "fit",
        "--config",
        "trainer/cpu",
        "--config",
        "data/arithmetic",
        "--config",
        "variant/grpo",
        "--config",
        f"logger/{logger}",
        "--model.model",
        model_dir,
        "--model.sampling.group_size",
        "2",
        "--model.sampling.max_new_tokens",
        "4",
        "--data.batch_size",
        "2",
        "--data.num_train",
        "8",
        "--data.num_val",
        "2",
        "--trainer.max_steps",
        str(STEPS),
        "--trainer.limit_val_batches",
        "0",
        "--validate_before_fit",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--completions.first_steps",
        str(STEPS),
        "--completions.max_rows",
        "4",
    ]


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in TRAINED}


@pytest.mark.parametrize("logger", ["tensorboard", "wandb", "mlflow"])
def test_every_logger_config_keeps_tensorboard_first_and_names_it_after_the_variant(logger, tmp_path, monkeypatch):
    """The run's folder (config.yaml, checkpoints, health.json) is the first logger's version
    directory: TensorBoard's ``runs/<variant>/version_N`` whichever logger config is composed."""
    if logger != "tensorboard":
        pytest.importorskip(logger)
    monkeypatch.chdir(tmp_path)  # MLflow's logger opens its store when it is made
    args = fit_args("some/model", logger)[1:] + ["--model", "grpo_lightning.variants.DAPO"]
    if logger == "mlflow":  # not the relative URI of the fit below: MLflow keeps a store per URI
        args += ["--trainer.logger.init_args.tracking_uri", f"sqlite:///{tmp_path}/mlflow.db"]
    cli = GRPOLightningCLI(args=args, run=False)
    first = cli.trainer.loggers[0]
    assert type(first).__name__ == "TensorBoardLogger" and first.name == "dapo"
    assert [type(each).__name__ for each in cli.trainer.loggers[1:]] == {
        "tensorboard": [], "wandb": ["WandbLogger"], "mlflow": ["MLFlowLogger"]
    }[logger]


# ---------------------------------------------------------------- Weights & Biases, offline


def wandb_records(path: Path):
    """The records of an offline run's ``.wandb`` file: wandb's LevelDB-style log (a 7-byte file
    header, 32 KiB blocks of chunks with a 7-byte header: CRC32, length, type) of ``Record``
    protobufs, read without a network or a W&B account."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, pending = path.read_bytes(), 32768, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 or position + 7 + length > len(data):  # the end, or a record still being written
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(path: Path, last_step: int, timeout_s: float = 60) -> list[dict]:
    """The history rows of an offline run, once its file holds the metrics of ``last_step``:
    wandb's service writes the file on its own, also after ``wandb.finish()`` returned."""
    deadline = time.monotonic() + timeout_s
    while True:
        history = [
            {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for record in wandb_records(path)
            if record.WhichOneof("record_type") == "history"
        ]
        if any(row.get("trainer/global_step") == last_step and "loss" in row for row in history):
            return history
        assert time.monotonic() < deadline, f"no metrics of step {last_step} in {path} after {timeout_s} s"
        time.sleep(0.5)


def test_the_wandb_config_logs_metrics_and_tables_offline(tiny_model_dir, tmp_path, monkeypatch, one_torch_thread):
    wandb = pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by the config, not by the environment
    try:
        main(fit_args(tiny_model_dir, "wandb"))
    finally:
        wandb.finish()

    (run_file,) = (tmp_path / "runs" / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(run_file, last_step=STEPS)
    tables = [row for row in history if "completions/_type" in row]  # a table's fields are nested keys
    logged = {tag: [(int(r["trainer/global_step"]), r[tag]) for r in history if tag in r] for tag in TRAINED}
    expected = tensorboard_scalars(tmp_path / "runs" / "grpo" / "version_0")
    for tag in TRAINED:
        assert [step for step, _ in logged[tag]] == list(range(1, STEPS + 1))  # after each optimizer step
        assert [value for _, value in logged[tag]] == pytest.approx([value for _, value in expected[tag]], rel=1e-6)
    assert [int(row["trainer/global_step"]) for row in tables] == list(range(1, STEPS + 1))  # beside their metrics
    assert tables[0]["completions/_type"] == "table-file"
    (table_file,) = run_file.parent.glob(f"files/{tables[0]['completions/path']}")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["prompt", "completion", "accuracy_reward", "reward", "advantage"]
    assert len(table["data"]) == 4 and "+" in table["data"][0][0]


# ---------------------------------------------------------------- MLflow, a local store


def test_the_mlflow_config_logs_metrics_and_tables_to_a_local_store(tiny_model_dir, tmp_path, monkeypatch, one_torch_thread):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    for variable in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(variable, raising=False)
    main(fit_args(tiny_model_dir, "mlflow"))

    client = MlflowClient("sqlite:///runs/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("grpo-lightning").experiment_id])
    assert run.info.status == "FINISHED"
    expected = tensorboard_scalars(tmp_path / "runs" / "grpo" / "version_0")
    for tag in TRAINED:
        logged = [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, tag), key=lambda m: m.step)]
        assert [step for step, _ in logged] == list(range(1, STEPS + 1))  # after each optimizer step
        assert [value for _, value in logged] == pytest.approx([value for _, value in expected[tag]], rel=1e-6)
    assert sorted(Path(a.path).name for a in client.list_artifacts(run.info.run_id, "completions")) == [
        f"step_{step}.json" for step in range(1, STEPS + 1)  # beside their metrics
    ]
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "completions/step_1.json", str(tmp_path))).read_text())
    assert table["columns"] == ["prompt", "completion", "accuracy_reward", "reward", "advantage"]
    assert len(table["data"]) == 4 and "+" in table["data"][0][0]
