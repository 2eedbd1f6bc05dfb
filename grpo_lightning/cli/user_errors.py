"""Which errors of a run are the user's (a setting, a path, a reward function), and the one line that tells them the fix."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import re
import typing
from types import TracebackType

from grpo_lightning import variants
from grpo_lightning.agents.environment import EnvironmentFailureError
from grpo_lightning.cli.trl_names import trl_hint
from grpo_lightning.rewards.scoring import RewardFunctionError
from grpo_lightning.runtime.optimization.nonfinite import NonFiniteTrainingError
from grpo_lightning.training.options import GROUPS
from grpo_lightning.training.settings import field_names
from grpo_lightning.errors import ConfigError

#: Where each former flat argument of the constructor lives now (``--model.NAME`` -> ``--model.GROUP.FIELD``).
MOVED = {
    "tokenizer": "policy.tokenizer",
    "dtype": "policy.dtype",
    "gradient_checkpointing": "policy.gradient_checkpointing",
    "attn_implementation": "policy.attn_implementation",
    "disable_dropout": "policy.disable_dropout",
    "peft_config": "policy.peft_config",
    "use_chat_template": "policy.use_chat_template",
    "group_size": "sampling.group_size",
    "max_new_tokens": "sampling.max_new_tokens",
    "min_new_tokens": "sampling.min_new_tokens",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "top_k": "sampling.top_k",
    "rollout_mode": "sampling.mode",
    "rollout_dtype": "sampling.dtype",
    "rollout_seed": "sampling.seed",
    "rollout_correction": "sampling.correction",
    "rollout_correction_cap": "sampling.correction_cap",
    "reward_funcs": "rewards.funcs",
    "reward_weights": "rewards.weights",
    "reward_execution": "rewards.execution",
    "scale_rewards": "rewards.scale",
    "reward_aggregation": "rewards.aggregation",
    "surrogate": "loss.surrogate",
    "clip_eps_low": "loss.clip_eps_low",
    "clip_eps_high": "loss.clip_eps_high",
    "delta": "loss.delta",
    "clip_ratio_c": "loss.clip_ratio_c",
    "off_policy_mask_threshold": "loss.off_policy_mask_threshold",
    "entropy_coef": "loss.entropy_coef",
    "top_entropy_quantile": "loss.top_entropy_quantile",
    "mask_truncated_completions": "loss.mask_truncated_completions",
    "beta": "kl.beta",
    "kl_estimator": "kl.estimator",
    "unbiased_kl": "kl.unbiased",
    "kl_in_reward": "kl.placement",
    "ppo_epochs": "optim.ppo_epochs",
    "minibatch_size": "optim.minibatch_size",
    "micro_batch_size": "optim.micro_batch_size",
    "learning_rate": "optim.learning_rate",
    "weight_decay": "optim.weight_decay",
    "warmup_steps": "optim.warmup_steps",
    "max_grad_norm": "optim.max_grad_norm",
    "max_nonfinite_steps": "optim.max_nonfinite_steps",
    "val_temperature": "evaluation.temperature",
    "val_max_new_tokens": "evaluation.max_new_tokens",
    "val_samples": "evaluation.samples",
    "accuracy_func": "evaluation.accuracy_func",
}

#: Frames of the methods that read the user's settings, paths and data before any training: an
#: error raised under one of them is a problem of the configuration, reported in one line.
SETUP_FUNCTIONS = frozenset({"setup", "prepare_data", "load", "configure_model", "load_models", "on_fit_start"})

#: Always a user's error, wherever raised.
USER_ERRORS = (ConfigError, RewardFunctionError, NonFiniteTrainingError, EnvironmentFailureError)

#: Where moved modules went (``grpo_lightning.OLD`` -> ``grpo_lightning.NEW``): those of the flat package
#: when it was given folders, then those moved so that no wing imports one above it (the helpers every
#: wing uses into ``runtime``, the calculator's warm starts into ``quickstart``, a run's scalars into ``ablation``).
MOVED_MODULES = {
    "module": "training.module",
    "options": "training.options",
    "settings": "training.settings",
    "argument_types": "runtime.argument_types",
    "schedules": "training.schedules",
    "step_schedule": "training.step_schedule",
    "time_budget": "runtime.time_budget",
    "nonfinite": "runtime.optimization.nonfinite",
    "callbacks": "training.callbacks",
    "metrics": "runtime.metrics",
    "compute": "runtime.compute",
    "strategies": "runtime.strategies",
    "checkpoint_io": "runtime.checkpoint_io",
    "final_checkpoint": "checkpoints.final",
    "resume": "checkpoints.resume",
    "export": "checkpoints.export",
    "models": "models.policy",
    "model_sources": "models.sources",
    "lora": "models.lora",
    "value_model": "models.value",
    "logprobs": "models.logprobs",
    "rollout": "rollout.types",
    "stale_rollouts": "rollout.stale",
    "engine": "rollout.engine",
    "generation": "rollout.generation",
    "functional": "algorithms.functional",
    "gae": "algorithms.gae",
    "dpo": "algorithms.dpo",
    "rollout_correction": "algorithms.rollout_correction",
    "reward_calls": "rewards.calls",
    "process_supervision": "rewards.process_supervision",
    "evaluation": "evaluation.validation",
    "sample_metrics": "evaluation.sample_metrics",
    "completions": "evaluation.completions",
    "diagnostics": "evaluation.diagnostics",
    "loggers": "evaluation.loggers",
    "cli": "cli.app",
    "cli_generate": "cli.generate",
    "cli_variants": "cli.variants",
    "run_folders": "cli.run_folders",
    "resources": "cli.resources",
    "third_party_notices": "cli.notices",
    "training.argument_types": "runtime.argument_types",
    "training.time_budget": "runtime.time_budget",
    "training.optimization": "runtime.optimization",
    "training.metrics": "runtime.metrics",
    "training.compute": "runtime.compute",
    "training.strategies": "runtime.strategies",
    "checkpoints.io": "runtime.checkpoint_io",
    "agents.calculator_warmstart": "quickstart.calculator_warmstart",
    "agents.chat_warmstart": "quickstart.chat_warmstart",
    "report.runs": "ablation.runs",
}


def moved_class_path(path: str) -> str | None:
    """``path`` (``grpo_lightning.OLD.Name``, ``OLD`` a key of :data:`MOVED_MODULES`, the longest that
    matches, or a preset's former ``variants.Name``) with its module where it lives now, or ``None`` if it
    did not move or ``Name`` is not there either (a misspelt name gets no suggestion that fails too)."""
    if preset := variants.moved_class_path(path):
        return preset
    package, _, rest = path.partition(".")
    if package != "grpo_lightning":
        return None
    module = max((old for old in MOVED_MODULES if rest == old or rest.startswith(f"{old}.")), key=len, default=None)
    if module is None:
        return None
    name = rest[len(module) + 1 :]
    first = name.split(".")[0]
    if name and _is_module(f"grpo_lightning.{module}") and _is_module(f"grpo_lightning.{module}.{first}"):
        return None  # a path into the package of that name now (grpo_lightning.models.lora...), not an old one
    new_module = f"grpo_lightning.{MOVED_MODULES[module]}"
    if name and not (_is_module(f"{new_module}.{first}") or hasattr(importlib.import_module(new_module), first)):
        return None
    return ".".join([new_module, *([name] if name else [])])


def moved_class_path_message(path: str) -> str | None:
    """The line for a class path whose module has moved (:func:`moved_class_path`), else ``None``."""
    moved = moved_class_path(path)
    return None if moved is None else f"{path!r}: its module has moved; write {moved!r}."


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def variant_names() -> list[str]:
    """Class paths of the presets (``grpo_lightning.variants.GRPO``, ...), in the registry's order."""
    return [variants.class_path(name) for name in variants.PRESETS]


def init_parameters(class_path: str) -> list[str]:
    """Names of the ``__init__`` arguments of ``class_path`` and of its bases (``**kwargs`` forwarding)."""
    cls = _import(class_path)
    if cls is None:
        return []
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        for parameter in inspect.signature(klass.__init__).parameters.values():
            if parameter.name != "self" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                names.append(parameter.name)
    return list(dict.fromkeys(names))


def _unknown_option_message(texts: str, option_names: list[str]) -> str | None:
    """The one line for an option or YAML key that does not exist (``--model.sampling.group_sise``,
    ``--trainer.max_step``): the nearest real one, or what TRL's name of it is here."""
    key = re.search(r'Parser key "(\w+)"', texts)
    owner = re.search(r"Problem with given class_path '([\w.]+)'", texts)
    group = re.search(r"Group '([\w.]+)' does not accept option '(\w+)'", texts)
    nested = re.search(r"Problem with given class_path '[\w.]+':\s*unrecognized arguments: --([\w.]+)", texts)
    option = re.search(r"Option '([\w.]+)' is not accepted", texts)
    path = f"{group.group(1)}.{group.group(2)}" if group else next((m.group(1) for m in (nested, option) if m), None)
    if path is not None:
        return _unknown_class_option(key.group(1) if key else "", owner.group(1) if owner else "", path)
    unrecognized = re.search(r"unrecognized arguments: (?:\w+ )*?(--[\w.]+)", texts)
    if unrecognized is None:
        return None
    name = unrecognized.group(1).partition("=")[0]
    if hint := trl_hint(name.rpartition(".")[2].lstrip("-")):
        return f"{name}: no such option; {hint}."
    close = difflib.get_close_matches(name, option_names, n=1, cutoff=0.6)
    return f"{name}: no such option" + (f"; did you mean {close[0]}?" if close else "; see --help.")


def _unknown_class_option(key: str, owner: str, path: str) -> str:
    """The line for ``path`` (``sampling.group_sise``), unknown to the class ``owner`` that ``--<key>`` takes."""
    *groups, name = path.split(".")
    fields = nested_fields(owner, groups) if groups else None
    if fields is None:  # an argument of the class itself, or an unknown group: name its first part
        return _unknown_argument(key, owner, path)
    where = ".".join([key, *groups] if key else groups)
    if name not in fields and (hint := trl_hint(name)):
        return f"--{where}.{name}: no such option; {hint}."
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    hint = f'; did you mean "{close[0]}"?' if close else f"; its fields: {', '.join(fields)}."
    return f'{where}: no field "{name}"{hint}'


def _unknown_argument(key: str, owner: str, path: str) -> str:
    """An unknown argument of ``owner`` (``--model.group_sise``): a moved setting, a TRL name, or the
    nearest argument or group field (``--model.sampling.group_size``)."""
    name = path.split(".")[0]
    group = f"--{key}." if key else "--"
    choices = init_parameters(owner) if owner else []
    if group == "--model." and name in MOVED:  # a setting of a former release, now in a group
        return f"{group}{name} moved to {group}{MOVED[name]}; give --model.{MOVED[name]} (in YAML: {MOVED[name]} under init_args)."
    if hint := trl_hint(path.rpartition(".")[2]):
        return f"{group}{path}: no such option; {hint}."
    nested = {field: f"{option}.{field}" for option, cls in GROUPS.items() if option in choices for field in field_names(cls)}
    close = difflib.get_close_matches(name, [*choices, *nested], n=1, cutoff=0.6)
    close = [nested.get(close[0], close[0])] if close and close[0] not in choices else close
    hint = f"; did you mean {group}{close[0]}?" if close else f"; valid options: {', '.join(choices)}." if choices else "."
    where = f" of {owner}" if owner else ""
    return f"{group}{name}: no such option{where}{hint}"


def nested_fields(class_path: str, groups: list[str]) -> list[str] | None:
    """The fields of the option group ``groups`` (``["rewards", "execution"]``) of ``class_path``'s
    constructor, followed through the dataclasses its arguments are typed with; ``None`` where a
    name is not such a group."""
    current = _import(class_path) if class_path else None
    for name in groups:
        current = _dataclass_of(_argument_types(current).get(name)) if current is not None else None
    return [f.name for f in dataclasses.fields(current)] if current is not None else None


def _argument_types(cls: type) -> dict:
    """The type hints of a dataclass's fields, or of a class's constructor arguments (its bases' too)."""
    if dataclasses.is_dataclass(cls):
        return typing.get_type_hints(cls)
    hints: dict = {}
    for klass in reversed(cls.__mro__):
        if "__init__" in vars(klass):
            with contextlib.suppress(Exception):  # an annotation that does not resolve: not a group
                hints.update(typing.get_type_hints(klass.__init__))
    return hints


def _dataclass_of(hint) -> type | None:
    """The dataclass of ``hint`` (``SamplingOptions``, ``EnvironmentOptions | None``), else ``None``."""
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _import(class_path: str) -> type | None:
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and its causes, outermost first."""
    chain: list[BaseException] = []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _raised_in_setup(tb: TracebackType | None) -> bool:
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name in SETUP_FUNCTIONS and owner is not None:
            if any(c.__name__ in ("LightningModule", "LightningDataModule") for c in type(owner).__mro__):
                return True
        tb = tb.tb_next
    return False


def _raised_by_project(error: BaseException) -> bool:
    """Whether ``error`` was raised in this package's or the variants' code."""
    tb = error.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    filename = last.tb_frame.f_code.co_filename if last is not None else ""
    return any(part in filename for part in (f"{os.sep}grpo_lightning{os.sep}", f"{os.sep}variants{os.sep}"))


def _first_line_block(text: str, limit: int = 6) -> str:
    lines = [line.rstrip() for line in str(text).strip().splitlines() if line.strip()]
    return "\n".join(lines[:limit])


def user_error_message(error: BaseException, parsing: bool) -> str | None:
    """The message to show for ``error`` when it is the user's (a setting, a path, a reward
    function), else ``None`` (a bug: the traceback is shown). ``parsing``: raised while the
    configuration was parsed or instantiated, where every ``ValueError``/``TypeError`` is the user's."""
    chain = _chain(error)
    texts = "\n".join(str(e) for e in chain)
    # An unknown class path: list what --model (or --data) accepts.
    unknown = re.search(r"Problem with given class_path '([\w.]+)':\s*\n?\s*(?:module '[\w.]+' has no attribute|No module named)", texts)
    if unknown is None:
        unknown = re.search(r"(?:Expected a path but|--model\.help: Expected a dot import path string:) ([\w.]+)", texts)
    if unknown is not None and not any(isinstance(e, USER_ERRORS) for e in chain):
        path = unknown.group(1)
        if moved := moved_class_path_message(path):
            return moved
        presets = (f"{variants.FORMER_PACKAGE}.", f"{variants.__name__}.")
        if path.startswith(presets) or "Parser key \"model\"" in texts or "--model" in texts:
            choices = variant_names()
            names = {choice.rpartition(".")[2].lower(): choice for choice in choices}
            close = difflib.get_close_matches(path.rpartition(".")[2].lower(), list(names), n=1, cutoff=0.6)
            hint = f" Did you mean {names[close[0]]}?" if close else ""
            return f"--model: unknown variant {path!r}; give one of {', '.join(choices)} (or a subclass's import path).{hint}"
        return f"{path!r} is not an importable class path; check the spelling and that its package is installed."
    unknown_option = _unknown_option_message(texts, getattr(error, "option_names", []))
    if unknown_option is not None:
        return unknown_option
    # The innermost of the project's own errors (jsonargparse wraps what the constructors raise).
    for candidate in reversed(chain):
        if isinstance(candidate, USER_ERRORS):
            return _first_line_block(candidate)
    refused = _refused_type(chain) if parsing else None
    if refused is not None:
        return refused
    if parsing or _raised_in_setup(error.__traceback__):
        for candidate in reversed(chain):
            if isinstance(candidate, (ValueError, TypeError, FileNotFoundError)) and _raised_by_project(candidate):
                return _first_line_block(candidate)
    if parsing:  # a Trainer or callback argument Lightning refuses
        for candidate in reversed(chain):
            if type(candidate).__name__ == "MisconfigurationException":
                return _first_line_block(candidate)
    innermost = chain[-1]
    in_setup = _raised_in_setup(error.__traceback__)
    if isinstance(innermost, (ValueError, TypeError, FileNotFoundError)) and (parsing or in_setup):
        if type(innermost).__module__.startswith("jsonargparse") or type(innermost).__name__ == "ArgumentError":
            return _first_line_block(innermost, limit=3)
        return _first_line_block(innermost)
    if isinstance(innermost, OSError) and in_setup:
        return _first_line_block(innermost)
    if type(error).__name__ == "ArgumentError":  # any other parse error: jsonargparse's own message
        return _first_line_block(error, limit=3)
    return None


