"""Validation and test of the policy: ``evaluation.samples`` completions per prompt, scored by the reward
functions, with confidence intervals over prompts (:mod:`grpo_lightning.evaluation.sample_metrics`).

Metrics, under ``val/`` (``test/`` under ``grpo-lightning test``; ``val/<name>/`` for each further
validation set of the data module's ``val_sets``): ``accuracy`` (the mean of ``accuracy_func`` over
every completion), ``reward``, ``mean_length``, ``truncated_share`` (completions cut at the token
limit, scored as they stand), and with ``n = evaluation.samples > 1`` ``pass@k`` for
``k = 1, 2, 4, ..., n`` and ``maj@n``; each with ``<metric>_ci_low`` and ``<metric>_ci_high``. With
reference answers, ``top_answer_share`` and ``reference_top_answer_share`` too
(:mod:`grpo_lightning.evaluation.answer_spread`). Each completion's reward and accuracy score go to
``<log_dir>/outcomes/`` (:mod:`grpo_lightning.evaluation.outcomes`), for comparisons paired by prompt.
On several devices each prompt counts once (:func:`unpadded`). A mixin of
:class:`grpo_lightning.training.module.GroupPolicyOptimization`, which owns the reward functions and ``generate``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DistributedSampler

from grpo_lightning.checkpoints import resume
from grpo_lightning.rewards import group_indices, resolve_reward_function
from grpo_lightning.rewards.sandbox.execution import RewardScorer
from grpo_lightning.rewards.consistency import vote
from grpo_lightning.rewards.scoring import TrainerState
from grpo_lightning.rollout.types import Rollout, SamplingParams
from grpo_lightning.evaluation.answer_spread import answer_shares, prompt_answers
from grpo_lightning.evaluation.loggers import log_dir
from grpo_lightning.evaluation.outcomes import outcome_rows, outcomes_path, prompt_hash, write_outcomes
from grpo_lightning.evaluation.sample_metrics import prompt_metrics, summarize

#: Metrics shown in the progress bar.
PROGRESS_BAR = ("accuracy",)


def common_names(parts: list[dict[str, Tensor]]) -> list[str]:
    """The metric names every part has, in the first part's order."""
    return [name for name in parts[0] if all(name in part for part in parts)]


def dataset_positions(sampler: Any, count: int) -> Tensor:
    """``[count]`` positions in its set of the first ``count`` prompts a process evaluated, the
    evaluation loaders going through their set in order: on several devices the ``k``-th prompt of
    rank ``r`` is at ``r + k * num_replicas`` (from ``len(dataset)`` on: padding, see :func:`unpadded`)."""
    if not isinstance(sampler, DistributedSampler):
        return torch.arange(count)
    return sampler.rank + sampler.num_replicas * torch.arange(count)


def unpadded(sampler: Any, count: int) -> Tensor:
    """``[count]`` bool: which of the first ``count`` prompts a process evaluated are its own, not
    padding. On several devices Lightning puts a ``DistributedSampler`` under each evaluation loader;
    it deals the prompts to the processes in turn after repeating the first ones until every process
    gets as many (5 prompts on 2 processes: 6), so each repeat would be scored twice. The ``k``-th
    prompt of rank ``r`` is at ``r + k * num_replicas`` of that list, and padding from ``len(dataset)``
    on. Every process still evaluates as many batches, as FSDP's collectives in generation need."""
    if not isinstance(sampler, DistributedSampler):
        return torch.ones(count, dtype=torch.bool)
    return dataset_positions(sampler, count) < len(sampler.dataset)


