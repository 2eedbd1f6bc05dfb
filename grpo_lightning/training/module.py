"""The shared LightningModule of the GRPO family: the step skeleton and the algorithm hooks.

One training step (manual optimization)::

    rollout      = generate(prompts)                  G completions per prompt
    rewards      = score(rollout)                     weighted reward functions       [P * G]
    rollout      = contain(rollout)                   rewards.execution.on_error=skip_group: failed groups out
    rollout      = select(rollout)                    hook (DAPO: dynamic sampling); None = no update yet
    old/ref logp                                      only when needed
    rewards      = shape_rewards(rewards, rollout)    hook (kl.placement reward: r - beta * sum_t kl_t; DAPO:
                                                      overlong; PPO: GAE into rollout.derived)
    advantages   = advantages(rewards.view(P, G), rollout)    hook
    for epoch in range(ppo_epochs):                   grpo_lightning.training.update
        for minibatch:                                one optimizer step each
            extra_losses(minibatch)                   hook (online DPO's pairs)
            for micro-batch:                          memory only: the gradient does not depend on it
                loss = aggregate(token_loss(..., micro) + beta * kl, mask)    hooks
            after_policy_step(minibatch)              hook (PPO's critic step)

Variants (``grpo_lightning.variants``) name their advantage estimator, per-token surrogate and aggregation among the
registered parts (``default_advantage``, ``default_surrogate``, ``default_aggregation``:
:mod:`grpo_lightning.algorithms`), which a run may swap (``--model.advantage``, ``--model.loss.surrogate``,
``--model.aggregation``); where their paper asks they override the hooks (``advantages``,
``token_loss``, ``select``, ``shape_rewards``, the update's ``minibatch_derived``, ``extra_losses``,
``after_policy_step``); ``default_kl_placement`` says where their KL goes unless ``--model.kl.placement``
does. What a hook computes for later ones goes along the calls (``rollout.derived``, the micro-batch),
not on the module.
How rollouts are sampled is :mod:`grpo_lightning.rollout.generation`'s choice; step metrics are
:mod:`grpo_lightning.runtime.metrics`' (a rollout's: :mod:`grpo_lightning.training.rollout_metrics`'); the state of an exact resume is :mod:`grpo_lightning.checkpoints.resume`'s.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_lightning.algorithms import functional
from grpo_lightning.checkpoints import resume
from grpo_lightning.checkpoints.export import save_as_trained
from grpo_lightning.runtime import metrics
from grpo_lightning.training import step_schedule
from grpo_lightning.agents import EnvironmentOptions
from grpo_lightning.agents.multi_turn import multi_turn_engine, sample_episodes
from grpo_lightning.algorithms import KL_PLACEMENTS
from grpo_lightning.algorithms.hooks import AlgorithmHooks, inapplicable_with
from grpo_lightning.runtime.compute import ComputeMeter, policy_parameters
from grpo_lightning.runtime.optimization.compensated import adamw
from grpo_lightning.runtime.argument_types import check_argument_types
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.evaluation.validation import Evaluation
from grpo_lightning.rollout.generation import EnginePlan, RolloutSampler, RolloutWeights, build_rollout
from grpo_lightning.rollout.generation import announce_prompt_format, check_engine_options, format_prompt
from grpo_lightning.models.sources import load_tokenizer
from grpo_lightning.rollout.generation import announce_rollout_mode
from grpo_lightning.rollout.generation.compile_payback import run_length
from grpo_lightning.models.lora import reference_model
from grpo_lightning.models.policy import disable_dropout, load_models
from grpo_lightning.runtime.optimization.nonfinite import NonFiniteGuard
from grpo_lightning.runtime.metrics import EVERY_STEP_METRICS, StepMetrics
from grpo_lightning.training.rollout_metrics import record_rewards, record_rollout
from grpo_lightning.runtime.dtypes import DTYPES
from grpo_lightning.training.options import GROUPS, EvaluationOptions, KLOptions, LossOptions, OptimOptions
from grpo_lightning.training.options import PolicyOptions, RewardOptions, SamplingOptions
from grpo_lightning.rewards import RewardScorer, RewardScores, weighted_reward
from grpo_lightning.rewards.accuracy import start_math_verify_for
from grpo_lightning.rewards.scoring import TrainerState
from grpo_lightning.rollout.types import Rollout, SamplingParams, end_token_ids
from grpo_lightning.training.settings import check_before_loading, check_datasets, check_model
from grpo_lightning.training.settings import check_options_apply, resolve_groups, resolve_rewards
from grpo_lightning.training.run_settings import STEERED, Coefficients, own_arguments, resolve_settings
from grpo_lightning.training.update import PolicyUpdate, policy_part

# Re-exported: variants and user code import them from here.
__all__ = [
    "EVERY_STEP_METRICS", "EngineOptions", "EvaluationOptions", "GroupPolicyOptimization", "KLOptions",
    "LossOptions", "OptimOptions", "PolicyOptions", "RewardOptions", "SamplingOptions", "StepMetrics", "disable_dropout",
]  # fmt: skip


class GroupPolicyOptimization(AlgorithmHooks, PolicyUpdate, resume.GroupPolicyState, Evaluation, L.LightningModule):
    """Base module of the GRPO family: rollout, rewards, reference model, clipped update, logging.

    Args:
        model: Hugging Face hub id or local directory of a causal LM (loaded in ``configure_model``).
        policy: how it is loaded and prompted: tokenizer, dtype, LoRA, chat template
            (:class:`~grpo_lightning.training.options.PolicyOptions`; ``--model.policy.dtype bfloat16``).
        engine: how rollouts are sampled and log-prob passes run, chosen for the device by default
            (:class:`~grpo_lightning.rollout.engine.options.EngineOptions`; ``--model.engine.rollout static``).
            Speed only: the algorithm computes the same with any of them.
        environment: multi-turn rollouts: model turns and an environment's replies, with tools
            (:class:`~grpo_lightning.agents.EnvironmentOptions`; ``--model.environment.name``).
        sampling: the training rollouts: ``G``, ``L``, temperature, beam search, keyed sampling, the
            engine's importance correction (:class:`~grpo_lightning.training.options.SamplingOptions`).
        rewards: the reward functions, their weights, how they run and how their scores combine
            (:class:`~grpo_lightning.training.options.RewardOptions`; ``--model.rewards.funcs``).
        advantage: the registered advantage estimator (:data:`grpo_lightning.algorithms.ADVANTAGES`,
            e.g. ``group_std``); ``None``: the variant's own.
        aggregation: the registered loss aggregation (:data:`grpo_lightning.algorithms.AGGREGATIONS`,
            e.g. ``token_mean``); ``None``: the variant's own.
        loss: the per-token loss: its surrogate (``SURROGATES``, e.g. ``ppo_clip``, ``gspo``), the
            ratio clip, masks and an entropy bonus (:class:`~grpo_lightning.training.options.LossOptions`).
        kl: the KL term's coefficient, estimator and placement (:class:`~grpo_lightning.training.options.KLOptions`;
            ``--model.kl.beta``, ``--model.kl.placement reward``).
        optim: epochs, minibatch and micro-batch sizes, AdamW, clipping
            (:class:`~grpo_lightning.training.options.OptimOptions`; ``--model.optim.learning_rate``).
        evaluation: validation sampling and ``val/accuracy``'s function
            (:class:`~grpo_lightning.training.options.EvaluationOptions`; ``--model.evaluation.samples``).

    A group given as a dict sets the fields it names of the variant's preset group; a group object
    replaces it whole. The hooks read them resolved once, in ``self.settings`` (frozen:
    :class:`~grpo_lightning.training.run_settings.RunSettings`), and ``beta`` and ``entropy_coef`` in
    ``self.coefficients``, which only :meth:`set_coefficient` changes (a schedule's).
    """

    def __init__(
        self,
        model: str,
        policy: PolicyOptions = PolicyOptions(),
        engine: EngineOptions = EngineOptions(),
        environment: EnvironmentOptions | None = None,
        sampling: SamplingOptions = SamplingOptions(),
        rewards: RewardOptions = RewardOptions(),
        advantage: str | None = None,
        aggregation: str | None = None,
        loss: LossOptions = LossOptions(),
        kl: KLOptions = KLOptions(),
        optim: OptimOptions = OptimOptions(),
        evaluation: EvaluationOptions = EvaluationOptions(),
    ) -> None:
        super().__init__()
        check_model(model, policy)
        groups = resolve_groups(type(self), locals())
        for name, group in groups.items():  # self.policy_options, self.sampling_options, ...
            setattr(self, f"{name}_options", group)
        options = EngineOptions.of(engine)
        self.environment = None if environment is None else EnvironmentOptions.of(environment)
        self.save_hyperparameters()
        # Plain values in the hyperparameters (hparams.yaml, loggers, checkpoints), whatever form the
        # groups came in (objects, dicts, the CLI's class_path/init_args); the loggers read the initial copy.
        plain = {name: group.state() for name, group in groups.items()}
        plain.update(engine=asdict(options), environment=None if self.environment is None else self.environment.state())
        self.hparams.update(plain)
        self._hparams_initial.update(plain)
        policy, sampling, rewards, loss, kl, optim, evaluation = (groups[name] for name in GROUPS)
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints leave the frozen reference model out

        check_argument_types(type(self), self.hparams)  # the variant's own arguments (tau_pos, ...)
        inapplicable = inapplicable_with(type(self), loss.surrogate)  # with the surrogate of this run
        kl_placement = KL_PLACEMENTS.resolve(kl.placement) or self.default_kl_placement  # a name of KL_PLACEMENTS
        check_options_apply(type(self), inapplicable, kl_placement, self.option_values())
        loss.check_clip_pair()
        own = own_arguments(type(self), GroupPolicyOptimization, self.hparams)
        self.settings = resolve_settings(type(self), groups, advantage, aggregation, kl_placement, own)
        self.coefficients = Coefficients(beta=kl.beta, entropy_coef=loss.entropy_coef)  # set_coefficient steers them
        check_engine_options(options, sampling.seed, sampling.beam_search)
        options = (
            options if self.environment is None else multi_turn_engine(options, sampling.seed, sampling.beam_search)
        )
        self.reward_functions, self.reward_weights = resolve_rewards(rewards.funcs, rewards.weights)
        self.reward_scorer = RewardScorer(rewards.execution, self.reward_functions)  # workers, warnings, NaN counts

        self.model_name = model
        self.tokenizer_name = policy.tokenizer or model
        self.engine_options = options
        self.sampling = SamplingParams(sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k,
                                       sampling.min_new_tokens, sampling.beam_search)  # fmt: skip
        self.configure_evaluation(evaluation, sampling)

        self.policy: PreTrainedModel | None = None
        self.ref_model: PreTrainedModel | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._samplers: dict[str, RolloutSampler] = {}  # by kind of device
        self.rollout_weights = RolloutWeights(DTYPES[sampling.dtype] if sampling.dtype else None)
        self.policy_version = 0  # optimizer steps taken: a rollout replica older than this is refreshed
        self.rollouts = 0  # generate() calls so far: part of the keys of keyed sampling
        self.step_metrics = StepMetrics()
        self.nonfinite = NonFiniteGuard(optim.max_nonfinite_steps)
        self.generated_tokens = self.generation_batches = self.trained_rollouts = 0  # sampled; rollouts trained on
        self.compute = ComputeMeter()  # token passes of training: perf/flops
        self.last_step_metrics: dict[str, float] = {}  # every metric of the last training step
        self.last_rollout, self.last_advantages = None, None  # the last step's scored rollout, its advantages
        self.logged_steps = 0  # training steps logged: with an update, or counted by skip_update
        self.logger_row: dict[str, float] | None = None  # the loggers' row of this step (log_step)

    def option_values(self) -> dict[str, Any]:
        """Every option of the groups by its dotted name (``loss.delta``), and the parts and environment."""
        values = {
            f"{name}.{key}": value for name in GROUPS for key, value in vars(getattr(self, f"{name}_options")).items()
        }
        return {**values, "advantage": self.hparams.advantage, "aggregation": self.hparams.aggregation,
                "environment": self.hparams.environment}  # fmt: skip

    def set_coefficient(self, name: str, value: float) -> None:
        """Use ``value`` for the coefficient ``name`` (``beta``, ``entropy_coef``) from now on, and log it
        with the step's metrics (``beta``, ``entropy/coef``): how a schedule steers one during a fit."""
        self.coefficients = self.coefficients.with_value(name, value)
        self.step_metrics.update(STEERED[name], getattr(self.coefficients, name))

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
        in_this_process = [] if self.reward_scorer.execution.workers else self.reward_functions  # else in the workers
        start_math_verify_for(function for _, function in [*in_this_process, self.accuracy_function])

    def configure_model(self) -> None:
        """Load tokenizer, policy and, when the loss needs one, the frozen reference model
        (:func:`grpo_lightning.models.policy.load_models`: FSDP sharding, LoRA adapters)."""
        if self.policy is not None:
            return
        field = "policy.tokenizer" if self.policy_options.tokenizer else "model"  # the setting that named it
        self.tokenizer = load_tokenizer(self.tokenizer_name, field)
        strategy = self.trainer.strategy if self._trainer is not None else None
        self.policy, self.ref_model = load_models(
            self.model_name, self.hparams.policy, self.needs_reference_model(), strategy
        )
        self.stop_completions_at(end_token_ids(self.tokenizer, self.policy))  # EOS and the model's end of turn

    def save_pretrained(self, directory: str) -> None:
        """The policy and tokenizer as a plain Hugging Face directory, as the run trained them (rank 0 writes;
        under FSDP every process must call it): :func:`~grpo_lightning.checkpoints.export.save_as_trained`."""
        save_as_trained(self.policy, self.tokenizer, directory, dict(self.hparams), write=self.global_rank == 0)

    @property
    def sampler(self) -> RolloutSampler:
        """What samples this device's rollouts, on the engine options resolved for the device, the
        model, the strategy and the run's length (:func:`grpo_lightning.rollout.generation.resolve_engine`):
        once per kind of device, announced then (Lightning moves the module to the CPU between stages)."""
        kind = self.device.type
        if kind not in self._samplers:
            strategy = self._trainer.strategy if self._trainer is not None else None
            run = run_length(self._trainer, self.sampling.max_new_tokens, self.val_sampling.max_new_tokens)
            options = (self.engine_options, self.sampling_options.seed, self.sampling.beam_search, run)
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
        optim = self.optim_options
        optimizer = adamw(parameters, optim.learning_rate, optim.weight_decay)
        warmup = optim.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ the end of a fit

    #: Set by the CLI for its ``fit``, after which the process ends: Lightning's teardown then leaves the weights
    #: and the optimizer's state where they are instead of copying them to the CPU to free the GPU, which there
    #: only costs time (4.9 s for W1's 0.5B model on an H200, growing with the model).
    process_ends_with_fit = False
    #: Whether ``on_train_end`` has dropped the optimizer's state (a checkpoint written after it has none).
    optimizer_state_released = False

    def on_train_end(self) -> None:
        if self.process_ends_with_fit:  # after every callback's on_train_end: the last checkpoint has its state
            for optimizer in self.trainer.optimizers:
                optimizer.state.clear()
            self.optimizer_state_released = True

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.optimizer_state_released:
            rank_zero_warn("this checkpoint is written after the fit's last step, when the command line's fit has released "
                           "the optimizer's state: it has none. Save checkpoints to resume from in on_train_end or earlier.")

    def cpu(self):
        return self if self.process_ends_with_fit else super().cpu()

    # ------------------------------------------------------------------ checks before work

    def on_fit_start(self) -> None:
        self.engine_plan  # resolved, and announced, before the first step
        ends = self.sampling.end_ids(self.tokenizer) if self.environment is None else None  # episodes: the EOS
        announce_prompt_format(self.tokenizer, self.policy_options.use_chat_template, ends)
        announce_rollout_mode(self.sampling_options.mode)
        context = getattr(self.policy.config, "max_position_embeddings", None)
        longest = max(self.sampling.max_new_tokens, self.val_sampling.max_new_tokens)
        longest = longest if self.environment is None else self.environment.token_budget(longest)
        check_datasets(self.trainer.datamodule, self.tokenizer, self.format_prompt, context, longest,
                       self.settings.group_size, self.settings.minibatch_size)  # fmt: skip

    # ------------------------------------------------------------------ rollout

    def format_prompt(self, prompt: Any) -> str:
        """The prompt as text for the model (:func:`grpo_lightning.rollout.generation.format_prompt`)."""
        return format_prompt(self.tokenizer, prompt, self.policy_options.use_chat_template)

    def rollout_model(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """The model rollouts sample from inside the ``with`` block
        (:class:`~grpo_lightning.rollout.generation.RolloutWeights`)."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        return self.rollout_weights.model(self.policy, self.policy_version, strategy)

    def generate(self, batch: dict[str, list], group_size: int, sampling: SamplingParams, with_logprobs=False) -> Rollout:
        """Sample ``group_size`` completions for each prompt of ``batch`` (``with_logprobs``: and
        keep the engine's log-probs of the sampled tokens, ``rollout.sampling_logp``); ``rollout.sampling_version``:
        the policy version of the weights sampled from."""
        texts = None if self.environment is not None else [self.format_prompt(p) for p in batch["prompt"]]
        with self.rollout_model() as model:
            version = self.rollout_weights.version_sampled(self.policy_version)
            if texts is None:
                rollout = sample_episodes(model, self.tokenizer, batch, group_size, sampling, self.environment,
                                          self.policy_options.use_chat_template, with_logprobs, self.sampler)  # fmt: skip
            else:
                sampled = self.sampler.sample(model, self.tokenizer, texts, group_size, sampling, self.rollouts, with_logprobs)
                rollout = build_rollout(self.tokenizer, batch, group_size, *sampled, end_ids=sampling.end_ids(self.tokenizer))
        self.rollouts += 1
        rollout.sampling_version = torch.full_like(rollout.completion_ids, version)
        return rollout

    def score(self, rollout: Rollout) -> RewardScores:
        """Fill ``rollout.reward_per_function`` ``[N, F]`` and the weighted ``rollout.rewards`` ``[N]``;
        return the scores with the samples each function failed on (``rewards.execution``)."""
        columns, groups = rollout.columns, [row // rollout.group_size for row in range(len(rollout))]  # group_index
        scores = self.reward_scorer.score(self.reward_functions, rollout.prompts, rollout.completions, columns, groups,
                                          rollout.model_token_ids(), TrainerState.of(self._trainer))  # fmt: skip
        rollout.reward_per_function = scores.per_function.to(self.device)
        rollout.rewards = weighted_reward(rollout.reward_per_function, self.reward_weights.to(self.device))
        return scores

    # ------------------------------------------------------------------ training

    def training_step(self, batch: dict[str, list], batch_idx: int) -> dict[str, Rollout]:
        """One step; returns ``{"rollout": the step's rollout as scored}``, every group (callbacks' ``outputs``)."""
        timer = metrics.PhaseTimer(self.step_metrics, self.device)
        self.generation_batches += 1
        with timer.phase("rollout"):
            rollout = self.generate(batch, self.settings.group_size, self.sampling, with_logprobs=True)
        self.generated_tokens += int(rollout.completion_mask.sum())  # dropped groups cost compute too
        self.compute.add_forward(rollout.prompt_mask, rollout.attended_mask)
        if (rollout := self.exchange_stale(rollout)) is None:  # bounded staleness: the queue is filling
            return self.drop_stale_row()
        record_rollout(self.step_metrics, rollout)
        with timer.phase("score"):
            scores = self.score(rollout)
        record_rewards(self.step_metrics, rollout, [name for name, _ in self.reward_functions])

        steps, num_groups, scored = self.global_step, rollout.num_groups, rollout  # the update makes the batch's steps
        rollout = self.reward_scorer.contain(self, rollout, scores)  # skip_group: drop groups a function failed on
        rollout = self.select(rollout, num_groups) if rollout is not None else None
        if rollout is None:
            if self.global_step == steps:  # only sampled: its counters go into the next step's row
                self.drop_stale_row()
            return {"rollout": scored}

        with timer.phase("logprob", "grpo.logprobs"):
            self.compute_old_logprobs(rollout, num_groups)
            if self.needs_reference_model():
                with reference_model(self.policy, self.ref_model) as reference:  # LoRA: adapters off
                    rollout.ref_logp = self.compute_logprobs(reference, rollout)
            if self.needs_token_statistics():  # OTB's realized energy
                rollout.derived.update(self.compute_token_statistics(rollout))

        rewards = rollout.rewards
        if self.rewards_options.aggregation == "normalize_then_sum":
            rewards = functional.group_normalized_reward_sum(rollout.reward_per_function, self.reward_weights, rollout.group_size)
        rewards = self.shape_rewards(rewards, rollout)
        advantages = self.advantages(rewards.view(-1, rollout.group_size), rollout).flatten(0, 1)  # [N], or [N, T]
        self.last_rollout, self.last_advantages = rollout, advantages  # for callbacks (completion tables)
        with timer.phase("update"):
            self.update(rollout, advantages, num_groups)
        self.sampler.compiled_and_ran("logprobs")
        self.trained_rollouts += 1

        total_s = timer.total()
        self.step_metrics.update("perf/step_s", total_s)
        self.step_metrics.update("perf/tokens_per_s", float(rollout.completion_mask.sum()) / max(total_s, 1e-9))
        self.step_metrics.update("advantages/abs_mean", functional.mean_abs_advantage(advantages, rollout.completion_mask))
        self.log_step()
        return {"rollout": scored}

    def skip_update(self, num_groups: int) -> None:
        """Count the update of a batch of ``num_groups`` prompts that has no group left to train on:
        its optimizer steps (:meth:`minibatches`), each without a gradient, so that ``global_step``
        moves as after any update (up to ``max_steps``) and no weight changes. Logs the row."""
        optimizer, scheduler = policy_part(self.optimizers()), policy_part(self.lr_schedulers())
        for _ in range(int(min(self.settings.ppo_epochs * self.minibatches(num_groups), self.steps_left()))):
            self.step_without_gradient(optimizer, scheduler)
        self.step_metrics.update("learning_rate", scheduler.get_last_lr()[0])
        self.log_step()

    # ------------------------------------------------------------------ logging

    def log_step(self) -> None:
        """Log the step's metrics: means over every device's rollouts, generated tokens summed over
        devices, the x-axis and counters of :func:`grpo_lightning.runtime.metrics.counters`. All of them
        are kept in ``last_step_metrics``. The loss, reward and KL go through ``self.log`` at every step.
        On the steps the Trainer writes to its loggers (every ``log_every_n_steps``) all of them go into
        ``trainer.callback_metrics`` and ``trainer.logged_metrics``, and to the loggers after the
        callbacks' hooks (:meth:`on_train_batch_end`), with what these add to ``logger_row``."""
        values = self.step_metrics.compute_and_reset(gather=resume.gather_over_ranks)
        values["perf/generated_tokens"] = float(sum(resume.gather_over_ranks(self.generated_tokens)))
        values["perf/flops"] = float(sum(resume.gather_over_ranks(self.compute.flops(policy_parameters(self.policy)))))
        values.update(metrics.counters(self.trained_rollouts, self.generation_batches, self.global_step))
        self.logged_steps += 1
        self.last_step_metrics = values
        others, progress = metrics.every_step_metrics(values)
        self.log_dict(others, on_step=True, on_epoch=False, logger=False)
        self.log_dict(progress, on_step=True, on_epoch=False, prog_bar=True, logger=False)
        connector = getattr(self._trainer, "_logger_connector", None)
        if self._trainer is not None and bool(getattr(connector, "should_update_logs", True)):
            metrics.keep_as_logged(self.trainer, values, loggers_write=True)
            self.logger_row = dict(values)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """The step's row to the loggers (:func:`grpo_lightning.runtime.metrics.write_to_loggers`)."""
        row, self.logger_row = self.logger_row, None
        if row is not None:
            metrics.write_to_loggers(self.trainer, row)

    def drop_stale_row(self) -> None:
        """No logger row for a batch without an update (Lightning would write the last one again)."""
        results = getattr(self._trainer, "_results", None)
        if results is not None:
            results.reset(metrics=False, fx="training_step")
