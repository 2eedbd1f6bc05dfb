"""The module's settings as typed groups (``--model.sampling.group_size``, ``--model.loss.clip_eps_high``).

Each group is a frozen dataclass that checks itself when it is made: a wrong type or value is a
:class:`~grpo_lightning.errors.ConfigError` naming the field (``loss.delta``) and the fix. A variant
sets its defaults as its groups' defaults (DAPO: ``loss=LossOptions(clip_eps_high=0.28)``); a dict
(a checkpoint's hyperparameters, a partial group in Python) overrides the fields it names of the
variant's group (:meth:`OptionGroup.of`). Checks that need two groups, or the variant, are the
module's (:mod:`grpo_lightning.training.settings`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from grpo_lightning.algorithms import functional
from grpo_lightning.algorithms import SURROGATES
from grpo_lightning.runtime.argument_types import check_argument_types
from grpo_lightning.errors import ConfigError, require
from grpo_lightning.runtime.dtypes import DTYPES
from grpo_lightning.rewards import RewardExecution, resolve_reward_function
from grpo_lightning.rewards.scoring import check_rewards, resolve_function
from grpo_lightning.rollout.types import ROLLOUT_MODES
from grpo_lightning.algorithms.rollout_correction import CAP, OLD_LOGPROBS, Correction

#: Values of ``rewards.aggregation``: the weighted sum as it is, or of per-group normalised scores (GDPO).
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


@dataclass(frozen=True)
class OptionGroup:
    """What every group shares: building from a dict, the type check, plain values. A dataclass
    itself, so that the CLI shows each group as its fields (no ``class_path``)."""

    #: The constructor argument of ``GroupPolicyOptimization`` that takes the group.
    group: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_argument_types(type(self), {f.name: getattr(self, f.name) for f in fields(self)},
                             field=f"{self.group}.", cli=f"--model.{self.group}.")  # fmt: skip
        self.check()

    def check(self) -> None:
        """Raise :class:`ConfigError` for a value that cannot run (the types are checked already)."""

    @classmethod
    def of(cls, value: Any, preset: Any = None) -> Any:
        """``value`` itself, or ``preset`` (default: the class's defaults) with the fields a dict
        names (the CLI's, a checkpoint's hyperparameters); an unknown field is a :class:`ConfigError`."""
        preset = cls() if preset is None else cls.of(preset)
        if value is None:
            return preset
        if isinstance(value, Mapping):
            names = [f.name for f in fields(cls)]
            unknown = sorted(set(value) - set(names))
            if unknown:
                raise ConfigError(f"{cls.group}: no option {unknown[0]!r}; give {', '.join(names)}.")
            return dataclasses.replace(preset, **value)
        if not isinstance(value, cls):
            raise ConfigError(f"{cls.group}: give {cls.__name__} or a dict of its fields, got {value!r}.")
        return value

    def state(self) -> dict[str, Any]:
        """Plain values, for the hyperparameters (``hparams.yaml``, checkpoints, loggers)."""
        return asdict(self)


@dataclass(frozen=True)
class PolicyOptions(OptionGroup):
    """How the policy is loaded and prompted (``--model.policy.*``)."""

    group: ClassVar[str] = "policy"

    tokenizer: str | None = None
    """Hub id or directory of the tokenizer; ``None``: the model's own."""
    dtype: str = "auto"
    """Weights dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"``."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    attn_implementation: str | None = None
    """Passed to ``from_pretrained`` (e.g. ``"sdpa"``, ``"flash_attention_2"``)."""
    disable_dropout: bool = True
    """Zero every dropout of the policy, so that the log-probs of the update are those of the
    distribution the rollout sampled from."""
    peft_config: Any = None
    """A ``peft.LoraConfig`` (or a dict of its fields): train LoRA adapters only; the reference
    model is the policy with them disabled (:mod:`grpo_lightning.models.lora`)."""
    use_chat_template: bool = True
    """Wrap plain-text prompts in the tokenizer's chat template when it has one."""

    def check(self) -> None:
        require(
            self.tokenizer != "", "policy.tokenizer: give a hub id or a local directory, or null for the model's own."
        )
        require(self.dtype == "auto" or self.dtype in DTYPES,
                f"policy.dtype: {self.dtype!r} is not one of 'auto', {', '.join(map(repr, DTYPES))}.")  # fmt: skip

    def state(self) -> dict[str, Any]:
        from grpo_lightning.models.lora import adapter_settings  # peft is an extra: imported where adapters are asked for

        return {
            **{f.name: getattr(self, f.name) for f in fields(self)},
            "peft_config": adapter_settings(self.peft_config),
        }


@dataclass(frozen=True)
class SamplingOptions(OptionGroup):
    """How training rollouts are sampled (``--model.sampling.*``)."""

    group: ClassVar[str] = "sampling"

    group_size: int = 8
    """Completions sampled per prompt, ``G``."""
    max_new_tokens: int = 256
    """Completion length limit, ``L``."""
    min_new_tokens: int = 0
    """EOS is not sampled before this many tokens (benchmarks use ``L``)."""
    temperature: float = 1.0
    """Sampling temperature (> 0); the log-probs of the update are taken at it too."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens holding this much probability; 1: off."""
    top_k: int = 0
    """``0`` disables it."""
    mode: str = "sample"
    """``"sample"``, or ``"beam_search"``: each group is the ``G`` best beams, not samples."""
    dtype: str | None = None
    """Dtype of the weights rollouts sample from, e.g. ``"bfloat16"`` for fp32 weights trained
    under bf16 autocast: a copy in that dtype, refreshed after every optimizer step. ``None``: the
    policy's own weights (no copy); under FSDP, a replica in the strategy's compute dtype."""
    seed: int | None = None
    """Keyed sampling (:func:`grpo_lightning.rollout.generation.sampling_keys`): the same prompts sample the
    same completions whatever the batch composition, micro-batching or number of devices. Needs the
    static engine. ``None``: the global generator."""
    correction: str | None = None
    """Importance weights or masks for the rollout engine's log-probs against the training pass's
    (:mod:`grpo_lightning.algorithms.rollout_correction`: ``token_truncate``, ``icepop``, ``m2po``, ...); ``None``: off."""
    correction_cap: float = CAP
    """The cap of ``token_*`` and ``sequence_*`` corrections' ratios (>= 1)."""
    correction_lower: float | None = None
    """The lowest ratio ``icepop`` (token) and ``geo_rs`` (geometric mean) keep; ``None``: 0.5, 0.999."""
    correction_upper: float | None = None
    """The highest ratio ``icepop`` and ``geo_rs`` keep; ``None``: 5.0, 1.001."""
    correction_kl_threshold: float | None = None
    """``kpop``'s bound ``phi`` on the binary KL of a token's two probabilities; ``None``: 0.05."""
    correction_second_moment: float | None = None
    """``m2po``'s bound ``tau`` on the kept tokens' mean ``(log ratio)^2``; ``None``: 0.04."""
    old_logprobs: str = "recompute"
    """The update's old (proximal) log-probs: ``"recompute"`` (a forward pass where the update takes
    several steps), ``"bypass"`` (the sampler's: ``pi_old = pi_rollout``), ``"loglinear"`` (AReaL's
    interpolation by policy version); the last two skip that pass (:mod:`~grpo_lightning.algorithms.rollout_correction`)."""

    def check(self) -> None:
        require(self.group_size >= 2, f"sampling.group_size: must be at least 2 (got {self.group_size}); "
                "group-relative advantages compare completions of one prompt.")  # fmt: skip
        require(self.max_new_tokens >= 1, f"sampling.max_new_tokens: must be at least 1 (got {self.max_new_tokens}).")
        require(0 <= self.min_new_tokens <= self.max_new_tokens,
                f"sampling.min_new_tokens: must be between 0 and max_new_tokens ({self.max_new_tokens}), "
                f"got {self.min_new_tokens}.")  # fmt: skip
        require(
            self.temperature > 0,
            f"sampling.temperature: rollouts must be sampled, so it must be > 0 (got {self.temperature}).",
        )
        require(0 < self.top_p <= 1, f"sampling.top_p: must be in (0, 1] (got {self.top_p}).")
        require(self.top_k >= 0, f"sampling.top_k: must be >= 0, 0 disables it (got {self.top_k}).")
        modes = ", ".join(map(repr, ROLLOUT_MODES))
        require(self.mode in ROLLOUT_MODES, f"sampling.mode: {self.mode!r} is not one of {modes}.")
        require(self.dtype is None or self.dtype in DTYPES,
                f"sampling.dtype: {self.dtype!r} is not one of {', '.join(map(repr, DTYPES))} or null.")  # fmt: skip
        self.rollout_correction().check()
        require(self.old_logprobs in OLD_LOGPROBS,
                f"sampling.old_logprobs: {self.old_logprobs!r} is not one of {', '.join(OLD_LOGPROBS)}.")  # fmt: skip
        require(self.old_logprobs == "recompute" or self.mode == "sample", f"sampling.old_logprobs: {self.old_logprobs} "
                "reads the sampler's log-probs, and beam search samples nothing; set it to recompute.")  # fmt: skip
        require(self.old_logprobs == "recompute" or not self.rollout_correction().over_rollout,
                f"sampling.correction: {self.correction} masks from old log-probs computed before the update, which "
                f"sampling.old_logprobs {self.old_logprobs} skips; set sampling.old_logprobs to recompute.")  # fmt: skip
        require(self.correction is None or self.mode == "sample",
                "sampling.correction: weighs tokens by the sampling engine's probabilities, and beam search samples "
                "nothing; set sampling.correction to null or sampling.mode to 'sample'.")  # fmt: skip

    @property
    def beam_search(self) -> bool:
        return self.mode == "beam_search"

    def rollout_correction(self) -> Correction:
        """The correction mode with its bounds."""
        return Correction(self.correction, *(getattr(self, f"correction_{name}") for name in
                                             ("cap", "lower", "upper", "kl_threshold", "second_moment")))  # fmt: skip


@dataclass(frozen=True)
class RewardOptions(OptionGroup):
    """The reward functions and how their scores become one reward (``--model.rewards.*``)."""

    group: ClassVar[str] = "rewards"

    funcs: Sequence[str | Callable] = ("grpo_lightning.rewards.accuracy_reward",)
    """Reward functions ``(prompts, completions, **columns) -> list[float]``, as callables or import
    paths (``"grpo_lightning.rewards.accuracy_reward"``)."""
    weights: Sequence[float] | None = None
    """One weight per reward function; ``None``: all 1."""
    execution: RewardExecution = field(default_factory=RewardExecution)
    """What a reward function that raises, returns NaN/inf or times out does, and where it runs
    (:class:`~grpo_lightning.rewards.RewardExecution`; ``--model.rewards.execution.on_error zero``)."""
    scale: str = "group"
    """Divisor of ``group_std``'s advantages: the group's std (``"group"``), the batch's
    (``"batch"``) or none (``"none"``)."""
    aggregation: str = "sum_then_normalize"
    """``"sum_then_normalize"``: the weighted sum of the reward functions; ``"normalize_then_sum"``:
    each normalised within its group first (GDPO)."""

    def __post_init__(self) -> None:
        if isinstance(self.execution, Mapping):  # from a dict: a checkpoint's or a config's
            object.__setattr__(self, "execution", RewardExecution.of(dict(self.execution)))
        if isinstance(self.funcs, list):  # hashable, like the default
            object.__setattr__(self, "funcs", tuple(self.funcs))
        if isinstance(self.weights, list):
            object.__setattr__(self, "weights", tuple(self.weights))
        super().__post_init__()

    def check(self) -> None:
        check_rewards(self.funcs, self.weights)
        RewardExecution.of(self.execution)
        require(
            self.scale in functional.REWARD_SCALES,
            f"rewards.scale: {self.scale!r} is not one of {', '.join(functional.REWARD_SCALES)}.",
        )
        require(
            self.aggregation in REWARD_AGGREGATIONS,
            f"rewards.aggregation: {self.aggregation!r} is not one of {', '.join(REWARD_AGGREGATIONS)}.",
        )

    def state(self) -> dict[str, Any]:
        def plain(spec: Any) -> Any:  # a callable by its import path where it has one
            return spec if isinstance(spec, str) else resolve_reward_function(spec, field="rewards.funcs")[0]

        weights = None if self.weights is None else [float(w) for w in self.weights]
        return {"funcs": [plain(spec) for spec in self.funcs], "weights": weights, "execution": asdict(self.execution),
                "scale": self.scale, "aggregation": self.aggregation}  # fmt: skip


@dataclass(frozen=True)
class LossOptions(OptionGroup):
    """The per-token policy loss: its surrogate, the ratio clip and what masks or adds to it
    (``--model.loss.*``)."""

    group: ClassVar[str] = "loss"

    surrogate: str | None = None
    """The registered per-token surrogate (:data:`grpo_lightning.algorithms.SURROGATES`, e.g.
    ``ppo_clip``, ``gspo``, ``cispo``); ``None``: the variant's own."""
    clip_eps_low: float | None = 0.2
    """Ratio clip range ``[1 - low, 1 + high]``; ``None``: the surrogate's own (CISPO's: no lower bound)."""
    clip_eps_high: float | None = 0.2
    """The upper end of that range (DAPO's clip-higher: 0.28); ``None``: the surrogate's own."""
    delta: float | None = None
    """Two-sided clipping: a negative-advantage token's ratio is also capped at ``delta``
    (``> 1 + clip_eps_high``); ``None``: off."""
    clip_ratio_c: float | None = None
    """Dual clip: a negative-advantage token's loss is at most ``-clip_ratio_c * A`` (verl: 3.0); ``None``: off."""
    off_policy_mask_threshold: float | None = None
    """OPSM: a negative-advantage completion whose mean ``log pi_old - log pi`` exceeds it carries
    no loss; ``None``: off."""
    entropy_coef: float = 0.0
    """An entropy bonus (estimated at the sampled token); 0: off. The value a fit starts from:
    ``AdaptiveEntropy`` steers the one in use, ``module.coefficients.entropy_coef``."""
    top_entropy_quantile: float = 1.0
    """Only the tokens whose entropy is in the top fraction ``q`` of the micro-batch's carry loss
    (arXiv 2506.01939); 1: all."""
    mask_truncated_completions: bool = False
    """Completions that hit ``max_new_tokens`` without EOS carry no loss."""

    def check(self) -> None:
        SURROGATES.resolve(self.surrogate)
        low, high = self.clip_eps_low, self.clip_eps_high
        require(low is None or 0 <= low < 1, f"loss.clip_eps_low: must be in [0, 1) or null (got {low}).")
        require(high is None or high >= 0, f"loss.clip_eps_high: must be >= 0 or null (got {high}).")
        require(self.delta is None or high is None or self.delta > 1 + high,
                f"loss.delta: must exceed 1 + clip_eps_high = {1 + (high or 0)} (got {self.delta}); "
                "e.g. --model.loss.delta 2.0, or null for off.")  # fmt: skip
        c, threshold = self.clip_ratio_c, self.off_policy_mask_threshold
        require(
            c is None or c > 1,
            f"loss.clip_ratio_c: the dual-clip bound must be > 1 (got {c}); e.g. 3.0, or null for off.",
        )
        require(threshold is None or threshold >= 0, f"loss.off_policy_mask_threshold: must be >= 0 (got {threshold}); "
                "e.g. 0.5, or null for off.")  # fmt: skip
        require(self.entropy_coef >= 0, f"loss.entropy_coef: must be a finite number >= 0 (got {self.entropy_coef}); "
                "e.g. 0.001, or 0 for off.")  # fmt: skip
        require(0 < self.top_entropy_quantile <= 1, f"loss.top_entropy_quantile: must be in (0, 1] "
                f"(got {self.top_entropy_quantile}); 0.2 trains on the 20% highest-entropy tokens.")  # fmt: skip

    def check_clip_pair(self) -> None:
        """Raise :class:`ConfigError` where ``delta`` and ``clip_ratio_c`` are both set (the module
        checks it once it knows both apply: a variant may preset one and have no place for the other)."""
        require(
            self.clip_ratio_c is None or self.delta is None,
            "loss.clip_ratio_c: bounds the same negative-advantage "
            "loss as loss.delta (for clip_ratio_c > 1 + clip_eps_high they are equal); set one of them.",
        )


@dataclass(frozen=True)
class KLOptions(OptionGroup):
    """The KL term against the frozen reference model (``--model.kl.*``)."""

    group: ClassVar[str] = "kl"

    beta: float = 0.04
    """KL coefficient; 0 loads no reference model. The value a fit starts from: a schedule steers the
    one in use, ``module.coefficients.beta``."""
    estimator: str | None = None
    """``"k1"``, ``"k2"`` or ``"k3"`` (Schulman 2020); ``None``: the papers' choice, k3 in the loss
    (DeepSeekMath), k1 in the reward (RLOO, REINFORCE++, PPO)."""
    unbiased: bool = False
    """The KL estimate weighted by ``pi / pi_old`` (DeepSeek-V3.2)."""
    placement: str | None = None
    """Where the KL goes (:mod:`grpo_lightning.algorithms.kl`): ``"loss"``, ``beta * kl_t`` added to
    each token's loss (k3 by default, DeepSeekMath); ``"reward"``, ``r_i - beta * sum_t kl_it`` before
    the advantages (k1 by default, RLOO, REINFORCE++; PPO's per token, ``r_t = -beta * kl_t``); or a
    user's registered placement, or its import path. ``None``: the variant's own (``default_kl_placement``)."""

    def check(self) -> None:
        require(self.beta >= 0, f"kl.beta: the KL coefficient must be >= 0 (got {self.beta}).")
        require(self.estimator is None or self.estimator in functional.KL_ESTIMATORS,
                f"kl.estimator: {self.estimator!r} is not one of {', '.join(functional.KL_ESTIMATORS)} or null.")  # fmt: skip
        require(not self.unbiased or self.beta > 0,
                "kl.unbiased: weights the KL term, which beta = 0 turns off; set --model.kl.beta > 0.")  # fmt: skip
        require(self.placement is None or self.beta > 0,
                f"kl.placement: puts the KL term somewhere, and beta = 0 turns it off; set --model.kl.beta > 0 "
                f"or drop kl.placement (got {self.placement!r}).")  # fmt: skip
        require(self.estimator is None or self.beta > 0,
                f"kl.estimator: picks the estimate of the KL term, which beta = 0 turns off; set --model.kl.beta > 0 "
                f"or drop kl.estimator (got {self.estimator!r}).")  # fmt: skip


@dataclass(frozen=True)
class OptimOptions(OptionGroup):
    """The update: passes, batch sizes, AdamW and its warm-up, clipping (``--model.optim.*``)."""

    group: ClassVar[str] = "optim"

    ppo_epochs: int = 1
    """Passes over each rollout (``mu`` in DeepSeekMath)."""
    minibatch_size: int | None = None
    """Completions per optimizer step; ``None``: the whole rollout (one step)."""
    micro_batch_size: int | None = 8
    """Completions per forward/backward pass (memory only); ``None`` with ``micro_batch_tokens``."""
    micro_batch_tokens: int | None = None
    """Instead of ``micro_batch_size``: tokens per pass (prompt and completion, padding left out), the
    rows packed longest first and balanced by ``sum L^2`` (:mod:`grpo_lightning.training.micro_batches`)."""
    learning_rate: float = 1e-6
    """AdamW's, after a linear warm-up of ``warmup_steps``, then constant."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay; 0: none."""
    warmup_steps: int = 0
    """Optimizer steps of the linear warm-up from 0 to ``learning_rate``."""
    max_grad_norm: float | None = 1.0
    """Gradient norm clipping; ``None`` disables it."""
    max_nonfinite_steps: int = 3
    """A step whose gradient is NaN or infinite changes no weight; after this many in a row the fit
    stops (:mod:`grpo_lightning.runtime.optimization.nonfinite`)."""

    def check(self) -> None:
        require(self.ppo_epochs >= 1, f"optim.ppo_epochs: must be at least 1 (got {self.ppo_epochs}).")
        micro, mini, tokens = self.micro_batch_size, self.minibatch_size, self.micro_batch_tokens
        if tokens is not None:
            require(tokens >= 1, f"optim.micro_batch_tokens: must be at least 1 or null (got {tokens}).")
            require(micro is None, f"optim.micro_batch_tokens: packs each pass to {tokens} tokens, and "
                    f"optim.micro_batch_size ({micro}) fixes its rows; give one: --model.optim.micro_batch_size null "
                    "for the token budget, or drop --model.optim.micro_batch_tokens.")  # fmt: skip
        require(micro is not None or tokens is not None, "optim.micro_batch_size: null needs "
                "optim.micro_batch_tokens, the token budget of each pass; give e.g. --model.optim.micro_batch_size 8 "
                "or --model.optim.micro_batch_tokens 4096.")  # fmt: skip
        require(micro is None or micro >= 1, f"optim.micro_batch_size: must be at least 1 (got {micro}).")
        if mini is not None:
            require(mini >= 1, f"optim.minibatch_size: must be at least 1 or null (got {mini}).")
        if mini is not None and micro is not None:
            require(
                micro <= mini,
                f"optim.micro_batch_size ({micro}) is larger than optim.minibatch_size ({mini}), "
                f"the completions of one optimizer step; set --model.optim.micro_batch_size to at most {mini}.",
            )
            require(mini % micro == 0, f"optim.minibatch_size ({mini}) must be a multiple of optim.micro_batch_size "
                    f"({micro}): change one of them so micro-batches tile each minibatch.")  # fmt: skip
        require(self.learning_rate > 0, f"optim.learning_rate: must be > 0 (got {self.learning_rate}); give e.g. "
                "--model.optim.learning_rate 1e-6 (1e-3 for the tiny quickstart model).")  # fmt: skip
        require(self.weight_decay >= 0, f"optim.weight_decay: must be >= 0 (got {self.weight_decay}); "
                "give 0 for none, e.g. --model.optim.weight_decay 0.0.")  # fmt: skip
        require(self.warmup_steps >= 0, f"optim.warmup_steps: must be >= 0 (got {self.warmup_steps}); "
                "give 0 for no warm-up, e.g. --model.optim.warmup_steps 0.")  # fmt: skip
        require(
            self.max_nonfinite_steps >= 1,
            f"optim.max_nonfinite_steps: must be a positive integer, got {self.max_nonfinite_steps!r}.",
        )
        require(self.max_grad_norm is None or self.max_grad_norm > 0,
                f"optim.max_grad_norm: must be > 0 or null (got {self.max_grad_norm}); give e.g. "
                "--model.optim.max_grad_norm 1.0, or null to turn clipping off.")  # fmt: skip


@dataclass(frozen=True)
class EvaluationOptions(OptionGroup):
    """Validation and test: their sampling and what ``val/accuracy`` measures (``--model.evaluation.*``)."""

    group: ClassVar[str] = "evaluation"

    temperature: float = 0.0
    """Sampling temperature of validation completions; 0 is greedy."""
    max_new_tokens: int | None = None
    """Completion limit in validation; ``None``: ``sampling.max_new_tokens``."""
    samples: int = 1
    """Completions per validation prompt, ``n``: ``pass@k`` and ``maj@n`` for ``n > 1``
    (:mod:`grpo_lightning.evaluation.validation`), which needs ``temperature > 0``."""
    accuracy_func: str | Callable = "grpo_lightning.rewards.accuracy_reward"
    """The function whose mean is ``val/accuracy``."""
    pass_at_k_samples: int = 0
    """``n > 1``: each validation also draws ``n`` completions per prompt at ``pass_at_k_temperature``
    for ``pass@k`` and ``maj@n``, while ``val/accuracy`` stays that of the validation's own (greedy)
    completions; 0: none."""
    pass_at_k_temperature: float = 1.0
    """Sampling temperature of the ``pass_at_k_samples`` completions."""

    def check(self) -> None:
        require(self.temperature >= 0, f"evaluation.temperature: must be >= 0, 0 is greedy (got {self.temperature}).")
        require(self.max_new_tokens is None or self.max_new_tokens >= 1,
                f"evaluation.max_new_tokens: must be at least 1, or null for sampling.max_new_tokens "
                f"(got {self.max_new_tokens}).")  # fmt: skip
        require(self.samples >= 1, f"evaluation.samples: must be at least 1 (got {self.samples}).")
        require(self.samples == 1 or self.temperature > 0,
                f"evaluation.samples: {self.samples} completions per prompt are all the same under greedy decoding; "
                "set --model.evaluation.temperature 1.0 (pass@k is defined for sampled completions) or "
                "--model.evaluation.samples 1.")  # fmt: skip
        require(self.pass_at_k_samples == 0 or (self.pass_at_k_samples > 1 and self.samples == 1),
                f"evaluation.pass_at_k_samples: {self.pass_at_k_samples} needs evaluation.samples 1 (pass@k then comes "
                "from evaluation.samples itself) and at least 2, or 0 for none.")  # fmt: skip
        require(self.pass_at_k_samples == 0 or self.pass_at_k_temperature > 0,
                f"evaluation.pass_at_k_temperature: must be > 0 for sampled completions (got {self.pass_at_k_temperature}).")
        resolve_function(self.accuracy_func, "evaluation.accuracy_func")

    def state(self) -> dict[str, Any]:
        values = asdict(self)
        if not isinstance(self.accuracy_func, str):
            values["accuracy_func"] = resolve_reward_function(self.accuracy_func, field="evaluation.accuracy_func")[0]
        return values


#: The groups by their constructor argument.
GROUPS: dict[str, type[OptionGroup]] = {
    cls.group: cls
    for cls in (PolicyOptions, SamplingOptions, RewardOptions, LossOptions, KLOptions, OptimOptions, EvaluationOptions)
}
