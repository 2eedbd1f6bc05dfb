"""Every invalid setting is a ``ConfigError`` naming the field, raised when the module is built, and
every valid one builds without loading a model.

Property-based (``hypothesis``): invalid values of each argument of ``GroupPolicyOptimization`` and
the variants (out of range, NaN and infinities, wrong types, unknown names, settings that contradict
each other) and valid combinations, through the constructors and through the CLI (one ``error:``
line, exit status 2). The model is a hub id that does not exist: a constructor that loaded it would
fail, so a module that builds has loaded nothing.
"""

from __future__ import annotations

import contextlib
import io
import math

import lightning as L
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_lightning import variants
from grpo_lightning.algorithms import ADVANTAGES, AGGREGATIONS, SURROGATES
from grpo_lightning.runtime.argument_types import annotated_arguments
from grpo_lightning.cli.app import GRPOLightningCLI, main
from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.training.module import GroupPolicyOptimization
from grpo_lightning.training.options import GROUPS
from grpo_lightning.algorithms.rollout_correction import CORRECTIONS
from grpo_lightning.errors import ConfigError
from tests.helpers import grouped

MISSING_MODEL = "no-such-org/no-such-model"
PROPERTY = settings(max_examples=60, deadline=None, database=None, derandomize=True)
CLI_PROPERTY = settings(
    max_examples=16, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
VARIANTS = [getattr(variants, name) for name in variants.__all__]

NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
NOT_A_NUMBER = st.one_of(st.text(max_size=4), st.booleans(), st.lists(st.integers(), max_size=2))
NOT_AN_INTEGER = st.one_of(NOT_A_NUMBER, st.floats(allow_nan=False).filter(lambda x: not x.is_integer()))
NOT_A_BOOL = st.one_of(st.integers(0, 1), st.sampled_from(["true", "false", "yes", ""]), st.none())


def floats(**bounds) -> st.SearchStrategy[float]:
    return st.floats(allow_nan=False, allow_infinity=False, **bounds)


def other_text(*valid: str) -> st.SearchStrategy[str]:
    return st.text(max_size=12).filter(lambda text: text not in valid)


def number(invalid_range: st.SearchStrategy, optional: bool = False) -> st.SearchStrategy:
    """Numbers out of range, NaN and infinities, and values that are not numbers (``None`` too
    unless the setting is optional)."""
    wrong_type = NOT_A_NUMBER if optional else st.one_of(NOT_A_NUMBER, st.none())
    return st.one_of(invalid_range, NOT_FINITE, wrong_type)


#: Integers no tensor holds: past int64, and past a float's range.
HUGE_INTEGERS = st.one_of(st.integers(min_value=2**63), st.integers(max_value=-(2**63) - 1), st.just(10**400))


def integer(invalid_range: st.SearchStrategy, optional: bool = False) -> st.SearchStrategy:
    wrong_type = NOT_AN_INTEGER if optional else st.one_of(NOT_AN_INTEGER, st.none())
    return st.one_of(invalid_range, HUGE_INTEGERS, wrong_type)


#: Invalid values of each option of the base module (``group.field``, or an argument), the others at their defaults.
INVALID = {
    "policy.tokenizer": st.one_of(st.just(""), st.integers()),
    "policy.dtype": other_text("auto", "float32", "bfloat16", "float16"),
    "sampling.dtype": other_text("float32", "bfloat16", "float16"),
    "policy.gradient_checkpointing": NOT_A_BOOL,
    "policy.disable_dropout": NOT_A_BOOL,
    "policy.attn_implementation": st.integers(),
    "sampling.seed": st.one_of(st.text(max_size=3), st.floats(allow_nan=False).filter(lambda x: not x.is_integer())),
    "rewards.funcs": st.one_of(
        st.just([]),
        st.just("grpo_lightning.rewards.accuracy_reward"),
        st.integers(),
        st.lists(st.sampled_from(["no_dots", "no.such.module_path", 3]), min_size=1, max_size=2),
    ),
    "rewards.weights": st.one_of(
        st.lists(floats(), min_size=2, max_size=3),
        st.lists(NOT_FINITE, min_size=1, max_size=1),
        st.just(["1.0"]),
        st.just("1.0"),
    ),
    "evaluation.accuracy_func": st.one_of(
        st.integers(), st.just("not_a_path"), st.just("grpo_lightning.rewards.no_such_reward")
    ),
    "sampling.group_size": integer(st.integers(max_value=1)),
    "sampling.max_new_tokens": integer(st.integers(max_value=0)),
    "sampling.min_new_tokens": integer(st.one_of(st.integers(max_value=-1), st.integers(min_value=257))),
    "sampling.temperature": number(floats(max_value=0)),
    "sampling.top_p": number(st.one_of(floats(max_value=0), floats(min_value=1, exclude_min=True))),
    "sampling.top_k": integer(st.integers(max_value=-1)),
    "sampling.mode": other_text("sample", "beam_search"),
    "kl.beta": number(floats(max_value=0, exclude_max=True)),
    "kl.estimator": other_text("k1", "k2", "k3"),
    "loss.clip_eps_low": number(st.one_of(floats(max_value=0, exclude_max=True), floats(min_value=1)), optional=True),
    "loss.clip_eps_high": number(floats(max_value=0, exclude_max=True), optional=True),  # null: the surrogate's own
    "loss.delta": number(floats(max_value=1.2), optional=True),
    "loss.clip_ratio_c": number(floats(max_value=1), optional=True),
    "rewards.scale": other_text("group", "batch", "none"),
    "advantage": other_text(*ADVANTAGES),
    "loss.surrogate": other_text(*SURROGATES),
    "aggregation": other_text(*AGGREGATIONS),
    "loss.off_policy_mask_threshold": number(floats(max_value=0, exclude_max=True), optional=True),
    "loss.entropy_coef": number(floats(max_value=0, exclude_max=True)),
    "rewards.aggregation": other_text("sum_then_normalize", "normalize_then_sum"),
    "loss.top_entropy_quantile": number(st.one_of(floats(max_value=0), floats(min_value=1, exclude_min=True))),
    "loss.mask_truncated_completions": NOT_A_BOOL,
    "kl.unbiased": NOT_A_BOOL,
    "kl.placement": other_text("loss", "reward"),
    "sampling.correction": other_text(*CORRECTIONS),
    "sampling.correction_cap": number(floats(max_value=1, exclude_max=True)),
    "sampling.correction_lower": number(st.one_of(floats(max_value=0, exclude_max=True), floats(min_value=1, exclude_min=True)), optional=True),
    "sampling.correction_upper": number(floats(max_value=1, exclude_max=True), optional=True),
    "sampling.correction_kl_threshold": number(floats(max_value=0), optional=True),
    "sampling.correction_second_moment": number(floats(max_value=0), optional=True),
    "sampling.old_logprobs": other_text("recompute", "bypass", "loglinear"),
    "optim.ppo_epochs": integer(st.integers(max_value=0)),
    "optim.minibatch_size": integer(st.integers(max_value=0), optional=True),
    "optim.micro_batch_size": integer(st.integers(max_value=0)),
    "optim.learning_rate": number(floats(max_value=0)),
    "optim.weight_decay": number(floats(max_value=0, exclude_max=True)),
    "optim.warmup_steps": integer(st.integers(max_value=-1)),
    "optim.max_grad_norm": number(floats(max_value=0), optional=True),
    "evaluation.temperature": number(floats(max_value=0, exclude_max=True)),
    "evaluation.max_new_tokens": integer(st.integers(max_value=0), optional=True),
    "evaluation.samples": integer(st.integers(max_value=0)),
    "policy.use_chat_template": NOT_A_BOOL,
    "engine": st.one_of(
        st.just({"bogus": 1}),
        st.builds(dict, rollout=other_text("auto", "static", "hf")),
        st.builds(dict, compile=st.sampled_from(["yes", 1, 0.5])),
        st.integers(),
    ),
}
#: Invalid values of the variants' own arguments.
INVALID_OF_VARIANT = {
    variants.PPO: {
        "gamma": number(st.one_of(floats(max_value=0, exclude_max=True), floats(min_value=1, exclude_min=True))),
        "lam": number(st.one_of(floats(max_value=0, exclude_max=True), floats(min_value=1, exclude_min=True))),
        "value_learning_rate": number(floats(max_value=0)),
        "value_clip": number(floats(max_value=0), optional=True),
        "value_max_grad_norm": st.one_of(NOT_FINITE, NOT_A_NUMBER),
        "whiten_advantages": NOT_A_BOOL,
    },
    variants.DAPO: {
        "max_gen_batches": integer(st.integers(max_value=0)),
        "on_exhausted": other_text("error", "partial"),
        "overlong_buffer": integer(st.one_of(st.integers(max_value=-1), st.integers(min_value=257)), optional=True),
        "overlong_penalty": st.one_of(NOT_FINITE, NOT_A_NUMBER),
        "dynamic_sampling": NOT_A_BOOL,
    },
    variants.SAPO: {"tau_pos": number(floats(max_value=0)), "tau_neg": number(floats(max_value=0))},
    variants.KLCov: {
        "kl_cov_ratio": number(st.one_of(floats(max_value=0), floats(min_value=1, exclude_min=True))),
        "kl_coef": number(floats(max_value=0, exclude_max=True)),
    },
    variants.ClipCov: {"clip_cov_ratio": number(st.one_of(floats(max_value=0), floats(min_value=1, exclude_min=True)))},
    variants.OnlineDPOGRPO: {
        "dpo_weight": number(floats(max_value=0, exclude_max=True)),
        "dpo_beta": number(floats(max_value=0)),
    },
    variants.ProcessGRPO: {"step_delimiter": st.one_of(st.just(""), st.integers())},
}


def refusal(cls: type, **options) -> str:
    """The message of the :class:`ConfigError` that building ``cls`` with ``options`` (dotted names:
    ``loss.delta``) raises; any other exception fails the test."""
    with pytest.raises(ConfigError) as raised:
        cls(MISSING_MODEL, **grouped(options))
    return str(raised.value)


@PROPERTY
@given(st.sampled_from(sorted(INVALID)).flatmap(lambda field: st.tuples(st.just(field), INVALID[field])))
def test_an_invalid_setting_is_a_config_error_naming_it(case):
    field, value = case
    assert field in refusal(GroupPolicyOptimization, **{field: value})


@PROPERTY
@given(st.sampled_from(VARIANTS), st.sampled_from(sorted(INVALID)).flatmap(lambda f: st.tuples(st.just(f), INVALID[f])))
def test_every_variant_refuses_the_invalid_settings_of_the_base(variant, case):
    field, value = case
    assert field in refusal(variant, **{field: value})


def arguments_annotated(cls: type, kind: type) -> list[str]:
    """The options of ``cls`` (its arguments and its groups' fields, dotted) whose annotation accepts ``kind``."""
    found = [name for name, (accepted, _) in annotated_arguments(cls).items() if kind in accepted]
    if issubclass(cls, GroupPolicyOptimization):
        found += [f"{group}.{name}" for group, options in GROUPS.items()
                  for name, (accepted, _) in annotated_arguments(options).items() if kind in accepted]  # fmt: skip
    return sorted(found)


def accepted_of(name: str) -> tuple:
    group, _, field = name.partition(".")
    return (
        annotated_arguments(GROUPS[group])[field][0] if field else annotated_arguments(GroupPolicyOptimization)[name][0]
    )


@pytest.mark.parametrize("variant", [GroupPolicyOptimization, *VARIANTS], ids=lambda cls: cls.__name__)
def test_an_integer_past_int64_is_a_config_error_naming_the_field(variant):
    """Every integer setting, of the base and of each variant: 99999999999999999999 got as far as
    generation before (a traceback from inside torch)."""
    for name in arguments_annotated(variant, int):
        for value in (99999999999999999999, -(2**63) - 1, 10**5000):
            message = refusal(variant, **{name: value})
            assert message.startswith(f"{name}: ") and "too large; an integer must fit in 64 bits" in message


def test_an_integer_past_a_floats_range_is_a_config_error_naming_the_field():
    for name in arguments_annotated(GroupPolicyOptimization, float):
        if int not in accepted_of(name):
            assert refusal(GroupPolicyOptimization, **{name: 10**400}).startswith(f"{name}: an integer of about 401")


@PROPERTY
@given(
    st.sampled_from(sorted(INVALID_OF_VARIANT, key=lambda cls: cls.__name__)).flatmap(
        lambda cls: st.sampled_from(sorted(INVALID_OF_VARIANT[cls])).flatmap(
            lambda field: st.tuples(st.just(cls), st.just(field), INVALID_OF_VARIANT[cls][field])
        )
    )
)
def test_an_invalid_setting_of_a_variant_is_a_config_error_naming_it(case):
    variant, field, value = case
    assert field in refusal(variant, **{field: value})


@PROPERTY
@given(micro=st.integers(1, 16), factor=st.integers(1, 4), extra=st.integers(1, 8))
def test_micro_batches_must_tile_each_minibatch(micro, factor, extra):
    message = refusal(GroupPolicyOptimization, **{"optim.micro_batch_size": micro * factor + extra,
                                                  "optim.minibatch_size": micro * factor})  # fmt: skip
    assert "micro_batch_size" in message and "minibatch_size" in message


@PROPERTY
@given(samples=st.integers(2, 64))
def test_several_validation_samples_need_sampling(samples):
    message = refusal(GroupPolicyOptimization, **{"evaluation.samples": samples, "evaluation.temperature": 0.0})
    assert "evaluation.samples" in message and "evaluation.temperature" in message


@PROPERTY
@given(high=floats(min_value=0, max_value=10), delta=floats(min_value=0, max_value=11))
def test_delta_must_exceed_the_upper_clip(high, delta):
    if delta > 1 + high:
        GroupPolicyOptimization(MISSING_MODEL, loss={"clip_eps_high": high, "delta": delta})
    else:
        assert "loss.delta" in refusal(GroupPolicyOptimization, **{"loss.clip_eps_high": high, "loss.delta": delta})


@st.composite
def valid_settings(draw) -> dict:
    """A valid combination of the settings every variant accepts."""
    max_new_tokens = draw(st.integers(1, 1024))
    micro = draw(st.integers(1, 16))
    samples = draw(st.integers(1, 8))
    return {
        "sampling.group_size": draw(st.integers(2, 64)),
        "sampling.max_new_tokens": max_new_tokens,
        "sampling.min_new_tokens": draw(st.integers(0, max_new_tokens)),
        "sampling.temperature": draw(floats(min_value=1e-3, max_value=10)),
        "sampling.top_p": draw(floats(min_value=1e-3, max_value=1)),
        "sampling.top_k": draw(st.integers(0, 100)),
        "loss.clip_eps_high": draw(floats(min_value=0, max_value=10)),
        "optim.ppo_epochs": draw(st.integers(1, 4)),
        "optim.micro_batch_size": micro,
        "optim.minibatch_size": draw(st.none() | st.integers(1, 8).map(lambda k: k * micro)),
        "optim.learning_rate": draw(floats(min_value=1e-8, max_value=1)),
        "optim.weight_decay": draw(floats(min_value=0, max_value=1)),
        "optim.warmup_steps": draw(st.integers(0, 1000)),
        "optim.max_grad_norm": draw(st.none() | floats(min_value=1e-3, max_value=100)),
        "evaluation.samples": samples,
        "evaluation.temperature": draw(floats(min_value=0.1 if samples > 1 else 0, max_value=2)),
        "evaluation.max_new_tokens": draw(st.none() | st.integers(1, 1024)),
        "sampling.seed": draw(st.none() | st.integers(-(2**31), 2**31)),
        "engine": draw(st.builds(dict, rollout=st.sampled_from(["auto", "static"]))),
    }


@PROPERTY
@given(st.sampled_from(VARIANTS), valid_settings())
def test_valid_settings_build_every_variant_without_loading_a_model(variant, arguments):
    arguments = {name: value for name, value in arguments.items() if name not in variant.inapplicable_options}
    module = variant(MISSING_MODEL, **grouped(arguments))
    assert module.policy is None and module.ref_model is None and module.tokenizer is None
    assert module.settings.group_size == arguments["sampling.group_size"]


def test_a_local_model_path_that_does_not_exist_is_refused_when_built():
    with pytest.raises(ConfigError, match="model: no such directory 'no/such/model'"):
        GroupPolicyOptimization("no/such/model")


# --- the CLI ------------------------------------------------------------------------------------

BASE_ARGS = [
    "--config", "trainer/cpu", "--config", "data/arithmetic", "--config", "variant/grpo", "--config", "model/tiny",
    "--trainer.logger", "false",
]  # fmt: skip

#: Invalid values of options as typed on the command line; each error must name the option.
INVALID_OPTIONS = {
    "sampling.group_size": st.one_of(st.integers(max_value=1).map(str), st.sampled_from(["abc", "2.5", "nan"])),
    "sampling.max_new_tokens": st.one_of(st.integers(max_value=0).map(str), st.just("x")),
    "sampling.temperature": st.one_of(floats(max_value=0).map(str), st.sampled_from(["nan", "inf", "hot"])),
    "sampling.top_p": st.one_of(floats(min_value=1, exclude_min=True).map(str), st.sampled_from(["0", "-inf", "nan"])),
    "optim.learning_rate": st.one_of(floats(max_value=0).map(str), st.sampled_from(["nan", "inf", "fast"])),
    "kl.beta": st.sampled_from(["-0.1", "nan", "inf"]),
    "kl.estimator": st.sampled_from(["k4", "K3", ""]),
    "rewards.scale": st.sampled_from(["std", "Group"]),
    "loss.delta": st.sampled_from(["1.0", "nan", "x"]),
    "optim.minibatch_size": st.sampled_from(["0", "3", "100"]),  # the tiny config's micro_batch_size is 128
    "evaluation.samples": st.sampled_from(["0", "4"]),  # 4 with the config's greedy val_temperature
    "evaluation.max_new_tokens": st.sampled_from(["0", "-1", "x"]),
    "policy.gradient_checkpointing": st.sampled_from(["maybe", "2"]),
    "engine.rollout": st.sampled_from(["fast", "HF"]),
    "rewards.weights": st.sampled_from(["[nan]", "[1.0, 2.0]", "[x]"]),
}


def cli_error(*args: str) -> str:
    """The one ``error:`` line the CLI prints for ``args`` (exit status 2, no traceback)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        with pytest.raises(SystemExit) as exited:
            main(["fit", *BASE_ARGS, *args], report_errors=True)
    assert exited.value.code == 2, stderr.getvalue()[-2000:]
    assert "Traceback" not in stderr.getvalue()
    lines = [line for line in stderr.getvalue().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr.getvalue()[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def empty_model_dir(tmp_path_factory) -> str:
    """A directory that holds no model: loading it fails at once, so an invalid option that got
    past the checks would fail the test quickly instead of training."""
    return str(tmp_path_factory.mktemp("no_model"))


@CLI_PROPERTY
@given(st.sampled_from(sorted(INVALID_OPTIONS)).flatmap(lambda o: st.tuples(st.just(o), INVALID_OPTIONS[o])))
def test_an_invalid_option_is_one_error_line_naming_it(empty_model_dir, case):
    option, value = case
    line = cli_error("--model.model", empty_model_dir, f"--model.{option}", value)
    assert option.rpartition(".")[2] in line, line


@pytest.mark.parametrize("option", ["--model.sampling.group_size", "--model.sampling.max_new_tokens", "--data.batch_size"])
def test_a_huge_integer_option_is_one_error_line_naming_it(empty_model_dir, option):
    line = cli_error("--model.model", empty_model_dir, option, "99999999999999999999")
    assert f"{option.rpartition('.')[2]}: 99999999999999999999 is too large" in line, line


@settings(CLI_PROPERTY, max_examples=6)
@given(st.sampled_from(["digits", "num_train", "batch_size", "val_batch_size"]), st.sampled_from(["0", "-2", "x"]))
def test_an_invalid_data_option_is_one_error_line_naming_it(empty_model_dir, option, value):
    assert option in cli_error("--model.model", empty_model_dir, f"--data.{option}", value)


@settings(CLI_PROPERTY, max_examples=5)
@given(
    group_size=st.integers(2, 16),
    temperature=floats(min_value=0.05, max_value=2),
    learning_rate=floats(min_value=1e-7, max_value=1e-2),
    long_prompts=st.sampled_from(["error", "truncate", "skip"]),
)
def test_valid_options_build_the_module_without_loading_a_model(group_size, temperature, learning_rate, long_prompts):
    args = [*BASE_ARGS, "--model.model", MISSING_MODEL, "--model.sampling.group_size", str(group_size),
            "--model.sampling.temperature", repr(temperature), "--model.optim.learning_rate", repr(learning_rate),
            "--data.long_prompts", long_prompts]  # fmt: skip
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        cli = GRPOLightningCLI(args=args, run=False)
    assert cli.model.policy is None and cli.model.settings.group_size == group_size
    assert cli.datamodule.long_prompts == long_prompts


def test_minibatches_that_do_not_tile_the_rollout_fail_before_any_model_is_loaded(tmp_path):
    module = variants.GRPO(
        MISSING_MODEL, sampling={"group_size": 2}, optim={"minibatch_size": 4, "micro_batch_size": 4}
    )
    data = ArithmeticDataModule(num_train=8, num_val=0, val_split=None, batch_size=3)  # 3 x 2 = 6 completions
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    with pytest.raises(ConfigError, match=r"minibatch_size \(4\) must divide the rollout size .* = 3 x 2 = 6"):
        trainer.fit(module, data)
    assert module.policy is None and module.tokenizer is None
