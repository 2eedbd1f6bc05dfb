"""Specification of OnlineDPOGRPO: GRPO's loss plus DPO (Rafailov et al. 2023, eq. 7) on each
group's best and worst completion.

The pair selection and the pair loss by hand are tests/algorithms/test_dpo.py. The total loss runs
the real module on a tiny random model, with ``manual_backward`` replaced by a plain ``backward``
that also records each backpropagated loss (the gradient's micro-batch invariance is the conformance
suite's, tests/conformance/).
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
import transformers

from grpo_lightning.algorithms import dpo
from grpo_lightning.algorithms import functional as F
from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants.online_dpo_grpo import pairs_of_roles
from grpo_lightning.variants import GRPO, OnlineDPOGRPO
from tests.helpers import perturb

CONFIGS = config_dir()
PROMPTS = ["12+34=", "5+6=", "77+8=", "9*9="]  # x group_size 4 = 16 rows


def length_reward(prompts: list, completions: list[str], **columns) -> list[float]:
    """``len(completion) % 3``: the completions of a prompt mostly differ, so most groups give a pair."""
    return [float(len(c) % 3) for c in completions]


# ------------------------------------------------------------------ options


def test_construction_loads_nothing_and_has_the_defaults(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the constructor must not load a model or tokenizer")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    module = OnlineDPOGRPO(model="no-such/model")
    assert (module.dpo_weight, module.dpo_beta) == (1.0, 0.1)
    assert module.coefficients.beta == 0.04 and module.hparams["dpo_beta"] == 0.1  # GRPO's KL; the CLI records both
    assert module.policy is None and module.ref_model is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dpo_weight": -1.0}, "^dpo_weight: must be a finite number >= 0"),
        ({"dpo_weight": float("nan")}, r"^dpo_weight: must be a finite number \(got nan\)"),
        ({"dpo_beta": 0.0}, "^dpo_beta: must be a finite number > 0"),
        ({"dpo_beta": float("inf")}, r"^dpo_beta: must be a finite number \(got inf\)"),
    ],
)
def test_bad_options_are_errors_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        OnlineDPOGRPO(model="unused", **kwargs)


def test_the_reference_model_loads_even_without_a_kl_term(make_module):
    module = make_module(OnlineDPOGRPO, kl={"beta": 0.0})
    assert module.needs_reference_model() and module.ref_model is not None
    assert not any(p.requires_grad for p in module.ref_model.parameters())


# ------------------------------------------------------------------ the module on a real rollout


@pytest.fixture
def prepared(make_module, make_rollout, monkeypatch, one_torch_thread):
    """An OnlineDPOGRPO module (dpo_weight 0.5, GRPO's KL on), a scored rollout with reference
    log-probs of a perturbed reference, its advantages, and the list of backpropagated losses."""
    module = make_module(OnlineDPOGRPO, dpo_weight=0.5, dpo_beta=0.2, rewards={"funcs": [length_reward]})
    rollout = make_rollout(module, PROMPTS)
    perturb(module.ref_model)
    rollout.ref_logp = module.compute_logprobs(module.ref_model, rollout)
    advantages = module.advantages(rollout.rewards.view(-1, rollout.group_size)).flatten()
    module.shape_rewards(rollout.rewards, rollout)  # the step's pairs, into rollout.derived
    losses: list[torch.Tensor] = []

    def backward(loss):
        losses.append(loss.detach())
        loss.backward()

    monkeypatch.setattr(module, "manual_backward", backward)
    return module, rollout, advantages, losses


def step_pairs(rollout) -> tuple[torch.Tensor, torch.Tensor]:
    return pairs_of_roles(rollout.derived["dpo_pair"])


def _pairs_by_hand(rewards: list[float], group_size: int) -> list[tuple[int, int]]:
    pairs = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        if max(group) > min(group):
            pairs.append((start + group.index(max(group)), start + group.index(min(group))))
    return pairs


def _dpo_term_by_hand(module, rollout, pairs) -> float:
    policy = F.masked_sum(module.compute_logprobs(module.policy, rollout), rollout.completion_mask, dim=-1).tolist()
    ref = F.masked_sum(rollout.ref_logp, rollout.completion_mask, dim=-1).tolist()
    terms = []
    for winner, loser in pairs:
        margin = module.dpo_beta * ((policy[winner] - ref[winner]) - (policy[loser] - ref[loser]))
        terms.append(-math.log(1 / (1 + math.exp(-margin))))
    return module.dpo_weight * sum(terms) / len(pairs)


def test_total_loss_is_grpos_plus_the_dpo_term_by_hand(prepared, make_module):
    module, rollout, advantages, losses = prepared
    n = len(rollout)
    pairs = _pairs_by_hand(rollout.rewards.tolist(), rollout.group_size)
    assert len(pairs) >= 2
    assert list(zip(*(rows.tolist() for rows in step_pairs(rollout)))) == pairs
    module.accumulate_gradients(rollout, advantages, torch.arange(n))

    grpo = make_module(GRPO, rewards={"funcs": [length_reward]})  # the same weights, from the same directory
    with torch.no_grad():
        grpo_loss = grpo.micro_batch_loss(rollout, advantages, torch.arange(n), n, rollout.completion_mask.sum())
    expected = float(grpo_loss) + _dpo_term_by_hand(module, rollout, pairs)
    assert float(sum(losses)) == pytest.approx(expected, rel=1e-5)
    metrics = module.step_metrics.compute_and_reset()
    assert metrics["dpo/loss"] == pytest.approx(_dpo_term_by_hand(module, rollout, pairs) / module.dpo_weight, rel=1e-5)
    assert 0.0 <= metrics["dpo/accuracy"] <= 1.0 and metrics["dpo/reward_margin"] != 0.0


def test_with_several_minibatches_each_pair_is_averaged_in_its_winners_minibatch(prepared):
    module, rollout, _, losses = prepared
    module.settings = dataclasses.replace(module.settings, micro_batch_size=4)
    module.dpo_weight = 1.0
    rows = torch.arange(len(rollout))[torch.arange(len(rollout)) % 2 == 0]  # every other row: the losers may be out
    led = dpo.pairs_led_by(rows, *step_pairs(rollout))
    assert 0 < len(led[0]) < len(step_pairs(rollout)[0])
    module.backward_extra_losses(module.pair_passes(rollout, *led, padding=rows[:1]))
    assert float(sum(losses)) == pytest.approx(_dpo_term_by_hand(module, rollout, list(zip(led[0].tolist(), led[1].tolist()))), rel=1e-5)


def test_a_minibatch_without_pairs_runs_no_pair_pass(prepared):
    module, rollout, _, losses = prepared
    empty = torch.zeros(0, dtype=torch.long)
    module.backward_extra_losses(module.pair_passes(rollout, empty, empty, padding=torch.arange(1)))  # no forward of zero rows
    assert losses == [] and "dpo/loss" not in module.step_metrics.compute_and_reset()


def test_every_device_runs_as_many_pair_passes_and_the_count_is_their_mean(prepared, monkeypatch):
    """A second device with 3 more passes and 10 more pairs, through stand-ins for the collectives
    (the real ones need several processes)."""
    module, rollout, _, losses = prepared
    module.settings = dataclasses.replace(module.settings, micro_batch_size=2)  # one pair a pass
    strategy = SimpleNamespace(reduce=lambda value, reduce_op: value + 10.0)
    monkeypatch.setattr(module, "_trainer", SimpleNamespace(world_size=2, strategy=strategy))
    monkeypatch.setattr(module, "min_over_ranks", lambda value: min(value, -(len(step_pairs(rollout)[0]) + 3)))
    passes: list[torch.Tensor] = []
    monkeypatch.setattr(module, "pair_losses", lambda r, w, lo: passes.append(w) or OnlineDPOGRPO.pair_losses(module, r, w, lo))
    module.backward_extra_losses(module.pair_passes(rollout, *step_pairs(rollout), padding=torch.tensor([0])))
    k = len(step_pairs(rollout)[0])
    assert len(passes) == k + 3 and all(float(loss) == 0.0 for loss in losses[k:])  # padding weighs nothing
    mean_count = (k + 10) / 2
    by_hand = _dpo_term_by_hand(module, rollout, list(zip(*(rows.tolist() for rows in step_pairs(rollout))))) * k / mean_count
    assert float(sum(losses)) == pytest.approx(by_hand, rel=1e-5)


# ------------------------------------------------------------------ the CLI


def test_a_two_step_fit_through_the_cli_with_the_shipped_config(tiny_model_dir, tmp_path, one_torch_thread):
    cli = GRPOLightningCLI(
        args=[
            "fit",
            "--config",
            str(CONFIGS / "trainer/cpu.yaml"),
            "--config",
            str(CONFIGS / "data/arithmetic.yaml"),
            "--config",
            str(CONFIGS / "variant/online_dpo_grpo.yaml"),
            "--model.model",
            tiny_model_dir,
            "--model.rewards.funcs",
            f"[{__name__}.length_reward]",
            "--model.kl.beta",
            "0.0",
            "--model.sampling.group_size",
            "4",
            "--model.sampling.max_new_tokens",
            "6",
            "--model.optim.micro_batch_size",
            "4",
            "--data.batch_size",
            "3",
            "--trainer.max_steps",
            "2",
            "--trainer.limit_val_batches",
            "0",
            "--validate_before_fit",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_checkpointing",
            "false",
            "--trainer.callbacks",
            "[]",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
        ]
    )
    assert type(cli.model) is OnlineDPOGRPO and cli.model.dpo_beta == 0.1
    assert cli.trainer.global_step == 2 and cli.model.ref_model is not None  # loaded with beta 0
    logged = cli.model.last_step_metrics
    assert {"dpo/loss", "dpo/pairs", "dpo/reward_margin", "dpo/accuracy"} <= set(logged)
    assert 1 <= logged["dpo/pairs"] <= 3 and math.isfinite(logged["dpo/loss"])
    assert cli.trainer.log_dir.endswith("online_dpo_grpo/version_0")