class Evaluation:
    """``validation_step``/``test_step`` and what they need; mixed into the LightningModule."""

    def on_validation_epoch_start(self) -> None:
        self._evaluated: dict[int, list[dict[str, Tensor]]] = {}
        self._sampled_outcomes: dict[int, list[tuple[list[str], Tensor, Tensor]]] = {}  # pass@k's completions
        self._answers: dict[int, list] = {}  # per set: each prompt's reference and its completions' answers
        # per set: each batch's prompt hashes, and its [P, n] rewards and accuracy scores
        self._outcomes: dict[int, list[tuple[list[str], Tensor, Tensor]]] = {}

    #: Completions per prompt in validation, ``n`` (``evaluation.samples``; ``evaluation_sampling`` sets it for a block).
    val_samples: int = 1
    #: Further sampled completions per prompt for pass@k beside greedy ones (``evaluation.pass_at_k_samples``).
    pass_at_k_samples: int = 0

    def configure_evaluation(self, evaluation: Any, sampling: Any) -> None:
        """The validation's function and sampling from ``evaluation`` and ``sampling`` (their option groups)."""
        self.accuracy_function = resolve_reward_function(evaluation.accuracy_func, field="evaluation.accuracy_func")
        self.val_samples = evaluation.samples  # evaluation_sampling sets it for a block
        self.val_sampling = SamplingParams(evaluation.max_new_tokens or sampling.max_new_tokens, evaluation.temperature,
                                           sampling.top_p, sampling.top_k)  # fmt: skip
        self.pass_at_k_samples = evaluation.pass_at_k_samples
        self.pass_at_k_sampling = dataclasses.replace(self.val_sampling, temperature=evaluation.pass_at_k_temperature)

    def stop_completions_at(self, ids: tuple[int, ...]) -> None:
        """End the completions of training, validation and pass@k at ``ids``
        (:func:`~grpo_lightning.rollout.types.end_token_ids`)."""
        self.sampling, self.val_sampling, self.pass_at_k_sampling = (
            dataclasses.replace(params, stop_token_ids=ids)
            for params in (self.sampling, self.val_sampling, self.pass_at_k_sampling)
        )

    @contextlib.contextmanager
    def evaluation_sampling(self, samples: int, temperature: float, prefix: str | None = None) -> Iterator[None]:
        """Validate with ``samples`` completions per prompt at ``temperature`` inside the ``with``
        block, logged under ``prefix`` (default: ``val``/``test``), e.g. pass@k after a greedy fit.
        Every metric comes from these completions: ``evaluation.pass_at_k_samples`` draws none here."""
        if samples > 1 and temperature <= 0:
            raise ValueError(f"evaluation_sampling: {samples} samples per prompt need temperature > 0 (got {temperature}).")
        saved = (self.val_samples, self.val_sampling, getattr(self, "_metric_prefix", None), self.pass_at_k_samples)
        self.val_samples = samples
        self.val_sampling = dataclasses.replace(self.val_sampling, temperature=temperature)
        self._metric_prefix = prefix
        self.pass_at_k_samples = 0  # its pass@k would replace the block's own, from other completions
        try:
            yield
        finally:
            self.val_samples, self.val_sampling, self._metric_prefix, self.pass_at_k_samples = saved

    def accuracy_scores(self, rollout: Rollout) -> Tensor:
        """``[N]`` scores of ``accuracy_func``: its column of the rewards when it is also a reward
        function, so it is not called twice; its failures are handled as ``rewards.execution`` says
        (``zero`` and ``skip_group``: the sample scores 0)."""
        accuracy = self.accuracy_function[1]
        for column, (_, function) in enumerate(self.reward_functions):
            if function is accuracy:
                return rollout.reward_per_function[:, column]
        if getattr(self, "_accuracy_scorer", None) is None:
            # Its on_error and timeout_s are the rewards' (rewards.execution); it runs here, not in their workers.
            self._accuracy_scorer = RewardScorer(dataclasses.replace(self.reward_scorer.execution, workers=0))
        columns, groups = rollout.columns, group_indices(len(rollout), rollout.group_size)
        scores = self._accuracy_scorer.score([self.accuracy_function], rollout.prompts, rollout.completions, columns,
                                             groups, rollout.model_token_ids(), TrainerState.of(self._trainer))  # fmt: skip
        return scores.per_function[:, 0]

    def validation_step(self, batch: dict[str, list], batch_idx: int, dataloader_idx: int = 0) -> None:
        """``val_samples`` completions per prompt, scored; the metrics are computed over all prompts
        at the epoch's end."""
        samples = self.val_samples
        rollout = self.generate(batch, samples, self.val_sampling)
        self.score(rollout)
        correct, rewards = self.accuracy_scores(rollout).view(-1, samples).cpu(), rollout.rewards.view(-1, samples).cpu()
        references = rollout.columns.get("answer")
        votes = [vote(c) for c in rollout.completions] if samples > 1 or references is not None else []
        lengths = rollout.lengths.view(-1, samples).cpu()
        truncated = rollout.truncated.view(-1, samples).cpu()
        per_prompt = prompt_metrics(correct, rewards, lengths, votes if samples > 1 else [], truncated)
        hashes = [prompt_hash(prompt) for prompt in batch["prompt"]]
        if self.pass_at_k_samples:
            per_prompt.update(self._pass_at_k(batch, hashes, dataloader_idx))
        self._evaluated.setdefault(dataloader_idx, []).append(per_prompt)
        self._outcomes.setdefault(dataloader_idx, []).append((hashes, rewards, correct))
        if references is not None:
            answers = prompt_answers(references, rollout.completions, samples, votes)
            self._answers.setdefault(dataloader_idx, []).extend(answers)

    def _pass_at_k(self, batch: dict[str, list], hashes: list[str], dataloader_idx: int) -> dict[str, Tensor]:
        """Per-prompt ``pass@k`` and ``maj@n`` of ``pass_at_k_samples`` completions per prompt of ``batch``,
        drawn at ``pass_at_k_sampling``; their outcomes are kept for ``<prefix>-sampled-step<N>``."""
        samples = self.pass_at_k_samples
        rollout = self.generate(batch, samples, self.pass_at_k_sampling)
        self.score(rollout)
        correct, rewards = self.accuracy_scores(rollout).view(-1, samples).cpu(), rollout.rewards.view(-1, samples).cpu()
        self._sampled_outcomes.setdefault(dataloader_idx, []).append((hashes, rewards, correct))
        votes = [vote(c) for c in rollout.completions]
        metrics = prompt_metrics(correct, rewards, rollout.lengths.view(-1, samples).cpu(), votes)
        return {name: values for name, values in metrics.items() if name.startswith(("pass@", "maj@"))}

    def on_validation_epoch_end(self) -> None:
        """Log each validation set's metrics over its prompts on every device, with intervals."""
        names = getattr(self._trainer.datamodule, "val_set_names", None) if self._trainer is not None else None
        prefix = getattr(self, "_metric_prefix", None) or ("test" if self._trainer is not None and self.trainer.testing else "val")
        outcomes, sampled_outcomes = [], []
        for index, parts in sorted(self._evaluated.items()):
            # pass@k and maj@n are left out of a batch whose scores are not 0/1 (prompt_metrics): out of every batch's
            local = {name: torch.cat([part[name] for part in parts]) for name in common_names(parts)}
            own = unpadded(getattr(self._evaluated_loader(index), "sampler", None), len(next(iter(local.values()))))
            local = {name: values[own] for name, values in local.items()}
            gathered = resume.gather_over_ranks(local)
            per_prompt = {name: torch.cat([part[name] for part in gathered]) for name in common_names(gathered)}
            set_name = names[index] if names and index < len(names) and not self.trainer.testing else ""
            where = f"{prefix}/{set_name}/" if set_name else f"{prefix}/"
            outcomes += self._set_outcomes(index, set_name, own)
            sampled_outcomes += self._set_outcomes(index, set_name, own, self._sampled_outcomes) if self._sampled_outcomes else []
            samples = max(self.val_samples, self.pass_at_k_samples or 0)  # completions behind a prompt's value, at most
            summary = {**summarize(per_prompt, samples), **self._answer_shares(index, own)}
            for name, value in summary.items():  # the same on every device (sync_dist: no warning)
                self.log(where + name, value, prog_bar=name in PROGRESS_BAR and not set_name, add_dataloader_idx=False,
                         sync_dist=True)  # fmt: skip
        self._evaluated, self._answers, self._outcomes, self._sampled_outcomes = {}, {}, {}, {}
        directory = log_dir(self.trainer) if self.trainer.is_global_zero and not self.trainer.sanity_checking else None
        if directory and outcomes:
            write_outcomes(outcomes, outcomes_path(directory, prefix, self.global_step))
        if directory and sampled_outcomes:
            write_outcomes(sampled_outcomes, outcomes_path(directory, f"{prefix}-sampled", self.global_step))
        self.log("step", float(self.global_step), add_dataloader_idx=False)  # the x-axis: optimizer steps taken
        for sampler in self._samplers.values():  # a validation batch's cache would hold its memory through training
            sampler.release()

    def _set_outcomes(self, index: int, set_name: str, own: Tensor, kept_outcomes: dict | None = None) -> list[list]:
        """The outcome rows of set ``index`` over every device's own prompts (every process must call it)."""
        parts = (self._outcomes if kept_outcomes is None else kept_outcomes)[index]
        hashes = [digest for part in parts for digest in part[0]]
        rewards, correct = (torch.cat([part[i] for part in parts]) for i in (1, 2))
        positions = dataset_positions(getattr(self._evaluated_loader(index), "sampler", None), len(hashes))
        kept = own.tolist()
        local = outcome_rows(set_name, positions[own].tolist(), [h for h, keep in zip(hashes, kept) if keep],
                             rewards[own].tolist(), correct[own].tolist(), self.global_step)  # fmt: skip
        return [row for part in resume.gather_over_ranks(local) for row in part]

    def _answer_shares(self, index: int, own: Tensor) -> dict[str, float]:
        """The answer shares of set ``index`` over every device's own prompts; none without reference answers."""
        if index not in self._answers:
            return {}
        local = [answers for answers, kept in zip(self._answers[index], own.tolist()) if kept]
        return answer_shares([answers for part in resume.gather_over_ranks(local) for answers in part])

    def _evaluated_loader(self, index: int) -> Any:
        """The data loader of validation (or test) set ``index``, as the trainer runs it."""
        loaders = self.trainer.test_dataloaders if self.trainer.testing else self.trainer.val_dataloaders
        if isinstance(loaders, (list, tuple)):
            return loaders[index] if index < len(loaders) else None
        return loaders if index == 0 else None

    test_step = validation_step
    on_test_epoch_start = on_validation_epoch_start
    on_test_epoch_end = on_validation_epoch_end