#: How :func:`_refused_type` names the types jsonargparse expects.
TYPE_WORDS = {
    "float": "a finite number", "int": "an integer", "bool": "true or false", "str": "a string", "NoneType": "null",
}  # fmt: skip


def _refused_type(chain: list[BaseException]) -> str | None:
    """jsonargparse's refusal of a value (``Expected a <class 'float'>. Got value: inf``, under
    ``Parser key`` errors) as ``--model.optim.learning_rate: must be a finite number (got 'inf').``"""
    got = re.fullmatch(r"Expected a (.+?)\. Got value: (.*)", str(chain[-1]), re.S)
    keys: list[str] = []
    for error in chain:
        key = re.match(r'Parser key "([\w.]+)":', str(error))
        if key and key.group(1) not in keys[-1:]:
            keys.append(key.group(1))
    if got is None or not keys:
        return None
    kinds = re.findall(r"<class '(\w+)'>|typing\.Literal\[(.*?)\]", got.group(1))
    words = [f"one of {literal}" if literal else TYPE_WORDS.get(name, f"a {name}") for name, literal in kinds]
    innermost = next(str(e) for e in reversed(chain) if str(e).startswith(f'Parser key "{keys[-1]}"'))
    if "<class 'NoneType'>" in innermost and "null" not in words:  # an Optional option
        words.append("null")
    return f"--{'.'.join(keys)}: must be {' or '.join(words) or got.group(1)} (got {got.group(2)!r})."
