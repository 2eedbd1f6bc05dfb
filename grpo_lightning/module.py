"""The shared LightningModule of the GRPO family: the step skeleton and the algorithm hooks.

One training step (manual optimization)::

    rollout      = generate(prompts)                  G completions per prompt
    rewards      = score(rollout)                     weighted reward functions       [P * G]
    rollout      = contain(rollout)                   reward_execution.on_error=skip_group: failed groups out
    rollout      = select(rollout)                    hook (DAPO: dynamic sampling); None = no update yet
    old/ref logp                                      only when needed
    rewards      = shape_rewards(rewards, rollout)    hook (DAPO: overlong; RLOO: KL in the reward)
    advantages   = advantages(rewards.view(P, G))     hook
    for epoch in range(ppo_epochs):
        for minibatch:                                one optimizer step each
            for micro-batch:                          memory only: the gradient does not depend on it
                loss = aggregate(token_loss(...) + beta * kl, mask)    hooks

Variants (``variants/``) name their advantage estimator, per-token surrogate and aggregation among the
registered parts (``default_advantage``, ``default_surrogate``, ``default_aggregation``:
:mod:`grpo_lightning.algorithms`), which a run may swap (``--model.advantage``, ``--model.surrogate``,
``--model.aggregation``); where their paper asks they override the hooks (``advantages``,
``token_loss``, ``select``, ``shape_rewards``); they may declare ``kl_in_loss``.
How rollouts are sampled is :mod:`grpo_lightning.generation`'s choice; step metrics are
:mod:`grpo_lightning.metrics`'; the state of an exact resume is :mod:`grpo_lightning.resume`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import lightning as L
import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_lightning import functional as F
from grpo_lightning import metrics, resume, step_schedule
from grpo_lightning.agents import EnvironmentOptions
from grpo_lightning.agents.multi_turn import multi_turn_engine, sample_episodes
from grpo_lightning.algorithms import check_loss_options, resolve_parts
from grpo_lightning.algorithms.entropy import entropy_bonus
from grpo_lightning.algorithms.hooks import AlgorithmHooks, inapplicable_with
from grpo_lightning.compute import ComputeMeter, policy_parameters
from grpo_lightning.engine.options import EngineOptions
from grpo_lightning.evaluation import Evaluation
from grpo_lightning.generation import EnginePlan, RolloutSampler, RolloutWeights, build_rollout
from grpo_lightning.generation import announce_prompt_format, check_engine_options, disable_dropout, format_prompt
from grpo_lightning.model_sources import load_tokenizer
from grpo_lightning.generation import announce_rollout_mode, save_policy
from grpo_lightning.generation.compile_payback import run_length
from grpo_lightning.lora import adapter_autocast, adapter_settings, reference_model
from grpo_lightning.models import load_models
from grpo_lightning.nonfinite import NonFiniteGuard
from grpo_lightning.logprobs import completion_logprobs
from grpo_lightning.metrics import EVERY_STEP_METRICS, StepMetrics
from grpo_lightning.rewards import RewardExecution, RewardScorer, RewardScores, resolve_reward_function, weighted_reward
from grpo_lightning.rollout import Rollout, SamplingParams
from grpo_lightning.rollout_correction import correct_policy_loss
from grpo_lightning.settings import CHECKED_SETTINGS, DTYPES, ConfigError, check_datasets, check_settings
from grpo_lightning.settings import check_before_loading, check_options_apply, resolve_rewards
from grpo_lightning.strategies import clip_policy_gradients, no_gradient_sync

# Re-exported: variants and user code import them from here.
__all__ = ["EVERY_STEP_METRICS", "ConfigError", "EngineOptions", "GroupPolicyOptimization", "StepMetrics", "disable_dropout"]


class GroupPolicyOptimization(AlgorithmHooks, resume.GroupPolicyState, Evaluation, L.LightningModule):
    """Base module of the GRPO family: rollout, rewards, reference model, clipped update, logging.

    Args:
        model: Hugging Face hub id or local directory of a causal LM (loaded in ``configure_model``).
        tokenizer: hub id or directory of the tokenizer; defaults to ``model``.
        dtype: weights dtype, ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"``.
        gradient_checkpointing: recompute activations in the backward pass to save memory.
        attn_implementation: passed to ``from_pretrained`` (e.g. ``"sdpa"``, ``"flash_attention_2"``).
        disable_dropout: zero every dropout of the policy, so that the log-probs of the update are
            those of the distribution the rollout sampled from.
        peft_config: a ``peft.LoraConfig`` (or a dict of its fields): train LoRA adapters only; the
            reference model is the policy with them disabled (:mod:`grpo_lightning.lora`).
        engine: how rollouts are sampled and log-prob passes run, chosen for the device by default
            (:class:`~grpo_lightning.engine.options.EngineOptions`; ``--model.engine.rollout static``).
            Speed only: the algorithm computes the same with any of them.
        rollout_dtype: dtype of the weights rollouts sample from, e.g. ``"bfloat16"`` for fp32
            weights trained under bf16 autocast: a copy in that dtype, refreshed after every
            optimizer step, decodes in bf16. ``None``: the policy's own weights (no copy); under
            FSDP, a replica in the strategy's compute dtype.
        rollout_seed: keyed sampling (:func:`grpo_lightning.generation.sampling_keys`): the same
            prompts sample the same completions whatever the batch composition, micro-batching or
            number of devices. Needs the static engine. ``None``: the global generator.
        reward_funcs: reward functions ``(prompts, completions, **columns) -> list[float]``, as
            callables or import paths (``"grpo_lightning.rewards.accuracy_reward"``).
        reward_weights: one weight per reward function (default: all 1).
        reward_execution: what a reward function that raises, returns NaN/inf or times out does, and
            where it runs (:class:`~grpo_lightning.rewards.RewardExecution`; ``--model.reward_execution.on_error zero``).
        group_size: completions sampled per prompt, ``G``.
        max_new_tokens: completion length limit, ``L``.
        min_new_tokens: EOS is not sampled before this many tokens (benchmarks use ``L``).
        temperature, top_p, top_k: rollout sampling (``top_k = 0`` disables it).
        rollout_mode: ``"sample"``, or ``"beam_search"``: each group is the ``G`` best beams, not samples.
        beta: KL coefficient; 0 loads no reference model.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (Schulman 2020; DeepSeekMath uses k3).
        clip_eps_low, clip_eps_high: ratio clip range ``[1 - low, 1 + high]``.
        delta: two-sided clipping: a negative-advantage token's ratio is also capped at ``delta``
            (``> 1 + clip_eps_high``); ``None``: off.
        clip_ratio_c: dual clip: a negative-advantage token's loss is at most ``-clip_ratio_c * A`` (verl: 3.0); ``None``: off.
        advantage, surrogate, aggregation: the registered parts (:mod:`grpo_lightning.algorithms`: ``ADVANTAGES``
            e.g. ``group_std``; ``SURROGATES`` e.g. ``ppo_clip``, ``gspo``; ``AGGREGATIONS`` e.g. ``token_mean``); ``None``: the variant's own.
        off_policy_mask_threshold: OPSM: a negative-advantage completion whose mean ``log pi_old - log pi``
            exceeds it carries no loss; ``None``: off. entropy_coef: an entropy bonus (estimated at the sampled token); 0: off.
        scale_rewards: divisor of ``group_std``'s advantages: the group's std (``"group"``), the
            batch's (``"batch"``) or none (``"none"``).
        reward_aggregation: ``"sum_then_normalize"``: the weighted sum of the reward functions;
            ``"normalize_then_sum"``: each normalised within its group first (GDPO).
        top_entropy_quantile: only the tokens whose entropy is in the top fraction ``q`` of the
            micro-batch's carry loss (arXiv 2506.01939); 1: all.
        mask_truncated_completions: completions that hit ``max_new_tokens`` without EOS carry no loss.
        unbiased_kl: the KL estimate weighted by ``pi / pi_old`` (DeepSeek-V3.2).
        rollout_correction, rollout_correction_cap: importance weights for the rollout engine's
            log-probs against the training pass's, and their cap (:mod:`grpo_lightning.rollout_correction`).
        ppo_epochs: passes over each rollout (``mu`` in DeepSeekMath).
        minibatch_size: completions per optimizer step; ``None`` = the whole rollout (one step).
        micro_batch_size: completions per forward/backward pass (memory only).
        learning_rate, weight_decay, warmup_steps, max_grad_norm: AdamW with linear warm-up,
            then constant; gradient norm clipping (``None`` disables it).
        max_nonfinite_steps: a step whose gradient is NaN or infinite changes no weight; after this
            many in a row the fit stops (:mod:`grpo_lightning.nonfinite`).
        val_temperature: sampling temperature of validation completions; 0 is greedy.
        val_samples: completions per validation prompt, ``n``: ``pass@k`` and ``maj@n`` for ``n > 1``
            (:mod:`grpo_lightning.evaluation`), which needs ``val_temperature > 0``.
        val_max_new_tokens: completion limit in validation (default ``max_new_tokens``).
        accuracy_func: the function whose mean is ``val/accuracy``.
        use_chat_template: wrap plain-text prompts in the tokenizer's chat template when it has one.
        environment: multi-turn rollouts: model turns and an environment's replies, with tools
            (:class:`~grpo_lightning.agents.EnvironmentOptions`; ``--model.environment.name``).
    """

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        dtype: str = "auto",
        gradient_checkpointing: bool = False,
        attn_implementation: str | None = None,
        disable_dropout: bool = True,
        peft_config: Any = None,
        engine: EngineOptions = EngineOptions(),
        rollout_dtype: str | None = None,
        rollout_seed: int | None = None,
        reward_funcs: Sequence[str | Callable] = ("grpo_lightning.rewards.accuracy_reward",),
        reward_weights: Sequence[float] | None = None,
        reward_execution: RewardExecution = RewardExecution(),
        group_size: int = 8,
        max_new_tokens: int = 256,
        min_new_tokens: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        rollout_mode: str = "sample",
        beta: float = 0.04,
        kl_estimator: str = "k3",
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        delta: float | None = None,
        clip_ratio_c: float | None = None,
        advantage: str | None = None,
        surrogate: str | None = None,
        aggregation: str | None = None,
        off_policy_mask_threshold: float | None = None,
        entropy_coef: float = 0.0,
        scale_rewards: str = "group",
        reward_aggregation: str = "sum_then_normalize",
        top_entropy_quantile: float = 1.0,
        mask_truncated_completions: bool = False,
        unbiased_kl: bool = False,
        rollout_correction: str | None = None,
        rollout_correction_cap: float = 2.0,
        ppo_epochs: int = 1,
        minibatch_size: int | None = None,
        micro_batch_size: int = 8,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_grad_norm: float | None = 1.0,
        max_nonfinite_steps: int = 3,
        val_temperature: float = 0.0,
        val_max_new_tokens: int | None = None,
        val_samples: int = 1,
        accuracy_func: str | Callable = "grpo_lightning.rewards.accuracy_reward",
        use_chat_template: bool = True,
        environment: EnvironmentOptions | None = None,
    ) -> None:
        super().__init__()
        options = EngineOptions.of(engine)
        engine = asdict(options)  # plain values in the hyperparameters (hparams.yaml, loggers)
        execution = RewardExecution.of(reward_execution)
        reward_execution = asdict(execution)
        peft_config = adapter_settings(peft_config)
        self.environment = None if environment is None else EnvironmentOptions.of(environment)
        environment = None if environment is None else self.environment.state()
        self.save_hyperparameters()
        self.hparams["peft_config"] = peft_config  # plain values, also where the CLI gave class_path/init_args
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints leave the frozen reference model out

        self.inapplicable_options = inapplicable_with(type(self), surrogate)  # with the surrogate of this run
        check_options_apply(type(self), self.inapplicable_options, self.kl_in_loss, self.hparams)
        check_loss_options(delta, clip_ratio_c, off_policy_mask_threshold, entropy_coef)
        check_settings(**{name: value for name, value in locals().items() if name in CHECKED_SETTINGS})
        self.advantage_name, self.aggregation_name, self.surrogate_name = resolve_parts(
            type(self), advantage, aggregation, scale_rewards, surrogate
        )
        beam_search = rollout_mode == "beam_search"
        check_engine_options(options, rollout_seed, beam_search)
        options = options if self.environment is None else multi_turn_engine(options, rollout_seed, beam_search)
        self.reward_functions, self.reward_weights = resolve_rewards(reward_funcs, reward_weights)
        self.reward_scorer = RewardScorer(execution, self.reward_functions)  # workers, warnings, NaN counts
        self.accuracy_function = resolve_reward_function(accuracy_func, field="accuracy_func")

        self.model_name = model
        self.tokenizer_name = tokenizer or model
        self.engine_options = options
        self.group_size = group_size
        self.beta = beta
        self.kl_estimator = kl_estimator
        self.clip_eps_low = clip_eps_low
        self.clip_eps_high = clip_eps_high
        self.entropy_coef = entropy_coef  # AdaptiveEntropy steers it during a fit
        self.ppo_epochs = ppo_epochs
        self.rollout_correction = rollout_correction
        self.minibatch_size = minibatch_size
        self.micro_batch_size = micro_batch_size
        self.sampling = SamplingParams(max_new_tokens, temperature, top_p, top_k, min_new_tokens, beam_search)
        self.val_sampling = SamplingParams(val_max_new_tokens or max_new_tokens, val_temperature, top_p, top_k)

        self.policy: PreTrainedModel | None = None
        self.ref_model: PreTrainedModel | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._samplers: dict[str, RolloutSampler] = {}  # by kind of device
        self.rollout_weights = RolloutWeights(DTYPES[rollout_dtype] if rollout_dtype else None)
        self.policy_version = 0  # optimizer steps taken: a rollout replica older than this is refreshed
        self.rollouts = 0  # generate() calls so far: part of the keys of keyed sampling
        self.step_metrics = StepMetrics()
        self.nonfinite = NonFiniteGuard(max_nonfinite_steps)
        self.generated_tokens = self.generation_batches = self.trained_rollouts = 0  # sampled; rollouts trained on
        self.compute = ComputeMeter()  # token passes of training: perf/flops
        self.last_step_metrics: dict[str, float] = {}  # every metric of the last training step
        self.last_rollout, self.last_advantages = None, None  # the last step's scored rollout, its advantages
        self.logged_steps = 0  # training steps logged: with an update, or counted by skip_update

    @property
    def max_new_tokens(self) -> int:
        """Completion length limit of the training rollouts, ``L``."""
        return self.sampling.max_new_tokens

    # ------------------------------------------------------------------ helpers for hooks

    def min_over_ranks(self, value: int) -> int:
        """The smallest ``value`` over all processes (every process must call it)."""
        return resume.min_over_ranks(value, self.device)

    @property
    def num_processes(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    def sum_over_ranks(self, value: Tensor) -> Tensor:
        """``value`` summed over all processes (every process must call it)."""
        return self.trainer.strategy.reduce(value, reduce_op="sum") if self.num_processes > 1 else value

    # ------------------------------------------------------------------ model

    def setup(self, stage: str) -> None:
        check_before_loading(self, stage)  # what settings and data say before configure_model loads the model

    def configure_model(self) -> None:
        """Load tokenizer, policy and, when the loss needs one, the frozen reference model
        (:func:`grpo_lightning.models.load_models`: FSDP sharding, LoRA adapters)."""
        if self.policy is not None:
            return
        self.tokenizer = load_tokenizer(self.tokenizer_name)
        strategy = self.trainer.strategy if self._trainer is not None else None
        self.policy, self.ref_model = load_models(self.model_name, self.hparams, self.needs_reference_model(), strategy)

    def save_pretrained(self, directory: str) -> None:
        """Write the policy and tokenizer as a plain Hugging Face directory (rank 0 writes).

        Under FSDP every process must call it: the shards are gathered first.
        """
        save_policy(self.policy, self.tokenizer, directory, write=self.global_rank == 0)

    @property
    def sampler(self) -> RolloutSampler:
        """What samples this device's rollouts, on the engine options resolved for the device, the
        model, the strategy and the run's length (:func:`grpo_lightning.generation.resolve_engine`):
        once per kind of device, announced then (Lightning moves the module to the CPU between stages)."""
        kind = self.device.type
        if kind not in self._samplers:
            strategy = self._trainer.strategy if self._trainer is not None else None
            run = run_length(self._trainer, self.sampling.max_new_tokens, self.val_sampling.max_new_tokens)
            options = (self.engine_options, self.hparams.rollout_seed, self.sampling.beam_search, run)
            self._samplers[kind] = RolloutSampler.announced(self.policy, strategy, kind, *options)
        return self._samplers[kind]

    @property
    def engine_plan(self) -> EnginePlan:
        """The engine options resolved for this device (see :attr:`sampler`)."""
        return self.sampler.plan

    # ------------------------------------------------------------------ optimizer

    def configure_callbacks(self) -> list[L.Callback]:
        """Validation and checkpoints at optimizer steps, in every Trainer, once (``validate`` after ``fit``)."""
        attached = {type(callback) for callback in self.trainer.callbacks} if self._trainer is not None else set()
        schedules = (step_schedule.ValidationSchedule, step_schedule.CheckpointSchedule)
        return [schedule() for schedule in schedules if schedule not in attached]

    def configure_optimizers(self):
        parameters = [p for p in self.policy.parameters() if p.requires_grad]
        fused = True if all(p.device.type in ("cuda", "cpu") for p in parameters) else None  # one kernel for all
        hparams = self.hparams
        optimizer = torch.optim.AdamW(parameters, lr=hparams.learning_rate, weight_decay=hparams.weight_decay, fused=fused)
        warmup = self.hparams.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ checks before work

    def on_fit_start(self) -> None:
        self.engine_plan  # resolved, and announced, before the first step
        announce_prompt_format(self.tokenizer, self.hparams.use_chat_template)
        announce_rollout_mode(self.hparams.rollout_mode)
        context = getattr(self.policy.config, "max_position_embeddings", None)
        longest = max(self.sampling.max_new_tokens, self.val_sampling.max_new_tokens)
        longest = longest if self.environment is None else self.environment.token_budget(longest)
        check_datasets(self.trainer.datamodule, self.tokenizer, self.format_prompt, context, longest, self.group_size,
                       self.minibatch_size)  # fmt: skip

    # ------------------------------------------------------------------ rollout

    def format_prompt(self, prompt: Any) -> str:
        """The prompt as text for the model (:func:`grpo_lightning.generation.format_prompt`)."""
        return format_prompt(self.tokenizer, prompt, self.hparams.use_chat_template)

    def rollout_model(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """The model rollouts sample from inside the ``with`` block
        (:class:`~grpo_lightning.generation.RolloutWeights`)."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        return self.rollout_weights.model(self.policy, self.policy_version, strategy)

    def generate(self, batch: dict[str, list], group_size: int, sampling: SamplingParams, with_logprobs=False) -> Rollout:
        """Sample ``group_size`` completions for each prompt of ``batch`` (``with_logprobs``: and
        keep the engine's log-probs of the sampled tokens, ``rollout.sampling_logp``)."""
        if self.environment is not None:
            with self.rollout_model() as model:
                rollout = sample_episodes(model, self.tokenizer, batch, group_size, sampling, self.environment,
                                          self.hparams.use_chat_template, with_logprobs, self.sampler)  # fmt: skip
            self.rollouts += 1
            return rollout
        texts = [self.format_prompt(p) for p in batch["prompt"]]
        with self.rollout_model() as model:
            sampled = self.sampler.sample(model, self.tokenizer, texts, group_size, sampling, self.rollouts,
                                          with_logprobs)  # fmt: skip
        self.rollouts += 1
        return build_rollout(self.tokenizer, batch, group_size, *sampled)

    def score(self, rollout: Rollout) -> RewardScores:
        """Fill ``rollout.reward_per_function`` ``[N, F]`` and the weighted ``rollout.rewards`` ``[N]``;
        return the scores with the samples each function failed on (``reward_execution``)."""
        columns, groups = rollout.columns, [row // rollout.group_size for row in range(len(rollout))]  # group_index
        scores = self.reward_scorer.score(self.reward_functions, rollout.prompts, rollout.completions, columns, groups)
        rollout.reward_per_function = scores.per_function.to(self.device)
        rollout.rewards = weighted_reward(rollout.reward_per_function, self.reward_weights.to(self.device))
        return scores

    @torch.no_grad()
    def compute_logprobs(self, model: torch.nn.Module, rollout: Rollout) -> Tensor:
        """Log-probs ``[N, T]`` of the rollout's completions under ``model``, in micro-batches."""
        parts = []
        for rows in torch.arange(len(rollout)).split(self.micro_batch_size):
            logp, _ = self._forward(model, rollout, rows, with_entropy=False)
            parts.append(logp)
        return torch.cat(parts)

    def _forward(
        self, model: torch.nn.Module, rollout: Rollout, rows: Tensor, with_entropy: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        self.compute.add_forward(*rollout.model_inputs(rows)[1::2], backward=torch.is_grad_enabled())  # masks
        with adapter_autocast(model):  # LoRA: bf16 products for float32 adapters
            return completion_logprobs(
                model, *rollout.model_inputs(rows), temperature=self.sampling.temperature, with_entropy=with_entropy,
                **self.engine_plan.logprob_options(),
            )  # fmt: skip

    # ------------------------------------------------------------------ training

    def training_step(self, batch: dict[str, list], batch_idx: int) -> None:
        timer = metrics.PhaseTimer(self.step_metrics, self.device)
        self.generation_batches += 1
        with timer.phase("rollout"):
            rollout = self.generate(batch, self.group_size, self.sampling, with_logprobs=True)
        self.generated_tokens += int(rollout.completion_mask.sum())  # dropped groups cost compute too
        self.compute.add_forward(rollout.prompt_mask, *rollout.model_inputs(torch.arange(len(rollout)))[3:])
        metrics.record_rollout(self.step_metrics, rollout)
        with timer.phase("score"):
            scores = self.score(rollout)
        metrics.record_rewards(self.step_metrics, rollout, [name for name, _ in self.reward_functions])

        steps = self.global_step
        rollout = self.reward_scorer.contain(self, rollout, scores)  # skip_group: drop groups a function failed on
        rollout = self.select(rollout) if rollout is not None else None
        if rollout is None:
            if self.global_step == steps:  # only sampled: its counters go into the next step's row
                self.drop_stale_row()
            return

        with timer.phase("logprob", "grpo.logprobs"):
            if self.needs_old_logprobs(len(rollout)) or (self.beta > 0 and not self.kl_in_loss):
                rollout.old_logp = self.compute_logprobs(self.policy, rollout)
            if self.needs_reference_model():
                with reference_model(self.policy, self.ref_model) as reference:  # LoRA: adapters off
                    rollout.ref_logp = self.compute_logprobs(reference, rollout)

        rewards = rollout.rewards
        if self.hparams.reward_aggregation == "normalize_then_sum":
            rewards = F.group_normalized_reward_sum(rollout.reward_per_function, self.reward_weights, rollout.group_size)
        rewards = self.shape_rewards(rewards, rollout)
        advantages = self.advantages(rewards.view(-1, rollout.group_size)).flatten(0, 1)  # [N], or per token [N, T]
        self.last_rollout, self.last_advantages = rollout, advantages  # for callbacks (completion tables)
        with timer.phase("update"):
            self.update(rollout, advantages)
        self.sampler.compiled_and_ran("logprobs")
        self.trained_rollouts += 1

        total_s = timer.total()
        self.step_metrics.update("perf/step_s", total_s)
        self.step_metrics.update("perf/tokens_per_s", float(rollout.completion_mask.sum()) / max(total_s, 1e-9))
        self.step_metrics.update("advantages/abs_mean", advantages.abs().mean())
        self.log_step()

    def skip_update(self) -> None:
        """Count a training step that changes no weight: ``optimizer.step()`` without gradients
        leaves every parameter as it is (AdamW skips those without one) and advances ``global_step``
        (under manual optimization Lightning counts optimizer steps); the scheduler follows. Logs the row."""
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        scheduler.step()
        self.step_metrics.update("learning_rate", scheduler.get_last_lr()[0])
        self.log_step()

    def update(self, rollout: Rollout, advantages: Tensor) -> None:
        """``ppo_epochs`` passes over the rollout; one optimizer step per minibatch."""
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        size, minibatch = len(rollout), self.minibatch_size or len(rollout)
        for _ in range(self.ppo_epochs):
            order = torch.randperm(size) if self.needs_old_logprobs(size) else torch.arange(size)
            for rows in order.split(minibatch):
                optimizer.zero_grad(set_to_none=True)
                self.accumulate_gradients(rollout, advantages, rows)
                self.clip_and_log_gradient_norm(optimizer)
                optimizer.step()
                scheduler.step()
                self.policy_version += 1
        self.step_metrics.update("learning_rate", scheduler.get_last_lr()[0])

    def clip_and_log_gradient_norm(self, optimizer) -> None:
        """Clip the gradient to ``max_grad_norm`` and log its norm before clipping (``grad_norm``);
        a NaN or infinite norm drops the gradient, so the step changes nothing (``skipped_steps``)."""
        norm = clip_policy_gradients(self, optimizer, self.hparams.max_grad_norm)
        if norm is not None:
            self.step_metrics.update("grad_norm", norm)
            if not self.nonfinite.allows(norm, self.global_step, getattr(self.last_rollout, "prompts", ())):
                optimizer.zero_grad(set_to_none=True)
            self.step_metrics.update("skipped_steps", float(self.nonfinite.skipped), reduce="max")

    def accumulate_gradients(self, rollout: Rollout, advantages: Tensor, rows: Tensor) -> None:
        """Backward of one minibatch, ``micro_batch_size`` rows at a time.

        The aggregation gets the minibatch-wide sequence and token counts (summed over devices),
        so the accumulated gradient does not depend on the micro-batch size.
        """
        num_sequences = len(rows)
        # DDP and FSDP average gradients over devices: normalise by the mean count per device.
        num_tokens = self.sum_over_ranks(self.loss_mask(rollout, rows).sum()) / self.num_processes
        total = torch.zeros((), device=num_tokens.device)
        micro_batches = rows.split(self.micro_batch_size)
        for index, micro_rows in enumerate(micro_batches):
            loss = self.micro_batch_loss(rollout, advantages, micro_rows, num_sequences, num_tokens)
            with contextlib.nullcontext() if index == len(micro_batches) - 1 else self.no_gradient_sync():
                self.manual_backward(loss)
            total += loss.detach()
        self.step_metrics.update("loss", total)

    def loss_mask(self, rollout: Rollout, rows: Tensor) -> Tensor:
        """``[len(rows), T]``: the tokens that carry loss; none of a truncated completion under
        ``mask_truncated_completions``."""
        mask = rollout.completion_mask[rows.to(rollout.completion_mask.device)]
        if self.hparams.mask_truncated_completions:
            mask = mask * ~rollout.truncated[rows.to(mask.device)].unsqueeze(1)
        return mask

    def no_gradient_sync(self) -> contextlib.AbstractContextManager:
        """Context for the backward passes of all but a minibatch's last micro-batch (:func:`grpo_lightning.strategies.no_gradient_sync`)."""
        return no_gradient_sync(self._trainer.strategy if self._trainer is not None else None)

    def micro_batch_loss(
        self, rollout: Rollout, advantages: Tensor, rows: Tensor, num_sequences: int, num_tokens: Tensor
    ) -> Tensor:
        """This micro-batch's share of the minibatch loss: ``aggregate(token_loss + beta * kl)``."""
        micro_mask = self.loss_mask(rollout, rows)
        rows = rows.to(micro_mask.device)
        tokens = micro_mask.sum()
        logp, entropy = self._forward(self.policy, rollout, rows)
        old_logp = logp.detach() if rollout.old_logp is None else rollout.old_logp[rows]
        loss = self.token_loss(logp, old_logp, advantages[rows], micro_mask)
        if self.entropy_coef:  # its gradient raises each loss token's entropy
            loss = loss + self.entropy_coef * entropy_bonus(logp, old_logp)
        if rollout.sampling_logp is not None:  # the engine's log-probs against this pass's
            loss = correct_policy_loss(loss, old_logp, rollout.sampling_logp[rows], micro_mask, self.rollout_correction,
                                       self.hparams.rollout_correction_cap, self.step_metrics)  # fmt: skip
        if self.hparams.top_entropy_quantile < 1:
            loss = loss * F.top_entropy_mask(entropy, micro_mask, self.hparams.top_entropy_quantile)
        if rollout.ref_logp is not None:
            kl = F.kl_estimate(logp, rollout.ref_logp[rows], self.kl_estimator)
            if self.hparams.unbiased_kl:
                kl = kl * torch.exp(logp - old_logp)
            if self.kl_in_loss:
                loss = loss + self.beta * kl
            self.step_metrics.update("kl", F.masked_mean(kl.detach(), micro_mask), tokens)
        self.step_metrics.update("entropy", F.masked_mean(entropy, micro_mask), tokens)
        return self.aggregate(loss, micro_mask, num_sequences=num_sequences, num_tokens=num_tokens)

    # ------------------------------------------------------------------ logging

    def log_step(self) -> None:
        """Log the step's metrics (:func:`grpo_lightning.metrics.metrics_to_log`): means over every
        device's rollouts, generated tokens summed over devices; all of them are kept in
        ``last_step_metrics``; the x-axis and counters of :func:`grpo_lightning.metrics.counters`."""
        values = self.step_metrics.compute_and_reset(gather=resume.gather_over_ranks)
        values["perf/generated_tokens"] = float(sum(resume.gather_over_ranks(self.generated_tokens)))
        values["perf/flops"] = float(sum(resume.gather_over_ranks(self.compute.flops(policy_parameters(self.policy)))))
        values.update(metrics.counters(self.trained_rollouts, self.generation_batches, self.global_step))
        self.logged_steps += 1
        self.last_step_metrics = values
        # The Trainer writes to its loggers every log_every_n_steps steps (True where it does not say).
        connector = getattr(self._trainer, "_logger_connector", None)
        others, progress = metrics.metrics_to_log(values, bool(getattr(connector, "should_update_logs", True)))
        self.log_dict(others, on_step=True, on_epoch=False)
        self.log_dict(progress, on_step=True, on_epoch=False, prog_bar=True)

    def drop_stale_row(self) -> None:
        """No logger row for a batch without an update (Lightning would write the last one again)."""
        results = getattr(self._trainer, "_results", None)
        if results is not None:
            results.reset(metrics=False, fx="training_step")
