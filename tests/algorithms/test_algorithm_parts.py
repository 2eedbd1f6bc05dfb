"""Composing variants from the registered parts (:mod:`grpo_lightning.algorithms`) by name: what is
refused and why, the same parts making the same algorithm whichever class holds them, and the parts
on the command line and in sweeps. Each part's hand-computed values, and every part by name on every
variant, are in tests/conformance/."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from grpo_lightning import variants
from grpo_lightning.algorithms import ADVANTAGES, AGGREGATIONS
from grpo_lightning.cli.app import main
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.errors import ConfigError

PROMPTS = ["12+34=", "5+6=", "77+8="]  # x group_size 4 = 12 rows
#: Variants whose advantages are not one per completion from the rewards: their loop cannot take another estimator.
FIXED_ADVANTAGE = {"PPO", "ProcessGRPO"}

# ------------------------------------------------------------------ variants compose with the parts


@pytest.mark.parametrize("name", sorted(FIXED_ADVANTAGE))
def test_a_variant_whose_loop_makes_its_own_advantages_refuses_another(name):
    with pytest.raises(ConfigError, match=f"^advantage: does not apply to {name} "):
        getattr(variants, name)("unused", advantage="group_mean")


@pytest.mark.parametrize("option, registry", [("advantage", ADVANTAGES), ("aggregation", AGGREGATIONS)])
def test_an_unknown_part_name_is_refused_naming_the_option_and_the_choices(option, registry):
    with pytest.raises(ConfigError, match=f"^{option}: 'nope' is not one of {', '.join(registry)};"):
        variants.GRPO("unused", **{option: "nope"})


def test_scale_rewards_divides_only_group_std():
    assert variants.GRPO("unused", advantage="group_std", rewards={"scale": "batch"}).settings.advantage == "group_std"
    with pytest.raises(ConfigError, match="^rewards.scale: sets the divisor of group_std's advantages"):
        variants.GRPO("unused", advantage="leave_one_out", rewards={"scale": "none"})


def update_loss(module, rollout) -> float:
    n = len(rollout)
    rows = torch.arange(n)
    rewards = module.shape_rewards(rollout.rewards, rollout)
    advantages = module.advantages(rewards.view(-1, rollout.group_size)).flatten(0, 1)
    return module.micro_batch_loss(rollout, advantages, rows, n, module.loss_mask(rollout, rows).sum()).item()


def test_rloo_with_dr_grpos_parts_is_dr_grpo(make_module, make_rollout, one_torch_thread):
    """The same token loss with the same two parts is the same algorithm, whichever class holds them."""
    composed = make_module(
        variants.RLOO, advantage="group_mean", aggregation="seq_mean_token_sum_norm", kl={"beta": 0.0}
    )
    rollout = make_rollout(composed, PROMPTS)
    assert update_loss(composed, rollout) == update_loss(make_module(variants.DrGRPO), rollout)
    assert update_loss(composed, rollout) != update_loss(make_module(variants.RLOO, kl={"beta": 0.0}), rollout)


def test_grpo_with_the_token_mean_and_clip_higher_is_dapo_without_its_sampling(make_module, make_rollout,
                                                                                 one_torch_thread):  # fmt: skip
    composed = make_module(variants.GRPO, aggregation="token_mean", kl={"beta": 0.0}, loss={"clip_eps_high": 0.28})
    rollout = make_rollout(composed, PROMPTS)
    dapo = make_module(variants.DAPO, dynamic_sampling=False, overlong_buffer=0)
    assert update_loss(composed, rollout) == update_loss(dapo, rollout)


# ------------------------------------------------------------------ the command line


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        main(["fit", *args], report_errors=True)
    return exited.value.code, out.getvalue(), err.getvalue()


def variant_args(cls: type, *extra: str) -> list[str]:
    configs = config_dir()
    return ["--config", str(configs / "trainer/cpu.yaml"), "--config", str(configs / "data/arithmetic.yaml"),
            "--model", f"grpo_lightning.variants.{cls.__name__}", "--model.model", "m", *extra]  # fmt: skip


def test_the_command_line_composes_rloo_with_dr_grpos_aggregation_and_prints_it_round_trip(tmp_path):
    code, out, err = run_cli(*variant_args(variants.RLOO, "--model.aggregation", "seq_mean_token_sum_norm",
                                           "--model.advantage", "group_mean", "--print_config"))  # fmt: skip
    assert code == 0, err
    assert "aggregation: seq_mean_token_sum_norm" in out and "advantage: group_mean" in out
    (tmp_path / "config.yaml").write_text(out)
    code, again, err = run_cli("--config", str(tmp_path / "config.yaml"), "--print_config")
    assert code == 0 and again == out, err  # the printed file is the whole configuration


def test_the_command_line_refuses_ppos_advantage_in_one_line():
    code, _, err = run_cli(*variant_args(variants.PPO, "--model.advantage", "group_std", "--trainer.max_steps", "1"))
    assert code == 2
    assert "advantage: does not apply to PPO" in err and "Traceback" not in err


def test_a_sweep_axis_over_aggregations_builds_each_cell_with_its_part(tmp_path):
    from grpo_lightning.ablation.spec import SweepSpec
    from grpo_lightning.ablation.sweep import cell_command
    from grpo_lightning.cli.app import GRPOLightningCLI

    configs = config_dir()
    spec = SweepSpec.from_dict({
        "output_dir": str(tmp_path / "sweep"), "variants": ["grpo", "rloo"], "seeds": [0],
        "base_configs": [str(configs / name) for name in ("trainer/cpu.yaml", "data/arithmetic.yaml", "model/tiny.yaml")],
        "overrides": {"model.aggregation": ["token_mean", "seq_mean_token_mean"]},
    })  # fmt: skip
    cells = spec.cells()
    assert sorted(cell.arm for cell in cells) == [
        "grpo-aggregationseq_mean_token_mean", "grpo-aggregationtoken_mean",
        "rloo-aggregationseq_mean_token_mean", "rloo-aggregationtoken_mean",
    ]  # fmt: skip
    for cell in cells:
        command = cell_command(spec, cell, tmp_path / cell.name, model="some/model")
        cli = GRPOLightningCLI(args=command[command.index("fit") + 1 :], run=False)
        assert cli.model.settings.aggregation == dict(cell.overrides)["model.aggregation"]
