"""What a CLI fit leaves: the summary block, logs named after the variant, a resumed run in its
own version, validation at step 0, and a fit without a progress bar."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.cli.app import checkpoint_version, main, variant_log_name
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()


def fit_args(model_dir: str, root: Path, *extra: str, variant: str = "grpo", steps: int = 2) -> list[str]:
    return [
        "fit",
        "--config",
        str(CONFIGS / "trainer/cpu.yaml"),
        "--config",
        str(CONFIGS / "data/arithmetic.yaml"),
        "--config",
        str(CONFIGS / f"variant/{variant}.yaml"),
        "--model.model",
        model_dir,
        "--model.sampling.group_size",
        "2",
        "--model.sampling.max_new_tokens",
        "4",
        "--model.optim.micro_batch_size",
        "8",
        "--data.batch_size",
        "2",
        "--data.num_train",
        "16",
        "--data.num_val",
        "4",
        "--data.val_batch_size",
        "4",
        "--trainer.max_steps",
        str(steps),
        "--trainer.val_check_interval",
        "100",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.default_root_dir",
        str(root),
        "--trainer.logger.init_args.save_dir",
        str(root),
        "--trainer.callbacks.dirpath",
        "null",
        "--trainer.callbacks.every_n_train_steps",
        "1",
        *extra,
    ]


@pytest.fixture(scope="module")
def first_fit(tiny_model_dir, tmp_path_factory, one_torch_thread):
    root = tmp_path_factory.mktemp("runs")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(fit_args(tiny_model_dir, root))
    return root, out.getvalue()


def test_a_fit_ends_with_a_summary(first_fit):
    root, printed = first_fit
    summary = printed[printed.index("fit finished:"):]
    assert "fit finished: 2 / 2 optimizer steps in " in summary
    assert "last step:   reward " in summary and "kl " in summary and "loss " in summary
    assert "validation (step 2): val/accuracy " in summary and "val/reward " in summary  # validated at steps 0 and 2
    version = root / "grpo" / "version_0"
    assert f"logs:        {version}" in summary
    assert f"config:      {version / 'config.yaml'}" in summary and (version / "config.yaml").exists()
    checkpoint, _, step = summary.split("checkpoint:  ")[1].splitlines()[0].rpartition(" (optimizer step ")
    assert Path(checkpoint).exists() and Path(checkpoint).parent == version / "checkpoints"
    assert step == "2)"


def test_validation_before_the_fit_can_be_turned_off(tiny_model_dir, tmp_path, one_torch_thread):
    main(fit_args(tiny_model_dir, tmp_path, "--validate_before_fit", "false", steps=1))
    events = EventAccumulator(str(tmp_path / "grpo" / "version_0"))
    events.Reload()
    assert [e.step for e in events.Scalars("val/accuracy")] == [1]  # only the validation that ends the fit


def test_the_summary_validation_is_that_of_the_last_step(first_fit):
    """max_steps 2 with val_check_interval 100: the fit still ends with a validation, so the summary's
    val/accuracy is that of the final weights (logged at step 2), not of the start model."""
    root, printed = first_fit
    events = EventAccumulator(str(root / "grpo" / "version_0"))
    events.Reload()
    accuracy = events.Scalars("val/accuracy")
    assert [e.step for e in accuracy] == [0, 2]
    assert f"validation (step 2): val/accuracy {accuracy[-1].value:.4g}" in printed


def test_a_resumed_fit_logs_to_the_version_of_its_checkpoint(first_fit, tiny_model_dir, capsys):
    root, _ = first_fit
    last = root / "grpo" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.exists()
    main(fit_args(tiny_model_dir, root, "--ckpt_path", str(last), steps=3))
    printed = capsys.readouterr().out
    assert "fit finished: 3 / 3 optimizer steps" in printed
    assert f"logs:        {root / 'grpo' / 'version_0'}" in printed
    assert not (root / "grpo" / "version_1").exists()
    assert len(list((root / "grpo" / "version_0").glob("events.out.tfevents.*"))) == 2


def test_logs_are_named_after_the_variant(tiny_model_dir, tmp_path, one_torch_thread, capsys):
    main(fit_args(tiny_model_dir, tmp_path, variant="dr_grpo", steps=1))
    assert f"logs:        {tmp_path / 'dr_grpo' / 'version_0'}" in capsys.readouterr().out
    main(fit_args(tiny_model_dir, tmp_path, "--trainer.logger.init_args.name", "mine", variant="dr_grpo", steps=1))
    assert f"logs:        {tmp_path / 'mine' / 'version_0'}" in capsys.readouterr().out


def test_log_names_and_checkpoint_versions(tmp_path):
    names = {c: variant_log_name(c) for c in ("GRPO", "DrGRPO", "DAPO", "RLOO", "GSPO")}
    assert names == {"GRPO": "grpo", "DrGRPO": "dr_grpo", "DAPO": "dapo", "RLOO": "rloo", "GSPO": "gspo"}
    path = tmp_path / "grpo" / "version_3" / "checkpoints" / "last.ckpt"
    assert checkpoint_version(str(path), str(tmp_path), "grpo") == 3
    assert checkpoint_version(str(path), str(tmp_path), "dapo") is None
    assert checkpoint_version(str(tmp_path / "elsewhere.ckpt"), str(tmp_path), "grpo") is None
