"""Every variant: found in ``variants/`` (a new file is picked up), a preset of the registry,
its gradient independent of the micro-batch size, its printed configuration read back into the same
module, and every registered part by name either composed with it or refused naming the option.

Tiny models from ``tests/conftest.py``, no fit: one rollout per variant, and the real LightningCLI
for the configuration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import re
import sys
import types
from pathlib import Path

import lightning as L
import pytest
import torch
import transformers
import yaml
from torch.testing import assert_close

from grpo_lightning import variants
from grpo_lightning.algorithms import ADVANTAGES, AGGREGATIONS, SURROGATES
from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.advantages import TOKEN_STATISTICS_ADVANTAGES, TokenStatistics
from grpo_lightning.algorithms.kl import KL_PLACEMENTS
from grpo_lightning.cli.app import GRPOLightningCLI, main, variant_log_name
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.cli.variants import shipped_variants
from grpo_lightning.training.module import GroupPolicyOptimization
from grpo_lightning.errors import ConfigError
from tests.helpers import grouped


def defined_in_variants() -> dict[str, type]:
    """Every ``GroupPolicyOptimization`` subclass defined in a file of ``variants/``, by class name."""
    found = {}
    for path in sorted(Path(variants.__file__).parent.glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"{variants.__name__}.{path.stem}")
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, GroupPolicyOptimization):
                if value.__module__ == module.__name__:  # defined there, not imported
                    found[name] = value
    return found


DEFINED = defined_in_variants()
#: Classes of variants/ that others there build on and that are not exported (CovarianceRule): not variants.
SHARED_BASES = {
    name for name, cls in DEFINED.items()
    if name not in variants.__all__ and any(other is not cls and issubclass(other, cls) for other in DEFINED.values())
}  # fmt: skip
VARIANTS = [cls for name, cls in DEFINED.items() if name not in SHARED_BASES]
SHIPPED = {class_path: name for name, class_path in shipped_variants().items()}  # "grpo_lightning.variants.DAPO" -> "dapo"
CONFIGS = config_dir()
BASE = ["--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml")]


def by_name(cls: type) -> str:
    return cls.__name__


def test_every_variant_is_a_preset_of_the_registry_named_for_its_file():
    """The registry's other checks (its configs, short names and README rows) are in tests/variants/test_registry.py."""
    for cls in VARIANTS:
        name, module = cls.__name__, cls.__module__.rpartition(".")[2]
        assert variants.PRESETS.get(module) == name, f'{name}: add "{module}": "{name}" to PRESETS in variants/__init__.py'
        assert getattr(variants, name) is cls and SHIPPED[f"grpo_lightning.variants.{name}"] == module
    assert sorted(variants.PRESETS.values()) == sorted(cls.__name__ for cls in VARIANTS)


@pytest.mark.parametrize("cls", VARIANTS, ids=by_name)
def test_the_variants_parts_are_registered(cls):
    assert cls.default_surrogate in SURROGATES
    assert cls.default_aggregation in AGGREGATIONS
    # None: advantages of the variant's own loop (PPO's GAE, ProcessGRPO's steps), which refuses another.
    assert cls.default_advantage in (None, *ADVANTAGES)
    assert cls.default_kl_placement in KL_PLACEMENTS and set(cls.refused_kl_placements) <= set(KL_PLACEMENTS)


# ------------------------------------------------------------------ micro-batch invariance

PROMPTS, ANSWERS = ["12+34=", "5+6=", "77+8="], ["46", "11", "85"]  # x group_size 4 = 12 rows


def alternating_steps(prompts, completions, token_ends, **columns):
    """A step per token, scored 0, 1, 0, ...: per-token advantages that are not all 0."""
    return [[(t, float(t % 2)) for t in range(len(ends))] for ends in token_ends]


