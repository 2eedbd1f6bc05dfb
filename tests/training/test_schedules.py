"""The cosine KL schedule: the formula by hand, its errors, how it sets beta, and real CLI fits (from
scratch and resumed) whose logged ``beta`` follows it step by step."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.training.callbacks import StepProgressBar
from grpo_lightning.cli.app import GRPOLightningCLI, main
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.training.schedules import CosineKLSchedule, cosine_kl_coefficient
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import DAPO, GRPO

CONFIGS = config_dir()
STEPS = 4


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.1),  # held at start for step < 0.1 T
        (10, 0.1),  # p = 0: the cosine starts at start
        (45, 0.07),  # p = 0.5: halfway, 0.04 + 0.06 * (1 + cos(pi / 2)) / 2
        (80, 0.04),  # p = 1: the cosine ends at end
        (100, 0.04),  # held at end for step > 0.8 T
    ],
)
def test_the_coefficient_by_hand(step, expected):
    assert cosine_kl_coefficient(step, 100, start=0.1, end=0.04) == pytest.approx(expected, abs=1e-12)


def test_a_quarter_of_the_way_down():
    # p = 0.25 at step 0.1 T + 0.25 * 0.7 T = 27.5 of 100: 0.04 + 0.06 * (1 + cos(pi / 4)) / 2
    assert cosine_kl_coefficient(27.5, 100, 0.1, 0.04) == pytest.approx(0.04 + 0.03 * (1 + 2**-0.5), abs=1e-12)


@pytest.mark.parametrize("total", [4, 10, 1000])
def test_the_coefficient_falls_from_start_to_end_without_a_jump(total):
    values = [cosine_kl_coefficient(step, total, 0.1, 0.04) for step in range(total + 1)]
    assert values[0] == 0.1 and values[-1] == 0.04
    assert all(later <= earlier for earlier, later in itertools.pairwise(values))
    for edge in (0.1 * total, 0.8 * total):
        assert cosine_kl_coefficient(edge - 1e-9, total) == pytest.approx(cosine_kl_coefficient(edge + 1e-9, total))


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (0.04, 0.1, r"start \(0.04\) is below end \(0.1\)"),
        (0.1, -0.01, "start must be > 0 and end >= 0"),
        (-0.1, -0.2, "start must be > 0 and end >= 0"),
        (0.0, 0.0, "start must be > 0 and end >= 0"),
    ],
)
def test_bad_start_or_end_is_an_error_naming_them(start, end, message):
    with pytest.raises(ConfigError, match=f"^CosineKLSchedule: {message}"):
        CosineKLSchedule(start=start, end=end)


def test_a_module_without_a_reference_model_is_refused_naming_beta(make_module):
    dapo = make_module(DAPO, configure=False)  # beta 0: no reference model, no KL term
    assert not dapo.needs_reference_model()
    with pytest.raises(ConfigError, match=r"^kl.beta: the module's beta is 0.0: .*set --model.kl.beta > 0"):
        CosineKLSchedule().setup(SimpleNamespace(max_steps=100), dapo, "fit")


def test_a_module_that_loads_no_reference_model_at_beta_above_0_is_refused():
    module = SimpleNamespace(coefficients=SimpleNamespace(beta=0.04), needs_reference_model=lambda: False)
    with pytest.raises(ConfigError, match="^kl.beta: SimpleNamespace loads no reference model"):
        CosineKLSchedule().setup(SimpleNamespace(max_steps=100), module, "fit")


@pytest.mark.parametrize("max_steps", [-1, None])
def test_a_fit_without_max_steps_is_refused_naming_it(make_module, max_steps):
    grpo = make_module(GRPO, configure=False)
    with pytest.raises(ConfigError, match=r"^trainer.max_steps: .*--trainer.max_steps 1000"):
        CosineKLSchedule().setup(SimpleNamespace(max_steps=max_steps), grpo, "fit")
    CosineKLSchedule().setup(SimpleNamespace(max_steps=max_steps), grpo, "validate")  # only a fit is scheduled


def test_the_schedule_sets_beta_through_set_coefficient_which_logs_it(monkeypatch):
    grpo = GRPO("m")  # kl.beta 0.04
    calls, set_coefficient = [], grpo.set_coefficient
    monkeypatch.setattr(grpo, "set_coefficient", lambda name, value: calls.append(name) or set_coefficient(name, value))
    CosineKLSchedule(start=0.1, end=0.04).on_train_batch_start(SimpleNamespace(global_step=45, max_steps=100), grpo, None, 0)
    assert calls == ["beta"]
    assert (grpo.coefficients.beta, grpo.kl_options.beta) == (pytest.approx(0.07), 0.04)  # in use (halfway); configured
    assert grpo.step_metrics.compute_and_reset()["beta"] == pytest.approx(0.07)


def fit_args(model_dir: str, root, *extra: str) -> list[str]:
    configs = ("trainer/cpu", "data/arithmetic", "variant/grpo", "schedules/cosine_kl")
    return [
        "fit", *(a for name in configs for a in ("--config", str(CONFIGS / f"{name}.yaml"))),
        "--model.model", model_dir, "--model.sampling.group_size", "2", "--model.sampling.max_new_tokens", "4",
        "--data.batch_size", "2", "--data.num_train", "8", "--data.num_val", "2",
        "--trainer.max_steps", str(STEPS), "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root), "--trainer.logger.init_args.save_dir", str(root), *extra,
    ]  # fmt: skip


def logged_beta(trainer) -> dict[int, float]:
    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    return {event.step: event.value for event in events.Scalars("beta")}


@pytest.fixture(scope="module")
def scheduled_fit(tiny_model_dir, tmp_path_factory, one_torch_thread):
    """A 4-step CLI fit with configs/schedules/cosine_kl.yaml and a checkpoint after every step."""
    root = tmp_path_factory.mktemp("cosine_kl")
    checkpoints = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.dirpath", str(root / "every_step"),
                   "--trainer.callbacks.every_n_train_steps", "1", "--trainer.callbacks.save_top_k", "-1"]  # fmt: skip
    return GRPOLightningCLI(args=fit_args(tiny_model_dir, root, *checkpoints)), root


def test_the_shipped_config_adds_the_schedule_to_the_trainer_configs_callbacks():
    configs = ("trainer/cpu", "data/arithmetic", "variant/grpo", "schedules/cosine_kl")
    args = [*(a for name in configs for a in ("--config", str(CONFIGS / f"{name}.yaml"))), "--model.model", "m"]
    callbacks = GRPOLightningCLI(args=args, run=False).trainer.callbacks
    schedules = [c for c in callbacks if isinstance(c, CosineKLSchedule)]
    assert len(schedules) == 1 and (schedules[0].start, schedules[0].end) == (0.1, 0.04)
    assert any(isinstance(c, StepProgressBar) for c in callbacks)  # configs/trainer/cpu.yaml's are kept
    assert sum(type(c).__name__ == "ModelCheckpoint" for c in callbacks) == 2


def test_a_cli_fit_logs_the_scheduled_beta_at_every_step(scheduled_fit):
    cli, _ = scheduled_fit
    assert cli.trainer.global_step == STEPS
    expected = {step: cosine_kl_coefficient(step, STEPS, 0.1, 0.04) for step in range(STEPS)}
    # the update from step s is logged at s + 1, the optimizer steps taken
    assert logged_beta(cli.trainer) == pytest.approx({step + 1: beta for step, beta in expected.items()}, abs=1e-7)
    assert len(set(expected.values())) == STEPS  # steps 1-3 are on the cosine: four different values
    assert cli.model.coefficients.beta == pytest.approx(expected[STEPS - 1])  # what the last step's KL term used
    assert cli.model.hparams.kl["beta"] == 0.04  # the configured value stays in the hyperparameters


def test_a_resumed_fit_continues_the_schedule_from_its_checkpoints_step(scheduled_fit, tiny_model_dir, tmp_path):
    _, root = scheduled_fit
    checkpoint = next((root / "every_step").glob("*step=2.ckpt"))
    resumed = GRPOLightningCLI(args=fit_args(tiny_model_dir, tmp_path, "--ckpt_path", str(checkpoint)))
    assert resumed.trainer.global_step == STEPS
    expected = {step + 1: cosine_kl_coefficient(step, STEPS, 0.1, 0.04) for step in (2, 3)}  # logged at s + 1
    assert logged_beta(resumed.trainer) == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "grpo_lightning.variants.DAPO"], "error: kl.beta: the module's beta is 0.0:"),
        (["--trainer.max_steps", "-1"], "error: trainer.max_steps:"),
    ],
    ids=["beta-0", "no-max-steps"],
)
def test_the_cli_reports_a_fit_the_schedule_cannot_run_in_one_line(extra, message, tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main([*fit_args(tiny_model_dir, tmp_path), *extra], report_errors=True)
    assert done.value.code == 2
    assert capsys.readouterr().err.startswith(message)
