"""The module's option groups (``grpo_lightning.training.options``): the constructor's size, the variants'
presets as group defaults, each group's own checks, and plain values in the hyperparameters."""

from __future__ import annotations

import contextlib
import inspect
import io

import pytest
import yaml

from grpo_lightning import variants
from grpo_lightning.cli.app import main
from grpo_lightning.errors import ConfigError
from grpo_lightning.training.module import GroupPolicyOptimization
from grpo_lightning.training.options import GROUPS, KLOptions, LossOptions, OptimOptions, SamplingOptions

VARIANTS = [getattr(variants, name) for name in variants.__all__]


def test_the_base_constructor_takes_at_most_twelve_arguments_groups_included():
    parameters = list(inspect.signature(GroupPolicyOptimization.__init__).parameters)[1:]
    assert len(parameters) <= 12, parameters
    assert {"model", "advantage", "aggregation", *GROUPS} <= set(parameters)


def test_a_variant_presets_its_groups_and_a_partial_group_keeps_the_rest_of_the_preset():
    assert variants.DAPO("m").settings.clip_eps_high == 0.28 and variants.DAPO("m").coefficients.beta == 0.0
    partial = variants.DAPO("m", loss={"clip_eps_low": 0.1})  # a dict: only the fields it names
    assert (partial.settings.clip_eps_low, partial.settings.clip_eps_high) == (0.1, 0.28)
    whole = variants.DAPO("m", loss=LossOptions(clip_eps_low=0.1))  # an object: the whole group
    assert (whole.settings.clip_eps_low, whole.settings.clip_eps_high) == (0.1, 0.2)


def test_the_kl_estimator_follows_where_the_kl_goes_unless_named():
    assert variants.GRPO("m").settings.kl_estimator == "k3"  # in the loss
    for cls in (variants.RLOO, variants.ReinforcePlusPlus, variants.PPO):  # in the reward
        assert cls("m", kl=KLOptions(beta=0.1)).settings.kl_estimator == "k1"
        assert cls("m", kl={"estimator": "k2"}).settings.kl_estimator == "k2"
    assert variants.RLOO("m", kl={"placement": "loss"}).settings.kl_estimator == "k3"
    assert variants.GRPO("m", kl={"placement": "reward"}).settings.kl_estimator == "k1"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LossOptions(delta=1.1), r"^loss.delta: must exceed 1 \+ clip_eps_high = 1.2"),
        (lambda: LossOptions(clip_eps_low="0.2"), r"^loss.clip_eps_low: must be a finite number or null"),
        (lambda: OptimOptions(minibatch_size=6, micro_batch_size=4), r"^optim.minibatch_size \(6\) must be a multiple"),
        (lambda: SamplingOptions(mode="greedy"), r"^sampling.mode: 'greedy' is not one of"),
        (lambda: KLOptions(beta=0.0, unbiased=True), r"^kl.unbiased: weights the KL term"),
    ],
    ids=["loss", "loss-type", "optim", "sampling", "kl"],
)
def test_each_group_checks_itself_when_it_is_made(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: variants.DAPO("m", kl={"estimator": "k2"}), r"^kl.estimator: .*beta = 0 turns off"),
        (lambda: variants.GRPO("m", sampling={"correction_cap": 3.0}), r"^sampling.correction_cap: .*which is off"),
        (lambda: variants.SAPO("m", loss={"clip_eps_high": 0.28}), r"^loss.clip_eps_high: does not apply to SAPO"),
    ],
    ids=["kl-estimator-without-kl", "cap-without-correction", "sapo-clip"],
)
def test_an_option_that_would_change_nothing_is_refused_naming_it(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_an_unknown_field_of_a_group_is_refused_naming_the_group_and_its_fields():
    with pytest.raises(ConfigError, match="^loss: no option 'clip_eps'; give surrogate, clip_eps_low"):
        variants.GRPO("m", loss={"clip_eps": 0.1})


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda cls: cls.__name__)
def test_the_hyperparameters_are_plain_values_that_rebuild_the_same_module(cls):
    module = cls("m", loss={"entropy_coef": 0.01}, optim={"micro_batch_size": 4})
    hparams = dict(module.hparams)
    assert yaml.safe_load(yaml.safe_dump(hparams)) == hparams  # hparams.yaml, checkpoints (weights_only)
    again = cls(**hparams)  # as load_from_checkpoint builds it
    for name in GROUPS:
        assert getattr(again, f"{name}_options") == getattr(module, f"{name}_options")
    assert (again.settings.clip_eps_low, again.settings.clip_eps_high, again.settings.kl_estimator) == (
        module.settings.clip_eps_low, module.settings.clip_eps_high, module.settings.kl_estimator)  # fmt: skip


# ------------------------------------------------------------------ the command line


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        main(["fit", "--config", "trainer/cpu", "--config", "data/arithmetic", "--config", "variant/dapo",
              "--model.model", "m", *args], report_errors=True)  # fmt: skip
    return exited.value.code, out.getvalue(), err.getvalue()


def test_a_flat_setting_of_a_former_release_is_one_error_naming_its_group(tmp_path):
    code, _, err = run_cli("--model.clip_eps_high", "0.3")
    assert code == 2 and "error: --model.clip_eps_high moved to --model.loss.clip_eps_high" in err, err
    (tmp_path / "old.yaml").write_text("model:\n  init_args:\n    val_samples: 4\n")
    code, _, err = run_cli("--config", str(tmp_path / "old.yaml"))
    assert code == 2 and "error: --model.val_samples moved to --model.evaluation.samples" in err, err
    code, _, err = run_cli("--model.kl_in_reward", "false")
    assert code == 2 and "error: --model.kl_in_reward moved to --model.kl.placement" in err, err


def test_print_config_shows_the_groups_with_the_presets_and_round_trips(tmp_path):
    code, out, err = run_cli("--model.loss.clip_eps_low", "0.1", "--model.kl.beta", "0.01", "--model.kl.placement",
                             "reward", "--print_config")  # fmt: skip
    assert code == 0, err
    model = yaml.safe_load(out)["model"]["init_args"]
    assert model["kl"] == {"beta": 0.01, "estimator": None, "unbiased": False, "placement": "reward"}
    assert model["loss"]["clip_eps_low"] == 0.1 and model["loss"]["clip_eps_high"] == 0.28  # DAPO's preset kept
    assert set(GROUPS) <= set(model) and "class_path" not in model["loss"]
    (tmp_path / "config.yaml").write_text(out)
    code, again, err = run_cli("--config", str(tmp_path / "config.yaml"), "--print_config")
    assert code == 0 and again == out, err  # the printed file is the whole configuration
