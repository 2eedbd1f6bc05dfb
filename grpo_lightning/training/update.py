"""The update on one rollout: ``ppo_epochs`` passes, one optimizer step per minibatch, micro-batches.

Every micro-batch's loss reads a :class:`~grpo_lightning.rollout.types.MicroBatch` (its rows, their
tensors, the minibatch's counts): the accumulated gradient does not depend on how the rows are split
(``micro_batch_size`` rows, or ``micro_batch_tokens`` tokens, a pass).
Where a variant's loop differs, it says so through hooks
(:class:`~grpo_lightning.algorithms.hooks.AlgorithmHooks`): tensors chosen once per minibatch
(``minibatch_derived``), losses besides the policy's micro-batches (``extra_losses``) and work after
each policy step (``after_policy_step``), never by copying the loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional
from grpo_lightning.algorithms.entropy import entropy_bonus
from grpo_lightning.algorithms.kl import KL_PLACEMENTS
from grpo_lightning.algorithms.rollout_correction import correct_policy_loss, proximal_logprobs, record_masked_fraction
from grpo_lightning.models.logprobs import completion_logprobs
from grpo_lightning.models.lora import adapter_autocast
from grpo_lightning.models.token_statistics import completion_token_statistics
from grpo_lightning.training.micro_batches import fewest_micro_batches, in_row_order, row_tokens, token_budget_split
from grpo_lightning.rollout.types import MicroBatch, Rollout
from grpo_lightning.runtime.strategies import clip_policy_gradients, no_gradient_sync


def minibatches_per_epoch(num_groups: int, group_size: int, minibatch_size: int | None) -> int:
    """Optimizer steps of one pass over a batch of ``num_groups`` prompts of ``group_size`` completions:
    ``ceil(num_groups x group_size / minibatch_size)``, or 1 where ``minibatch_size`` is ``None`` (the whole rollout)."""
    return -(-num_groups * group_size // minibatch_size) if minibatch_size else 1


def policy_part(objects: Any) -> Any:
    """The policy's optimizer or scheduler: the first of several (PPO's critic has its own)."""
    return objects[0] if isinstance(objects, (list, tuple)) else objects


class PolicyUpdate:
    """The update loop and the log-prob passes of :class:`~grpo_lightning.training.module.GroupPolicyOptimization`."""

    #: Rollouts sampled ahead of the update (:class:`~grpo_lightning.rollout.stale.StaleQueue`), or ``None``.
    stale_queue: Any = None

    def exchange_stale(self, rollout: Rollout) -> Rollout | None:
        """``rollout``, or under bounded staleness the rollout queued ``k`` batches before it
        (:class:`~grpo_lightning.rollout.stale.StaleRollouts`; ``None`` while the queue fills)."""
        if self.stale_queue is None:
            return rollout
        return self.stale_queue.exchange(rollout, self.policy_version, self.step_metrics)

    @torch.no_grad()
    def compute_logprobs(self, model: torch.nn.Module, rollout: Rollout) -> Tensor:
        """Log-probs ``[N, T]`` of the rollout's completions under ``model``, in micro-batches."""
        parts, micro_batches = [], self.micro_batches(rollout, torch.arange(len(rollout)))
        for rows in micro_batches:
            logp, _ = self._forward(model, rollout, rows, with_entropy=False)
            parts.append(logp)
        return in_row_order(parts, micro_batches)

    @torch.no_grad()
    def compute_token_statistics(self, rollout: Rollout) -> dict[str, Tensor]:
        """``token_logp`` and ``sum_pi_squared`` ``[N, T]`` of the rollout's completions under the
        policy, in micro-batches, for an advantage that reads them (OTB): a forward pass, no backward."""
        parts, micro_batches = [], self.micro_batches(rollout, torch.arange(len(rollout)))
        for rows in micro_batches:
            inputs = rollout.model_inputs(rows)
            self.compute.add_forward(inputs[1], inputs[3])
            with adapter_autocast(self.policy):
                parts.append(completion_token_statistics(self.policy, *inputs, temperature=self.sampling.temperature))
        logp, squares = ([part[i] for part in parts] for i in range(2))
        return {"token_logp": in_row_order(logp, micro_batches), "sum_pi_squared": in_row_order(squares, micro_batches)}

    def compute_old_logprobs(self, rollout: Rollout, num_groups: int | None = None) -> None:
        """The update's old log-probs (``sampling.old_logprobs``): ``rollout.old_logp`` by a pass of its
        own where the update needs one (:meth:`needs_old_logprobs`, a KL in the reward, a correction
        chosen over the whole rollout) and ``recompute`` asks for it, the sampler's under ``bypass``, and
        under ``loglinear`` the version the update starts from (``rollout.derived["proximal_version"]``);
        the weights of a correction chosen over the rollout (``rollout.derived["correction_weights"]``,
        or ``["rejection_keep"]`` for one whose rejected tokens leave the loss mask: :data:`~grpo_lightning.
        algorithms.rollout_correction.OUT_OF_MASK`), over the tokens that carry loss (:meth:`loss_mask`: a
        completion that carries none, truncated under ``loss.mask_truncated_completions``, does not count
        in m2po's second moment)."""
        source, correction = self.sampling_options.old_logprobs, self.settings.rollout_correction
        over_rollout = correction.over_rollout and rollout.sampling_logp is not None
        needed = source == "recompute" and self.needs_old_logprobs(self.minibatches(num_groups or rollout.num_groups))
        if source == "bypass" and rollout.sampling_logp is not None:
            rollout.old_logp = rollout.sampling_logp
        elif needed or over_rollout or (self.coefficients.beta > 0 and KL_PLACEMENTS[self.settings.kl_placement].in_reward):
            rollout.old_logp = self.compute_logprobs(self.policy, rollout)
        if source == "loglinear":
            version = torch.full((len(rollout),), self.policy_version, device=rollout.device)
            rollout.derived["proximal_version"] = version
        if over_rollout:
            loss_mask = self.loss_mask(rollout, torch.arange(len(rollout)))
            weights = correction.weights(rollout.old_logp, rollout.sampling_logp, loss_mask)
            rollout.derived["rejection_keep" if correction.out_of_mask else "correction_weights"] = weights
            if correction.out_of_mask:  # its share of the loss tokens, which the update no longer sees
                record_masked_fraction(self.step_metrics, weights, loss_mask)

    def old_logprobs(self, micro: MicroBatch, logp: Tensor) -> Tensor:
        """``[n, T]``: the rollout's old log-probs, else AReaL's approximation (:func:`proximal_logprobs`)
        under ``loglinear``, else the current ones, detached (the update's first step)."""
        if micro.old_logp is not None:
            return micro.old_logp
        loglinear = "proximal_version" in micro.derived and micro.sampling_logp is not None
        if loglinear and micro.sampling_version is not None:
            return proximal_logprobs(logp, micro.sampling_logp, micro.sampling_version,
                                     micro.derived["proximal_version"], self.policy_version)  # fmt: skip
        return logp.detach()

    def _forward(
        self, model: torch.nn.Module, rollout: Rollout, rows: Tensor, with_entropy: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        inputs = rollout.model_inputs(rows)
        self.compute.add_forward(inputs[1], inputs[3], backward=torch.is_grad_enabled())  # prompt, completion masks
        with adapter_autocast(model):  # LoRA: bf16 products for float32 adapters
            return completion_logprobs(model, *inputs, temperature=self.sampling.temperature, with_entropy=with_entropy,
                                       **self.engine_plan.logprob_options())  # fmt: skip

    def micro_batches(self, rollout: Rollout, rows: Tensor) -> list[Tensor]:
        """``rows`` in the micro-batches of a pass: ``micro_batch_size`` rows at a time, or packed to
        ``optim.micro_batch_tokens`` tokens each (:mod:`grpo_lightning.training.micro_batches`), as
        many on every device (the most any needs)."""
        budget = self.optim_options.micro_batch_tokens
        if budget is None:
            return list(rows.split(self.settings.micro_batch_size))
        at = rows.to(rollout.device)
        lengths = row_tokens(rollout.prompt_mask[at], rollout.attended_mask[at])
        return token_budget_split(rows, lengths, budget, -self.min_over_ranks(-fewest_micro_batches(lengths, budget)))

    def minibatches(self, num_groups: int) -> int:
        """Minibatches per epoch of a batch of ``num_groups`` prompts: ``num_groups x G / minibatch_size``."""
        return minibatches_per_epoch(num_groups, self.settings.group_size, self.settings.minibatch_size)

    def steps_left(self) -> float:
        """Optimizer steps the fit may still take: ``max_steps - global_step`` (unbounded without ``max_steps``)."""
        max_steps = self._trainer.max_steps if self._trainer is not None else -1
        return max_steps - self.global_step if max_steps > 0 else float("inf")

    def update(self, rollout: Rollout, advantages: Tensor, num_groups: int | None = None) -> None:
        """``ppo_epochs`` passes over the rollout; one policy step per minibatch, then ``after_policy_step``.

        Every update of a batch of ``num_groups`` prompts (the rollout's groups by default) makes the
        same ``ppo_epochs x minibatches(num_groups)`` optimizer steps, so that every run of the same
        settings validates, checkpoints and logs at the same steps: a rollout with fewer groups (DAPO's
        partial batch, groups left out by ``skip_group``) is split into as many smaller minibatches, and
        one without a row steps without a gradient. The update stops at ``max_steps``.
        """
        optimizer, scheduler = policy_part(self.optimizers()), policy_part(self.lr_schedulers())
        size, minibatches = len(rollout), self.minibatches(num_groups or rollout.num_groups)
        for _ in range(self.settings.ppo_epochs):
            order = torch.randperm(size) if self.needs_old_logprobs(minibatches) else torch.arange(size)
            for rows in order.tensor_split(minibatches):
                if self.steps_left() <= 0:
                    break
                if len(rows) == 0:
                    self.step_without_gradient(optimizer, scheduler)
                    continue
                optimizer.zero_grad(set_to_none=True)
                self.accumulate_gradients(rollout, advantages, rows)
                self.clip_and_log_gradient_norm(optimizer, rollout.prompts)
                optimizer.step()
                scheduler.step()
                self.policy_version += 1
                self.after_policy_step(rollout, rows)
        self.step_metrics.update("learning_rate", scheduler.get_last_lr()[0])

    def step_without_gradient(self, optimizer: Any, scheduler: Any) -> None:
        """An optimizer step that changes no weight: AdamW skips parameters without a gradient. It
        counts in ``global_step`` (Lightning counts ``optimizer.step()`` calls), and the scheduler follows."""
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        scheduler.step()

    def clip_and_log_gradient_norm(self, optimizer, prompts: Sequence[Any] = ()) -> None:
        """Clip the gradient to ``max_grad_norm`` and log its norm before clipping (``grad_norm``).

        Two gradients are dropped, so that the optimizer step moves no parameter (AdamW leaves a
        parameter without a gradient as it is, momentum and step count included):
        - a NaN or infinite norm (``skipped_steps``, and a warning naming the step's ``prompts``);
        - a norm of exactly zero (``frac_zero_gradient``): every advantage was zero and no term
          that does not depend on them (KL, an entropy bonus) was on. An optimizer step on a zero
          gradient would still move every weight by Adam's momentum from earlier steps, so a run
          whose steps mostly carry no signal would drift with nothing to learn from.
        """
        norm = clip_policy_gradients(self, optimizer, self.optim_options.max_grad_norm)
        if norm is not None:
            self.step_metrics.update("grad_norm", norm)
            finite = self.nonfinite.allows(norm, self.global_step, prompts)
            zero = bool(norm == 0)
            if zero or not finite:
                optimizer.zero_grad(set_to_none=True)
            self.step_metrics.update("frac_zero_gradient", float(zero))
            self.step_metrics.update("skipped_steps", float(self.nonfinite.skipped), reduce="max")

    def accumulate_gradients(self, rollout: Rollout, advantages: Tensor, rows: Tensor) -> None:
        """Backward of one minibatch: its ``extra_losses``, then the policy's loss micro-batch by micro-batch.

        The aggregation gets the minibatch-wide sequence and token counts (summed over devices),
        so the accumulated gradient does not depend on the micro-batch size. The extra losses go
        first: the policy's last backward pass is the one that averages gradients over devices.
        """
        self.backward_extra_losses(self.extra_losses(rollout, advantages, rows))
        num_sequences = len(rows)
        # DDP and FSDP average gradients over devices: normalise by the mean count per device.
        num_tokens = self.sum_over_ranks(self.loss_mask(rollout, rows).sum()) / self.num_processes
        derived = self.minibatch_derived(rollout, advantages, rows)
        total = torch.zeros((), device=num_tokens.device)
        micro_batches = self.micro_batches(rollout, rows)
        for index, micro_rows in enumerate(micro_batches):
            loss = self.micro_batch_loss(rollout, advantages, micro_rows, num_sequences, num_tokens, derived)
            with contextlib.nullcontext() if index == len(micro_batches) - 1 else self.no_gradient_sync():
                self.manual_backward(loss)
            total += loss.detach()
        self.step_metrics.update("loss", total)

    def backward_extra_losses(self, losses: Iterable[tuple[Tensor, dict[str, tuple[Any, Any]]]]) -> None:
        """Backward of each ``(loss, metrics)`` in turn (before the next is computed), without syncing
        gradients over devices; ``metrics``: ``name -> (value, weight)`` into the step's metrics."""
        for loss, metrics in losses:
            with self.no_gradient_sync():
                self.manual_backward(loss)
            for name, (value, weight) in metrics.items():
                self.step_metrics.update(name, value, weight)

    def loss_mask(self, rollout: Rollout, rows: Tensor, with_rejection: bool = True) -> Tensor:
        """``[len(rows), T]``: the tokens that carry loss; none of a truncated completion under
        ``mask_truncated_completions``, and (``with_rejection``) none a correction of
        :data:`~grpo_lightning.algorithms.rollout_correction.OUT_OF_MASK` rejected (``rollout.derived["rejection_keep"]``)."""
        mask = rollout.completion_mask[rows.to(rollout.completion_mask.device)]
        if self.loss_options.mask_truncated_completions:
            mask = mask * ~rollout.truncated[rows.to(mask.device)].unsqueeze(1)
        if with_rejection and "rejection_keep" in rollout.derived:
            mask = mask * rollout.derived["rejection_keep"][rows.to(mask.device)]
        return mask

    def no_gradient_sync(self) -> contextlib.AbstractContextManager:
        """Context for the backward passes of all but a minibatch's last micro-batch (:func:`grpo_lightning.runtime.strategies.no_gradient_sync`)."""
        return no_gradient_sync(self._trainer.strategy if self._trainer is not None else None)

    def micro_batch_loss(
        self, rollout: Rollout, advantages: Tensor, rows: Tensor, num_sequences: int, num_tokens: Tensor,
        minibatch_derived: dict[str, Tensor] | None = None,
    ) -> Tensor:  # fmt: skip
        """This micro-batch's share of the minibatch loss: ``aggregate(token_loss + beta * kl)`` (the KL as
        the ``kl.placement`` adds it to the loss: :meth:`~grpo_lightning.algorithms.kl.KLPlacement.add_to_loss`).
        ``minibatch_derived``: the tensors ``minibatch_derived`` chose for its minibatch."""
        micro = MicroBatch.of(rollout, advantages, rows, self.loss_mask(rollout, rows), num_sequences, num_tokens,
                              minibatch_derived)  # fmt: skip
        mask, tokens = micro.mask, micro.mask.sum()
        logp, entropy = self._forward(self.policy, rollout, micro.rows)
        old_logp = self.old_logprobs(micro, logp)
        loss = self.token_loss(logp, old_logp, micro.advantages, mask, micro=micro)
        if self.coefficients.entropy_coef:  # its gradient raises each loss token's entropy
            loss = loss + self.coefficients.entropy_coef * entropy_bonus(logp, old_logp)
        if micro.sampling_logp is not None:  # the engine's log-probs against this pass's
            # bypass: old = rollout, so the ratio above is pi_theta / pi_rollout, the importance weight itself;
            # the correction compares the current policy with the sampler's and adds only its rejection
            bypass = self.sampling_options.old_logprobs == "bypass"
            seen = self.loss_mask(rollout, micro.rows, with_rejection=False)  # the mismatch of every loss token
            loss = correct_policy_loss(loss, logp if bypass else old_logp, micro.sampling_logp, seen,
                                       self.settings.rollout_correction, self.step_metrics,
                                       micro.derived.get("correction_weights"), logp, keep_only=bypass)  # fmt: skip
        if self.loss_options.top_entropy_quantile < 1:
            loss = loss * functional.top_entropy_mask(entropy, mask, self.loss_options.top_entropy_quantile)
        if micro.ref_logp is not None:
            kl = functional.kl_estimate(logp, micro.ref_logp, self.settings.kl_estimator)
            if self.kl_options.unbiased:
                kl = kl * torch.exp(logp - old_logp)
            loss = KL_PLACEMENTS[self.settings.kl_placement].add_to_loss(loss, kl, self.coefficients.beta)
            self.step_metrics.update("kl", functional.masked_mean(kl.detach(), mask), tokens)
        self.step_metrics.update("entropy", functional.masked_mean(entropy, mask), tokens)
        return self.aggregate(loss, mask, num_sequences=micro.num_sequences, num_tokens=micro.num_tokens)
