"""The registered parts (:mod:`grpo_lightning.algorithms`): each against hand-computed values, each
aggregation micro-batch invariant, and every variant composing with the parts by name."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch.testing import assert_close

import variants
from grpo_lightning.algorithms import ADVANTAGES, AGGREGATIONS
from grpo_lightning.cli.app import main
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.training.settings import ConfigError
from tests.conftest import micro_batched_gradient

PROMPTS = ["12+34=", "5+6=", "77+8="]  # x group_size 4 = 12 rows
VARIANTS = [getattr(variants, name) for name in variants.__all__]
#: Variants whose advantages are not one per completion from the rewards: their loop cannot take another estimator.
FIXED_ADVANTAGE = {"PPO", "ProcessGRPO"}

# ------------------------------------------------------------------ advantages, by hand

# Group 0: rewards 1, 0, 0, 1 (mean 0.5; unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3) = 0.577350);
# group 1: all 2 (every estimator gives exactly 0 there).
REWARDS = [[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]
SIGNS = [1.0, -1.0, -1.0, 1.0]
HAND_ADVANTAGES = {
    "group_std": 0.5 / (3**-0.5 + 1e-4),  # (r - 0.5) / (std + 1e-4) = 0.865875
    "group_mean": 0.5,  # r - 0.5
    "leave_one_out": 2 / 3,  # r = 1: 1 - (0 + 0 + 1) / 3; r = 0: 0 - (1 + 0 + 1) / 3
    "batch_std": 0.5 / (1 / 7) ** 0.5,  # centred 8 entries, sum of squares 1, unbiased std sqrt(1/7): 1.322876
    "gpg": 8 / 6 * 0.5,  # alpha = 8 completions / 6 non-zero rewards, times r - 0.5
    "max_rl": 0.5 / (0.5 + 1e-6),  # (r - 0.5) / (mean 0.5 + 1e-6): +-1 for a success rate of 1/2
}


def test_the_registries_hold_the_named_parts():
    assert list(ADVANTAGES) == ["group_std", "group_mean", "leave_one_out", "batch_std", "gpg", "max_rl"]
    assert list(AGGREGATIONS) == ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]


@pytest.mark.parametrize("name", HAND_ADVANTAGES)
def test_each_advantage_estimator_against_hand_values(name):
    got = ADVANTAGES[name](torch.tensor(REWARDS))
    want = torch.tensor([[HAND_ADVANTAGES[name] * s for s in SIGNS], [0.0] * 4])
    assert_close(got, want, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ aggregations, by hand

# Two completions, 3 and 2 valid tokens (5 in all), length limit 4.
LOSS = [[1.0, 2.0, 3.0, 7.0], [4.0, 5.0, 7.0, 7.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
HAND_AGGREGATIONS = {
    "token_mean": 3.0,  # (1 + 2 + 3 + 4 + 5) / 5
    "seq_mean_token_mean": 3.25,  # (6 / 3 + 9 / 2) / 2
    "seq_mean_token_sum": 7.5,  # (6 + 9) / 2
    "seq_mean_token_sum_norm": 1.875,  # (6 + 9) / (2 * 4)
}


@pytest.mark.parametrize("name", HAND_AGGREGATIONS)
def test_each_aggregation_against_hand_values(name):
    got = AGGREGATIONS[name](torch.tensor(LOSS), torch.tensor(MASK), max_tokens=4)
    assert got.item() == pytest.approx(HAND_AGGREGATIONS[name], rel=1e-6)


@pytest.mark.parametrize("name", HAND_AGGREGATIONS)
def test_each_aggregation_summed_over_rows_with_the_batch_counts_is_the_batchs(name):
    loss, mask = torch.tensor(LOSS), torch.tensor(MASK)
    counts = {"num_sequences": 2, "num_tokens": mask.sum(), "max_tokens": 4}
    split = sum(AGGREGATIONS[name](loss[i : i + 1], mask[i : i + 1], **counts) for i in range(2))
    assert split.item() == pytest.approx(HAND_AGGREGATIONS[name], rel=1e-6)


@pytest.mark.parametrize("name", AGGREGATIONS)
def test_each_aggregation_gives_the_same_gradient_in_any_micro_batches(name, make_module, make_rollout, one_torch_thread):
    module = make_module(variants.GRPO, aggregation=name, kl={"beta": 0.0})
    rollout = make_rollout(module, PROMPTS)
    n = len(rollout)
    advantages = module.advantages(rollout.rewards.view(-1, rollout.group_size)).flatten()
    num_tokens = module.loss_mask(rollout, torch.arange(n)).sum()
    whole = micro_batched_gradient(module, rollout, advantages, [n], num_tokens)
    split = micro_batched_gradient(module, rollout, advantages, [5, 4, 3], num_tokens)
    assert any(g.abs().sum() > 0 for g in whole.values())
    for key in whole:
        assert_close(split[key], whole[key], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}, {key}: {m}")


# ------------------------------------------------------------------ variants compose with the parts


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda cls: cls.__name__)
def test_every_variant_names_parts_that_are_registered(cls):
    assert cls.default_aggregation in AGGREGATIONS
    assert cls.default_advantage in ADVANTAGES or cls.__name__ in FIXED_ADVANTAGE


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda cls: cls.__name__)
def test_every_variant_takes_any_aggregation_and_advantage_by_name(cls):
    module = cls("unused", aggregation="seq_mean_token_sum_norm", **({} if cls.__name__ in FIXED_ADVANTAGE else
                                                                    {"advantage": "leave_one_out"}))  # fmt: skip
    assert module.aggregation_name == "seq_mean_token_sum_norm"
    assert module.advantage_name == (cls.default_advantage if cls.__name__ in FIXED_ADVANTAGE else "leave_one_out")
    loss, mask = torch.tensor(LOSS), torch.tensor(MASK)
    assert module.aggregate(loss, mask).item() == pytest.approx(15 / (2 * module.max_new_tokens))


@pytest.mark.parametrize("name", sorted(FIXED_ADVANTAGE))
def test_a_variant_whose_loop_makes_its_own_advantages_refuses_another(name):
    with pytest.raises(ConfigError, match=f"^advantage: does not apply to {name} "):
        getattr(variants, name)("unused", advantage="group_mean")


@pytest.mark.parametrize("option, registry", [("advantage", ADVANTAGES), ("aggregation", AGGREGATIONS)])
def test_an_unknown_part_name_is_refused_naming_the_option_and_the_choices(option, registry):
    with pytest.raises(ConfigError, match=f"^{option}: 'nope' is not one of {', '.join(registry)};"):
        variants.GRPO("unused", **{option: "nope"})


def test_scale_rewards_divides_only_group_std():
    assert variants.GRPO("unused", advantage="group_std", rewards={"scale": "batch"}).advantage_name == "group_std"
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
            "--model", f"variants.{cls.__name__}", "--model.model", "m", *extra]  # fmt: skip


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda cls: cls.__name__)
def test_print_config_shows_the_parts_and_takes_them_from_the_command_line(cls):
    code, out, err = run_cli(*variant_args(cls, "--model.aggregation", "seq_mean_token_mean", "--print_config"))
    assert code == 0, err
    assert "    aggregation: seq_mean_token_mean\n" in out and "    advantage: null\n" in out
    assert "    surrogate: null\n" in out


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
        assert cli.model.aggregation_name == dict(cell.overrides)["model.aggregation"]