#: What a variant needs beyond its defaults for its rule to act on this rollout: advantages that are
#: not all 0 (ProcessGRPO), tokens to detach (ClipCov's covariance range holds none of these).
SETTINGS = {
    "ProcessGRPO": {"step_reward_func": alternating_steps},
    "ClipCov": {"clip_cov_ratio": 0.3, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
}


def noise(like: torch.Tensor, seed: int) -> torch.Tensor:
    return 0.3 * torch.randn(like.shape, generator=torch.Generator().manual_seed(seed), dtype=like.dtype)


def advantages_off_policy(module, rollout) -> torch.Tensor:
    """The advantages ``[N]`` (or ``[N, T]``) of ``rollout`` as a step computes them, with old (and
    reference) log-probs of the policy's own plus fixed noise: ratios leave 1, clips and gates act,
    the KL is not 0."""
    logp = module.compute_logprobs(module.policy, rollout)
    rollout.old_logp = logp + noise(logp, 1)
    if module.needs_reference_model():
        rollout.ref_logp = logp + noise(logp, 2)
    rewards = module.shape_rewards(rollout.rewards, rollout)
    return module.advantages(rewards.view(-1, rollout.group_size), rollout).flatten(0, 1)


def minibatch_gradient(module, rollout, advantages, micro_batch_size: int | None, monkeypatch,
                       micro_batch_tokens: int | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """The policy's gradient of one minibatch (the whole rollout) as the update accumulates it
    (``accumulate_gradients``: the variant's ``minibatch_derived`` and ``extra_losses``, then its
    micro-batches), ``micro_batch_size`` rows or ``micro_batch_tokens`` tokens a pass; ``backward``
    stands in for the Trainer's ``manual_backward``."""
    monkeypatch.setattr(module, "settings", dataclasses.replace(module.settings, micro_batch_size=micro_batch_size))
    monkeypatch.setattr(module, "optim_options", dataclasses.replace(
        module.optim_options, micro_batch_size=micro_batch_size, micro_batch_tokens=micro_batch_tokens))
    module.policy.zero_grad(set_to_none=True)
    monkeypatch.setattr(module, "manual_backward", lambda loss: loss.backward())
    module.accumulate_gradients(rollout, advantages, torch.arange(len(rollout)))
    return {name: p.grad.clone() for name, p in module.policy.named_parameters()}


def check_micro_batch_invariance(cls, make_module, make_rollout, monkeypatch) -> None:
    module = make_module(cls, **SETTINGS.get(cls.__name__, {}))
    rollout = make_rollout(module, PROMPTS, answer=ANSWERS)
    advantages = advantages_off_policy(module, rollout)
    assert advantages.abs().sum() > 0 and rollout.lengths.min() < rollout.lengths.max()
    whole = minibatch_gradient(module, rollout, advantages, len(rollout), monkeypatch)
    split = {"single rows": minibatch_gradient(module, rollout, advantages, 1, monkeypatch)}
    if "optim.micro_batch_tokens" not in cls.inapplicable_options:  # packed by tokens: ragged, out of row order
        tokens = (rollout.prompt_mask.sum(-1) + rollout.attended_mask.sum(-1)).tolist()
        budget = int(2.5 * sum(tokens) / len(tokens))
        split["a token budget"] = minibatch_gradient(module, rollout, advantages, None, monkeypatch, budget)
        assert 1 < len(module.micro_batches(rollout, torch.arange(len(rollout)))) < len(rollout)
    assert any(g.abs().sum() > 0 for g in whole.values())
    for how, gradient in split.items():
        for name in whole:
            assert_close(gradient[name], whole[name], rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{how}: {n}: {m}")


@pytest.mark.parametrize("cls", VARIANTS, ids=by_name)
def test_the_gradient_in_micro_batches_of_one_row_is_the_whole_batchs(cls, make_module, make_rollout, monkeypatch,
                                                                       one_torch_thread):  # fmt: skip
    check_micro_batch_invariance(cls, make_module, make_rollout, monkeypatch)


def test_grpo_with_the_kl_in_the_reward_has_a_gradient_independent_of_the_micro_batch_size(
    make_module, make_rollout, monkeypatch, one_torch_thread
):
    def in_reward(cls, **kwargs):
        return make_module(cls, kl={"beta": 0.1, "placement": "reward"}, **kwargs)

    check_micro_batch_invariance(variants.GRPO, in_reward, make_rollout, monkeypatch)


# ------------------------------------------------------------------ the KL in the reward, by name


@pytest.mark.parametrize("cls", VARIANTS, ids=by_name)
def test_the_kl_in_the_reward_by_name_is_beta_times_the_summed_k1_or_refused_naming_the_option(
    cls, make_module, make_rollout, one_torch_thread
):
    """``kl.placement reward`` shifts each reward the variant's ``shape_rewards`` returns by
    ``-beta * sum_t k1_t`` against ``kl.placement loss`` (an override that drops the base's
    shaping fails here), or is a ConfigError naming ``kl.placement``."""
    settings = SETTINGS.get(cls.__name__, {})
    try:
        in_reward = make_module(cls, kl={"beta": 0.1, "placement": "reward"}, **settings)
    except ConfigError as error:
        assert str(error).startswith("kl.placement:"), error
        return
    in_loss = make_module(cls, kl={"beta": 0.1, "placement": "loss"}, **settings)
    rollout = make_rollout(in_reward, PROMPTS, answer=ANSWERS)
    logp = in_reward.compute_logprobs(in_reward.policy, rollout)
    rollout.old_logp, rollout.ref_logp = logp + noise(logp, 1), logp + noise(logp, 2)
    k1 = F.masked_sum(rollout.old_logp - rollout.ref_logp, rollout.completion_mask, dim=-1)
    assert k1.abs().min() > 0
    expected = in_loss.shape_rewards(rollout.rewards, rollout) - 0.1 * k1
    assert_close(in_reward.shape_rewards(rollout.rewards, rollout), expected)


# ------------------------------------------------------------------ the configuration, printed and read back

#: Arguments of the ``fit`` subcommand (``--ckpt_path``, ...) that are not the configuration of the objects.
FIT_ONLY = set(inspect.signature(L.Trainer.fit).parameters) - {"self"} - GRPOLightningCLI.subcommands()["fit"]


def printed_config(*args: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
        main(["fit", *args, "--print_config"], report_errors=True)
    assert done.value.code == 0, err.getvalue()
    return yaml.safe_load(out.getvalue())


def hyperparameters(module) -> dict:
    return {key: value for key, value in module.hparams.items() if not key.startswith("_")}  # not the CLI's _class_path


@pytest.mark.parametrize("cls", VARIANTS, ids=by_name)
def test_print_config_reads_back_into_the_same_module(cls, tmp_path, monkeypatch):
    """``fit --print_config`` with the shipped config and a part by name, read back by the CLI: the
    same class with the same hyper-parameters as built in Python, and no model loaded."""

    def refuse(*args, **kwargs):
        raise AssertionError("the configuration must not load a model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    aggregation = next(name for name in AGGREGATIONS if name != cls.default_aggregation)
    shipped = CONFIGS / "variant" / f"{SHIPPED[f'grpo_lightning.variants.{cls.__name__}']}.yaml"
    config = printed_config(*BASE, "--config", str(shipped), "--model.model", "m", "--model.aggregation", aggregation)
    assert config["model"]["class_path"] == f"grpo_lightning.variants.{cls.__name__}"
    assert {key: config.pop(key) for key in FIT_ONLY} == dict.fromkeys(FIT_ONLY)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))

    module = GRPOLightningCLI(args=["--config", str(tmp_path / "config.yaml")], run=False).model
    assert type(module) is cls and module.policy is None
    assert module.settings.aggregation == aggregation
    assert hyperparameters(module) == hyperparameters(cls("m", aggregation=aggregation))
    assert variant_log_name(cls.__name__) == shipped.stem  # runs are filed under the config's name


# ------------------------------------------------------------------ every part by name

# Shared inputs on which a built module's part is compared with the registered function.
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
LOSS = torch.tensor([[1.0, 2.0, 3.0, 7.0], [4.0, 5.0, 7.0, 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
# The completions' per-token statistics that some advantages read (OTB's), T = 3, ragged.
TOKEN_STATISTICS = TokenStatistics(
    torch.linspace(-2.0, -0.1, 24).view(2, 4, 3), torch.linspace(0.2, 0.9, 24).view(2, 4, 3),
    (torch.arange(3) < torch.tensor([[3, 1, 2, 3], [2, 3, 3, 1]]).unsqueeze(-1)).float(),
)
STEP_ROLLOUT = types.SimpleNamespace(completion_mask=TOKEN_STATISTICS.mask.flatten(0, 1), derived={
    "token_logp": TOKEN_STATISTICS.logp.flatten(0, 1), "sum_pi_squared": TOKEN_STATISTICS.sum_pi_squared.flatten(0, 1)})
OPTIONS = {"advantage": ADVANTAGES, "aggregation": AGGREGATIONS, "loss.surrogate": SURROGATES,
           "kl.placement": KL_PLACEMENTS}  # fmt: skip
#: What an option needs besides its name to act (a placement puts a KL that beta 0 turns off).
ACTS_WITH = {"kl.placement": {"kl.beta": 0.1}}


def uses_the_part(module, option: str, name: str) -> None:
    """The module computes with the part named, not with its own."""
    if option == "advantage":
        assert module.settings.advantage == name
        tokens = (TOKEN_STATISTICS,) if name in TOKEN_STATISTICS_ADVANTAGES else ()
        assert torch.equal(module.advantages(REWARDS, STEP_ROLLOUT), ADVANTAGES[name](REWARDS, *tokens))
    elif option == "aggregation":
        assert module.settings.aggregation == name
        expected = AGGREGATIONS[name](LOSS, MASK, max_tokens=module.max_new_tokens)
        assert torch.equal(module.aggregate(LOSS, MASK), expected)
    elif option == "kl.placement":
        assert module.settings.kl_placement == name
        assert module.settings.kl_estimator == KL_PLACEMENTS[name].estimator  # k3 in the loss, k1 in the reward
    else:
        assert module.settings.surrogate == name


def check_parts_by_name(cls, option: str) -> None:
    """``--model.<option> NAME`` is the constructor's argument (a group's field for ``loss.surrogate``);
    no model is loaded. A refusal is a ConfigError whose message names the option; anything else fails."""
    refused: dict[str, str] = {}
    for name in OPTIONS[option]:
        try:
            module = cls("m", **grouped({option: name, **ACTS_WITH.get(option, {})}))
        except ConfigError as error:
            message = str(error)
            assert message.startswith(f"{option}:") or f"--model.{option}" in message, message
            refused[name] = message
            continue
        uses_the_part(module, option, name)
    own = {"advantage": cls.default_advantage, "aggregation": cls.default_aggregation}.get(option)
    if option not in cls.inapplicable_options:  # an option it takes: its own part by name is no change
        assert own not in refused, f"{cls.__name__} refuses its own {option} by name: {refused[own]}"


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("cls", VARIANTS, ids=by_name)
def test_every_part_by_name_builds_the_variant_with_it_or_is_refused_naming_the_option(cls, option):
    check_parts_by_name(cls, option)


# ------------------------------------------------------------------ the page's example


def test_the_preset_that_docs_adding_a_variant_adds_passes_the_variants_checks(make_module, make_rollout, monkeypatch,
                                                                                one_torch_thread):  # fmt: skip
    page = (Path(variants.__file__).resolve().parents[1] / "docs" / "adding_a_variant.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if "class BatchStdGRPO" in block)
    file = types.ModuleType("grpo_lightning.variants.batch_std_grpo")  # as if it were the file the page names
    monkeypatch.setitem(sys.modules, file.__name__, file)
    exec(code, vars(file))  # noqa: S102 - the page's example
    cls = file.BatchStdGRPO
    module = cls("m")
    assert (module.settings.advantage, module.settings.aggregation, module.coefficients.beta) == ("batch_std", "token_mean", 0.0)
    assert cls("m", kl={"beta": 0.01}).coefficients.beta == 0.01
    check_micro_batch_invariance(cls, make_module, make_rollout, monkeypatch)
    for option in OPTIONS:
        check_parts_by_name(cls, option)


# ------------------------------------------------------------------ a user's parts, registered from their module


def with_user_parts(make_module, path: str):
    """``make_module`` with the advantage, the aggregation and the KL placement of ``path`` (a user's
    module, ``tests/conformance/user_parts.py``), each named by an import path."""

    def make(cls, **kwargs):
        return make_module(cls, advantage=f"{path}.group_median", aggregation=f"{path}.sqrt_length_mean",
                           kl={"beta": 0.1, "placement": f"{path}.HalfInRewardHalfInLoss"}, **kwargs)  # fmt: skip

    return make


def test_a_users_parts_by_import_path_give_a_gradient_independent_of_the_micro_batch_size(
    user_parts, make_module, make_rollout, monkeypatch, one_torch_thread
):
    make = with_user_parts(make_module, user_parts)
    module = make(variants.GRPO, configure=False)
    assert (module.settings.advantage, module.settings.aggregation) == ("group_median", "seq_mean_token_sqrt_mean")
    assert (module.settings.kl_placement, module.settings.kl_estimator) == ("half_and_half", "k3")
    check_micro_batch_invariance(variants.GRPO, make, make_rollout, monkeypatch)


@pytest.mark.parametrize("cls", [variants.GRPO, variants.RLOO], ids=by_name)
def test_a_users_parts_once_registered_build_a_variant_by_name_like_a_shipped_part(cls, user_parts):
    importlib.import_module(user_parts)
    assert {"group_median", "seq_mean_token_sqrt_mean", "half_and_half"} <= {*ADVANTAGES, *AGGREGATIONS, *KL_PLACEMENTS}
    for option in OPTIONS:
        check_parts_by_name(cls, option)


def test_a_users_part_by_import_path_on_the_command_line_reads_back_by_that_path(user_parts, tmp_path):
    shipped = CONFIGS / "variant" / f"{SHIPPED['grpo_lightning.variants.GRPO']}.yaml"
    config = printed_config(*BASE, "--config", str(shipped), "--model.model", "m",
                            "--model.advantage", f"{user_parts}.group_median")  # fmt: skip
    assert config["model"]["init_args"]["advantage"] == f"{user_parts}.group_median"
    for key in FIT_ONLY:
        config.pop(key)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    module = GRPOLightningCLI(args=["--config", str(tmp_path / "config.yaml")], run=False).model
    assert module.settings.advantage == "group_median"
    message = f"advantage: '{user_parts}.nope' is not one of group_std, .*{user_parts} has no 'nope'"
    with pytest.raises(ValueError, match=message):  # the ConfigError, in jsonargparse's
        GRPOLightningCLI(args=["--config", str(tmp_path / "config.yaml"), "--model.advantage", f"{user_parts}.nope"],
                         run=False)  # fmt: skip
