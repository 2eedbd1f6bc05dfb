"""Every shipped YAML is read by the real CLI (the variants' own, printed and read back, in
tests/conformance/); the CLI resolves variants by class path."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from grpo_lightning.cli.app import EXPECTED_WARNINGS, GRPOLightningCLI, main
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.quickstart import quickstart_args
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.cli.user_errors import MOVED_MODULES, moved_class_path
from grpo_lightning.cli.notices import THIRD_PARTY_WARNINGS

CONFIGS = config_dir()
VARIANT_CONFIGS = sorted((CONFIGS / "variant").glob("*.yaml"))
BASE = ["--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml")]


def cli_args(*configs: Path, model_dir: str = "some/model") -> list[str]:
    return [*BASE, *(a for c in configs for a in ("--config", str(c))), "--model.model", model_dir]


@pytest.mark.parametrize(
    "config",
    sorted(p for p in CONFIGS.rglob("*.yaml") if not {"ablation", "variant"} & set(p.relative_to(CONFIGS).parts)),
    ids=lambda p: str(p.relative_to(CONFIGS)),
)
def test_every_shipped_config_parses(config, capsys):
    if "lora" in config.parts:
        pytest.importorskip("peft", reason="the LoRA config needs the peft extra (pip install 'grpo-lightning[peft]')")
    with pytest.raises(SystemExit) as done:
        main(["fit", *BASE, "--config", str(VARIANT_CONFIGS[0]), "--config", str(config), "--model.model", "m",
              "--print_config"])  # fmt: skip
    assert done.value.code == 0
    assert "class_path: grpo_lightning.variants." in capsys.readouterr().out


def test_class_path_and_field_overrides_from_the_command_line():
    args = cli_args(VARIANT_CONFIGS[0]) + ["--model", "grpo_lightning.variants.DAPO", "--model.loss.clip_eps_high", "0.3"]
    cli = GRPOLightningCLI(args=args, run=False)
    assert type(cli.model).__name__ == "DAPO"
    assert cli.model.settings.clip_eps_high == 0.3
    assert cli.model.coefficients.beta == 0.0


def test_unknown_class_path_is_an_error_naming_it(capsys):
    with pytest.raises(SystemExit) as done:
        GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0]) + ["--model", "grpo_lightning.variants.NoSuchVariant"], run=False)
    assert done.value.code != 0
    assert "NoSuchVariant" in capsys.readouterr().err


def test_quickstart_uses_the_shipped_configs():
    cli = GRPOLightningCLI(args=quickstart_args("warm/model", "dapo"), run=False)
    assert type(cli.model).__name__ == "DAPO"
    assert cli.model.model_name == "warm/model"


def test_console_entry_points_return_none_so_the_exit_status_is_zero():
    """A console script exits with ``sys.exit(main())``: anything but None is a failure status."""
    import inspect

    from grpo_lightning import quickstart

    assert inspect.signature(quickstart.main).return_annotation in (None, "None")


def test_a_cli_fit_warns_of_nothing_by_design_and_copies_no_state_to_the_cpu_at_its_end(tiny_model_dir, tmp_path, monkeypatch):
    """The frozen reference model's eval mode and checkpoints taken after the optimizer step are
    how the module works: a CLI fit does not warn about them (other warnings still show). Its process
    ends with the fit, so Lightning's teardown copies neither the optimizer's state nor the module to
    the CPU; the checkpoints still hold that state."""
    from lightning.pytorch.strategies import strategy

    moved, copy_states = [], strategy._optimizers_to_device
    monkeypatch.setattr(strategy, "_optimizers_to_device", lambda opts, device: (moved.extend(len(o.state) for o in opts), copy_states(opts, device)))
    monkeypatch.setattr(torch.nn.Module, "cpu", lambda module: pytest.fail(f"{type(module).__name__} copied to the CPU"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(
            [
                "fit",
                *cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir),
                "--trainer.max_steps",
                "1",
                "--model.sampling.max_new_tokens",
                "8",
                "--model.rewards.funcs",  # rewards that differ within a group: the step has a gradient to keep
                "[tests.helpers.length_parity_reward]",
                "--trainer.limit_val_batches",
                "0",
                "--trainer.default_root_dir",
                str(tmp_path),
                "--trainer.logger.init_args.save_dir",
                str(tmp_path),
                "--trainer.callbacks+=ModelCheckpoint",
                "--trainer.callbacks.dirpath",
                str(tmp_path / "ckpt"),
                "--trainer.callbacks.every_n_train_steps",
                "1",
            ]
        )
        warnings.warn("not expected")
    messages = [str(w.message) for w in caught]
    assert moved and set(moved) == {0}, moved
    (checkpoint,) = (tmp_path / "ckpt").glob("*step=1*.ckpt")
    assert torch.load(checkpoint, weights_only=False)["optimizer_states"][0]["state"]
    assert "not expected" in messages
    silenced = (*EXPECTED_WARNINGS, *THIRD_PARTY_WARNINGS)  # and torch's LeafSpec deprecation, Lightning's doing
    assert not [m for m in messages for pattern in silenced if re.search(pattern, m)], messages


def test_a_checkpoint_written_after_the_released_state_says_it_has_none(tiny_model_dir, tmp_path):
    """A callback that saves in ``on_fit_end`` (after Lightning's teardown) gets a checkpoint without the optimizer's
    state once a command-line fit has released it, and a warning that says so."""
    import lightning as L

    class SaveAtFitEnd(L.Callback):
        def on_fit_end(self, trainer, pl_module):
            trainer.save_checkpoint(tmp_path / "after.ckpt")

    args = [*cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir), "--trainer.max_steps", "1",
            "--model.sampling.max_new_tokens", "4", "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    cli.model.process_ends_with_fit = True  # as the CLI's fit sets it
    cli.trainer.callbacks.append(SaveAtFitEnd())
    with pytest.warns(UserWarning, match="has released the optimizer's state: it has none"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert not torch.load(tmp_path / "after.ckpt", weights_only=False)["optimizer_states"][0]["state"]


# ---------------------------------------------------------------- the engine options group


def test_engine_options_are_one_group_on_the_command_line():
    args = cli_args(VARIANT_CONFIGS[0]) + ["--model.engine.decode_attention", "math", "--model.engine.compile", "false"]
    cli = GRPOLightningCLI(args=args, run=False)
    assert cli.model.engine_options == EngineOptions(decode_attention="math", compile=False)
    assert cli.model.hparams.engine["decode_attention"] == "math"  # plain values: hparams.yaml, loggers


def test_engine_options_from_a_yaml_file(tmp_path):
    config = tmp_path / "engine.yaml"
    config.write_text("model:\n  init_args:\n    engine:\n      rollout: static\n")
    cli = GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0], config), run=False)
    assert cli.model.engine_options == EngineOptions(rollout="static")
    cli = GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0], CONFIGS / "engine/fast.yaml"), run=False)
    assert cli.model.engine_options.rollout == "static" and cli.model.engine_options.fuse_projections


def test_print_config_shows_the_engine_group_with_its_automatic_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["fit", *cli_args(VARIANT_CONFIGS[0]), "--print_config"])
    printed = capsys.readouterr().out
    assert "    engine:\n      rollout: auto\n      compile: null\n      decode_attention: auto\n" in printed


def test_an_unknown_engine_value_is_an_error_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0]) + ["--model.engine.rollout", "vllm"], run=False)
    assert "engine.rollout" in capsys.readouterr().err


def test_a_checkpoint_rebuilds_the_module_with_its_engine_options(tiny_model_dir, tmp_path):
    from grpo_lightning.variants import GRPO

    engine = EngineOptions(decode_attention="math", fused_lm_head=False)
    module = GRPO(model=tiny_model_dir, engine=engine, rewards={"funcs": ["grpo_lightning.rewards.accuracy_reward"]})
    path = tmp_path / "module.ckpt"
    import lightning

    torch.save({"state_dict": {}, "hyper_parameters": dict(module.hparams), "pytorch-lightning_version": lightning.__version__}, path)
    loaded = GRPO.load_from_checkpoint(path, weights_only=True)
    assert loaded.engine_options == engine


# ---------------------------------------------------------------- progress bar, seeds, subcommands


def test_the_progress_bar_counts_optimizer_steps_without_v_num(tiny_model_dir, tmp_path, one_torch_thread):
    from grpo_lightning.training.callbacks import StepProgressBar

    args = cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir) + [
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
        "2",
        "--trainer.val_check_interval",
        "1",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
        "--trainer.callbacks.dirpath",
        str(tmp_path / "ckpt"),
    ]
    cli = GRPOLightningCLI(args=args, run=False)
    bar = cli.trainer.progress_bar_callback
    assert isinstance(bar, StepProgressBar)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (2, 2)
    shown = bar.get_metrics(cli.trainer, cli.model)
    assert "v_num" not in shown and "reward" in shown and "val/accuracy" in shown


def test_disabling_the_progress_bar_drops_the_configured_one():
    cli = GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0]) + ["--trainer.enable_progress_bar", "false"], run=False)
    assert cli.trainer.progress_bar_callback is None


def test_seed_everything_seeds_the_data_order_unless_data_seed_is_given(tmp_path):
    cli = GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0]) + ["--seed_everything", "7"], run=False)
    assert cli.datamodule.seed == 7
    cli = GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0]) + ["--seed_everything", "7", "--data.seed", "3"], run=False)
    assert cli.datamodule.seed == 3
    for spelt in (["--data.init_args.seed", "4"], ["--data.init_args.seed=4"]):  # the same option, spelt in full
        cli = GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0]) + ["--seed_everything", "7", *spelt], run=False)
        assert cli.datamodule.seed == 4
    config = tmp_path / "data_seed.yaml"
    config.write_text("data:\n  init_args:\n    seed: 5\n")
    cli = GRPOLightningCLI(args=cli_args(VARIANT_CONFIGS[0], config) + ["--seed_everything", "7"], run=False)
    assert cli.datamodule.seed == 5


def test_settings_given_before_the_variant_keep_the_variants_own_defaults(tmp_path, capsys):
    """jsonargparse reads settings given before a class_path against the base class and keeps the base's
    defaults it filled in: DAPO trained with GRPO's clip (0.2) and KL (0.04) under DAPO's name. Its own
    defaults are put back, except where the user set a value."""
    settings = tmp_path / "settings.yaml"
    settings.write_text("model:\n  init_args:\n    sampling:\n      group_size: 2\n")
    dapo = CONFIGS / "variant/dapo.yaml"
    for args in ([*BASE, "--config", str(settings), "--config", str(dapo), "--model.model", "m"],
                 [*BASE, "--config", str(dapo), "--config", str(settings), "--model.model", "m"],
                 [*BASE, "--model.model", "m", "--model", "dapo"]):  # fmt: skip
        cli = GRPOLightningCLI(args=args, run=False)
        assert cli.model.settings.clip_eps_high == 0.28 and cli.model.coefficients.beta == 0.0, args
        assert str(settings) not in args or cli.model.settings.group_size == 2
    assert "model: DAPO's own defaults apply (model.loss.clip_eps_high 0.28, model.kl.beta 0.0)" in capsys.readouterr().err
    cli = GRPOLightningCLI(args=[*BASE, "--config", str(settings), "--model.kl.beta", "0.04", "--config", str(dapo),
                                 "--model.model", "m"], run=False)  # fmt: skip
    assert cli.model.coefficients.beta == 0.04 and cli.model.settings.clip_eps_high == 0.28  # what was given stays


def test_fit_validate_test_and_generate_are_the_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    printed = capsys.readouterr().out
    assert "{fit,validate,test,generate}" in printed and "predict" not in printed


def test_test_evaluates_the_test_split_with_the_validation_metrics(tiny_model_dir, tmp_path, one_torch_thread):
    import json

    rows = "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(6))
    (tmp_path / "train.jsonl").write_text(rows)
    (tmp_path / "test.jsonl").write_text(rows[: rows.index("\n") + 1] * 3)
    cli = GRPOLightningCLI(
        args=[
            "test", *cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir), "--data", "PromptDataModule",
            "--data.path", str(tmp_path), "--data.batch_size", "2", "--model.evaluation.max_new_tokens", "2",
            "--trainer.logger.init_args.save_dir", str(tmp_path),
        ],
    )  # fmt: skip
    metrics = cli.trainer.callback_metrics
    assert {"test/accuracy", "test/reward", "test/mean_length"} <= set(metrics) and "val/accuracy" not in metrics
    assert cli.datamodule.test_dataset.num_rows == 3


def test_generate_writes_a_completion_per_prompt(tiny_model_dir, tmp_path, one_torch_thread, capsys):
    import json

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "12+3=", "answer": "15"}\n{"prompt": "4+4="}\n\n{"prompt": "1+1="}\n')
    output = tmp_path / "out" / "completions.jsonl"
    main(
        [
            "generate",
            *cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir),
            "--model.evaluation.max_new_tokens",
            "4",
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--prompts",
            str(prompts),
            "--output",
            str(output),
            "--batch_size",
            "2",
        ]
    )
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == ["12+3=", "4+4=", "1+1="]
    assert rows[0]["answer"] == "15" and all(isinstance(row["completion"], str) for row in rows)
    assert f"wrote 3 completions to {output}" in capsys.readouterr().out


def test_generate_without_a_prompt_column_is_an_error(tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "12+3="}\n')
    with pytest.raises(SystemExit) as done:
        main([
            "generate", *cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir),
            "--prompts", str(prompts), "--output", str(tmp_path / "out.jsonl"),
        ], report_errors=True)  # fmt: skip
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "error: prompts: line 1" in err and "has no 'prompt'" in err and "Traceback" not in err


# ---------------------------------------------------------------- variants by name, help


def test_fit_help_lists_the_variants_and_points_at_model_help(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    printed = " ".join(capsys.readouterr().out.split())
    description = printed[printed.index("Runs the full optimization routine.") :]
    assert "--model.help NAME lists a variant's options" in description[:800]
    for name in ("GRPO", "DrGRPO", "DAPO", "RLOO", "GSPO", "dr_grpo", "reinforce_plus_plus"):
        assert name in description[:800], name
    assert "grpo_lightning.variants.DAPO" in printed  # the known subclasses of --model


@pytest.mark.parametrize(
    "given", [["--model", "DAPO"], ["--model", "dapo"], ["--model=dapo"], ["--model", "grpo_lightning.variants.DAPO"]], ids=" ".join
)
def test_a_variant_is_named_by_class_name_config_name_or_class_path(given):
    cli = GRPOLightningCLI(args=[*BASE, "--model.model", "m", *given, "--model.loss.clip_eps_high", "0.3"], run=False)
    assert type(cli.model).__name__ == "DAPO" and cli.model.settings.clip_eps_high == 0.3


def test_a_config_file_may_name_a_variant_by_class_name(tmp_path):
    config = tmp_path / "dr.yaml"
    config.write_text("model:\n  class_path: DrGRPO\n")
    cli = GRPOLightningCLI(args=cli_args(config), run=False)
    assert type(cli.model).__name__ == "DrGRPO"


@pytest.mark.parametrize("given", ["DAPO", "dapo"])
def test_model_help_takes_a_variants_short_name(given, capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", "--model.help", given])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert "--model.dynamic_sampling" in printed and "--model.overlong_buffer" in printed


@pytest.mark.parametrize("option", ["--model", "--model.help"])
def test_a_misspelt_variant_suggests_the_nearest_whatever_its_case(option, capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", *BASE, "--model.model", "m", option, "Dapoo"], report_errors=True)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "unknown variant 'Dapoo'" in err and "Did you mean grpo_lightning.variants.DAPO?" in err


def test_a_class_path_of_a_module_that_moved_names_where_it_is_now(tmp_path, capsys):
    old = tmp_path / "old.yaml"
    old.write_text("trainer:\n  callbacks:\n    - class_path: grpo_lightning.schedules.CosineKLSchedule\n")
    with pytest.raises(SystemExit) as done:
        main(["fit", *BASE, "--model.model", "m", "--config", str(old), "--print_config"], report_errors=True)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "'grpo_lightning.schedules.CosineKLSchedule': its module has moved" in err
    assert "'grpo_lightning.training.schedules.CosineKLSchedule'" in err


def test_model_help_refuses_a_presets_former_class_path_naming_the_new_one(capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", "--model.help", "variants.DAPO"], report_errors=True)
    assert done.value.code == 2
    assert "'variants.DAPO': its module has moved; write 'grpo_lightning.variants.DAPO'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("yaml", "old", "new"),
    [
        ("trainer:\n  strategy:\n    class_path: {}\n", "training.strategies.PolicyFSDPStrategy", "runtime.strategies.PolicyFSDPStrategy"),
        ("trainer:\n  callbacks:\n    - class_path: {}\n", "training.time_budget.TimeBudget", "runtime.time_budget.TimeBudget"),
        ("trainer:\n  plugins:\n    - class_path: {}\n", "checkpoints.io.AtomicCheckpointIO", "runtime.checkpoint_io.AtomicCheckpointIO"),
    ],
)
def test_a_class_path_of_a_helper_that_moved_to_runtime_names_where_it_is_now(yaml, old, new, tmp_path, capsys):
    config = tmp_path / "old.yaml"
    config.write_text(yaml.format(f"grpo_lightning.{old}"))
    with pytest.raises(SystemExit) as done:
        main(["fit", *BASE, "--model.model", "m", "--config", str(config), "--print_config"], report_errors=True)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"'grpo_lightning.{old}': its module has moved; write 'grpo_lightning.{new}'" in err, err


def test_every_moved_module_is_where_the_table_says():
    now_packages = {"models", "rollout", "cli", "evaluation"}  # old module names that are folders now
    for old, new in MOVED_MODULES.items():
        assert importlib.util.find_spec(f"grpo_lightning.{new}") is not None, new
        if old not in now_packages:
            with pytest.raises(ModuleNotFoundError):
                importlib.import_module(f"grpo_lightning.{old}")
    assert moved_class_path("grpo_lightning.models.load_models") == "grpo_lightning.models.policy.load_models"
    assert moved_class_path("grpo_lightning.models.lora.Misspelt") is None
    assert moved_class_path("grpo_lightning.schedules.CosineKLSchedul") is None  # misspelt: not there either
    assert moved_class_path("grpo_lightning.engine.generator.StaticCacheGenerator") == (
        "grpo_lightning.rollout.engine.generator.StaticCacheGenerator"
    )
    assert moved_class_path("grpo_lightning.training.schedules.CosineKLSchedule") is None
    assert moved_class_path("variants.ReinforcePlusPlus") == "grpo_lightning.variants.ReinforcePlusPlus"
    assert moved_class_path("variants.covariance.CovarianceRule") == "grpo_lightning.variants.covariance.CovarianceRule"
    assert moved_class_path("variants.Nope") is None and moved_class_path("variantsX.GRPO") is None
    assert moved_class_path("grpo_lightning.training.metrics.StepMetrics") == "grpo_lightning.runtime.metrics.StepMetrics"
    assert moved_class_path("grpo_lightning.training.optimization.nonfinite.NonFiniteGuard") == (
        "grpo_lightning.runtime.optimization.nonfinite.NonFiniteGuard"
    )
    assert moved_class_path("grpo_lightning.strategies.PolicyFSDPStrategy") == "grpo_lightning.runtime.strategies.PolicyFSDPStrategy"


# ---------------------------------------------------------------- output of other packages


def test_a_fit_prints_no_product_tip_of_lightning_but_the_projects_messages(tiny_model_dir, tmp_path, one_torch_thread):
    import logging

    import lightning_utilities.core.rank_zero as rank_zero

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    rank_zero.log.addHandler(handler)
    try:
        main(
            [
                "fit",
                *cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir),
                "--trainer.max_steps",
                "1",
                "--model.sampling.max_new_tokens",
                "4",
                "--trainer.limit_val_batches",
                "0",
                "--trainer.default_root_dir",
                str(tmp_path),
                "--trainer.logger.init_args.save_dir",
                str(tmp_path),
                "--trainer.callbacks.dirpath",
                str(tmp_path / "ckpt"),
            ]
        )
    finally:
        rank_zero.log.removeHandler(handler)
    assert not [message for message in records if "Tip" in message], records
    assert any(message.startswith("prompts: plain text is sent as it is") for message in records), records


# ---------------------------------------------------------------- a run to resume and generate from

#: A fit of a few seconds on the tiny model.
SMALL_RUN = [
    "--model.sampling.group_size",
    "2",
    "--model.sampling.max_new_tokens",
    "4",
    "--model.evaluation.max_new_tokens",
    "4",
    "--data.batch_size",
    "2",
    "--data.num_train",
    "8",
    "--data.num_val",
    "2",
    "--trainer.val_check_interval",
    "1",
    "--trainer.callbacks.every_n_train_steps",
    "1",
]


@pytest.fixture(scope="module")
def one_step_run(tiny_model_dir, tmp_path_factory, one_torch_thread) -> Path:
    """A folder where ``runs/grpo/version_0/checkpoints/last.ckpt`` holds a one-step fit."""
    folder = tmp_path_factory.mktemp("one_step_run")
    runs = str(folder / "runs")
    main([
        "fit", *cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir), *SMALL_RUN, "--trainer.max_steps", "1",
        "--trainer.default_root_dir", runs, "--trainer.logger.init_args.save_dir", runs,
    ])  # fmt: skip
    assert (folder / "runs/grpo/version_0/checkpoints/last.ckpt").is_file()
    return folder


def test_a_resumed_fit_shows_its_steps_out_of_max_steps(one_step_run, tiny_model_dir, tmp_path):
    """Lightning calls no on_train_epoch_start when a fit resumes mid-epoch: the bar still counts steps."""
    checkpoint = tmp_path / "last.ckpt"
    shutil.copy(one_step_run / "runs/grpo/version_0/checkpoints/last.ckpt", checkpoint)
    args = cli_args(CONFIGS / "variant/grpo.yaml", model_dir=tiny_model_dir) + SMALL_RUN + [
        "--trainer.max_steps", "3", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger.init_args.save_dir", str(tmp_path),
    ]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(checkpoint))
    bar = cli.trainer.progress_bar_callback.train_progress_bar
    assert (bar.n, bar.total, bar.desc.rstrip(": ")) == (3, 3, "Step")


def test_the_readme_generate_example_runs_as_written(one_step_run, monkeypatch, capsys):
    """Only the checkpoint, the prompts and the output: no data, model or trainer config."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = re.search(r"`grpo-lightning generate ([^`]+)`", readme).group(1).split()
    monkeypatch.chdir(one_step_run)
    Path("p.jsonl").write_text('{"prompt": "12+3="}\n{"prompt": "4+4="}\n')
    main(["generate", *example], report_errors=True)
    output = example[example.index("--output") + 1]
    rows = [json.loads(line) for line in Path(output).read_text().splitlines()]
    assert [row["prompt"] for row in rows] == ["12+3=", "4+4="]
    assert f"wrote 2 completions to {output}" in capsys.readouterr().out


def test_generate_without_a_model_or_checkpoint_says_what_to_give(tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1="}\n')
    with pytest.raises(SystemExit) as done:
        main(["generate", "--prompts", str(tmp_path / "p.jsonl"), "--output", str(tmp_path / "o.jsonl")], report_errors=True)
    assert done.value.code == 2
    assert "error: generate: no model; give --ckpt_path" in capsys.readouterr().err
