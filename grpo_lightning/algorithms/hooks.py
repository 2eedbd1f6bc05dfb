"""The algorithm hooks of :class:`~grpo_lightning.training.module.GroupPolicyOptimization`, and what each
does unless a variant overrides it: the registered parts the variant names
(:mod:`grpo_lightning.algorithms`), no selection and no reward shaping but the KL placement's; and
the parts a variant resolves its options to (:func:`resolve_parts`), each looked up in its registry."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.advantages import ADVANTAGES, TOKEN_STATISTICS_ADVANTAGES, TokenStatistics
from grpo_lightning.algorithms.aggregations import AGGREGATIONS
from grpo_lightning.algorithms.kl import KL_PLACEMENTS
from grpo_lightning.algorithms.masks import off_policy_sequence_mask
from grpo_lightning.algorithms.surrogates import SURROGATES
from grpo_lightning.errors import ConfigError
from grpo_lightning.runtime.metrics import StepMetrics

if TYPE_CHECKING:  # the step's types, passed through: the parts sit below the rollout wing
    from grpo_lightning.rollout.types import MicroBatch, Rollout


class AlgorithmHooks:
    """What one update computes, hook by hook (the step that calls them: ``GroupPolicyOptimization``).
    The hooks read the run's resolved settings, ``self.settings``, and the coefficients in use,
    ``self.coefficients`` (:mod:`grpo_lightning.training.run_settings`)."""

    #: Where the KL term goes unless ``kl.placement`` says: a name of :data:`~grpo_lightning.algorithms.kl.KL_PLACEMENTS`,
    #: ``"loss"``, or ``"reward"`` (RLOO), which ``shape_rewards`` applies, against the old log-probs.
    default_kl_placement: str = "loss"
    #: Placements its loop has no room for, with the reason: ``kl.placement`` set to one is a ``ConfigError``.
    refused_kl_placements: dict[str, str] = {}
    #: Options of the base module that this variant's equations leave no place for, with the reason:
    #: setting one is a :class:`ConfigError` naming both. The clip options its default surrogate
    #: does not read are added to those a class declares (``declared_inapplicable``). Options by their dotted name: ``loss.delta``, ``rewards.scale``..
    inapplicable_options: dict[str, str] = {}
    declared_inapplicable: dict[str, str] = {}
    #: The variant's advantage estimator, per-token surrogate and aggregation (names of the registries
    #: of :mod:`grpo_lightning.algorithms`), used when ``advantage`` / ``loss.surrogate`` / ``aggregation`` is ``None``.
    default_advantage: str | None = None
    default_surrogate: str = "ppo_clip"
    default_aggregation: str | None = None
    #: Whether its advantages are per token (``[P, G, T]``): a per-sequence surrogate cannot take them.
    token_advantages: bool = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("inapplicable_options")
        if own is not None:
            cls.declared_inapplicable = dict(own)
        cls.inapplicable_options = inapplicable_with(cls, None)

    def advantages(self, rewards: Tensor, rollout: Rollout | None = None) -> Tensor:
        """Advantage of each completion. ``rewards`` ``[P, G]`` -> ``[P, G]``, or ``[P, G, T]`` per token;
        ``rollout``: the step's, for advantages that ``shape_rewards`` put in ``rollout.derived`` (PPO's GAE).
        Here: the estimator named ``advantage`` (or the variant's ``default_advantage``), in its form
        for ``rewards.scale`` (:meth:`~grpo_lightning.algorithms.advantages.AdvantageRegistry.estimator`)."""
        if self.settings.advantage is None:
            raise NotImplementedError(f"{type(self).__name__} must name a default_advantage or implement advantages")
        estimator = ADVANTAGES.estimator(self.settings.advantage, self.rewards_options.scale)
        if self.needs_token_statistics():
            return estimator(rewards, token_statistics(rollout, rewards.shape))
        return estimator(rewards)

    def needs_token_statistics(self) -> bool:
        """Whether the advantage reads the completions' per-token statistics (OTB's ``sum_pi_squared``):
        the step then computes them in a forward pass of their own, into ``rollout.derived``."""
        return self.settings.advantage in TOKEN_STATISTICS_ADVANTAGES

    def token_loss(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, micro: MicroBatch | None = None
    ) -> Tensor:
        """Per-token policy loss ``[N, T]`` (no KL): the surrogate named ``loss.surrogate`` (or the
        variant's ``default_surrogate``) with the settings the run gives it (``settings.surrogate_options``),
        its token shares logged; then the off-policy sequence mask where
        ``loss.off_policy_mask_threshold`` is set. ``logp``, ``old_logp``, ``mask``: ``[N, T]``;
        ``advantages``: ``[N]`` or ``[N, T]``; ``micro``: the micro-batch they are of, in an update
        (its rows and ``derived`` tensors), ``None`` on tensors alone."""
        surrogate = SURROGATES[self.settings.surrogate]
        loss, shares = surrogate.loss(logp, old_logp, advantages, mask, **dict(self.settings.surrogate_options))
        record_token_shares(self.step_metrics, shares, mask)
        threshold = self.loss_options.off_policy_mask_threshold
        if threshold is not None:
            kept = off_policy_sequence_mask(logp, old_logp, advantages, mask, threshold)
            self.step_metrics.update("off_policy_mask/dropped", F.masked_mean(1 - kept, mask), mask.sum())
            loss = loss * kept
        return loss

    def aggregate(
        self, loss: Tensor, mask: Tensor, *, num_sequences: int | None = None, num_tokens: Tensor | None = None
    ) -> Tensor:
        """Reduce the per-token loss ``[N, T]`` to a scalar.

        ``num_sequences`` and ``num_tokens`` are the counts of the whole minibatch (all
        micro-batches, all devices): summing the micro-batch results must equal the result on the
        whole minibatch. When ``None`` they are taken from ``loss`` and ``mask``. Here: the
        aggregation named ``aggregation`` (or the variant's ``default_aggregation``).
        """
        if self.settings.aggregation is None:
            raise NotImplementedError(f"{type(self).__name__} must name a default_aggregation or implement aggregate")
        aggregation = AGGREGATIONS[self.settings.aggregation]
        return aggregation(loss, mask, num_sequences=num_sequences, num_tokens=num_tokens, max_tokens=self.max_new_tokens)

    def select(self, rollout: Rollout, num_groups: int | None = None) -> Rollout | None:
        """Groups to train on. Identity here; ``None`` ends the step without an update. ``num_groups``:
        the batch's groups, before any was left out (``rewards.execution.on_error: skip_group``)."""
        return rollout

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """Adjust the ``[N]`` rewards once log-probs are known; what later hooks read of this rollout
        (PPO's GAE, DPO's pairs) goes in ``rollout.derived``. Here: what the ``kl.placement`` does to the
        rewards (:meth:`~grpo_lightning.algorithms.kl.KLPlacement.shape_rewards`; ``"reward"``: the KL
        penalty); an override adds to ``super().shape_rewards`` unless it puts the KL in the reward
        itself (PPO's, per token)."""
        placement = KL_PLACEMENTS[self.settings.kl_placement]
        if not placement.in_reward or rollout.ref_logp is None:
            return rewards
        kl = F.kl_estimate(rollout.old_logp, rollout.ref_logp, self.settings.kl_estimator)
        rewards, penalty = placement.shape_rewards(rewards, kl, rollout.completion_mask, self.coefficients.beta)
        if penalty is not None:
            self.step_metrics.update("kl_penalty", penalty.mean())
        return rewards

    def minibatch_derived(self, rollout: Rollout, advantages: Tensor, rows: Tensor) -> dict[str, Tensor]:
        """Tensors ``[N, ...]`` that a rule computes once per minibatch ``rows``, before its micro-batches
        (Clip-Cov's token choice): each micro-batch finds its rows of them in ``micro.derived``. None here."""
        return {}

    def extra_losses(
        self, rollout: Rollout, advantages: Tensor, rows: Tensor
    ) -> Iterable[tuple[Tensor, dict[str, tuple[Any, Any]]]]:
        """Losses of the minibatch ``rows`` besides the policy's micro-batches (online DPO's pairs), as
        ``(loss, metrics)``, ``metrics``: ``name -> (value, weight)``. Each is backpropagated before the
        next is computed, all before the policy's micro-batches. None here."""
        return ()

    def after_policy_step(self, rollout: Rollout, rows: Tensor) -> None:
        """After each optimizer step of the policy, on its minibatch ``rows`` (PPO's critic step). Nothing here."""

    def needs_reference_model(self) -> bool:
        """Whether the frozen reference model is loaded and its log-probs computed: for the KL term
        (``beta > 0``, as it is now); a variant whose loss needs them otherwise (e.g. a DPO term) says so here."""
        return self.coefficients.beta > 0

    def needs_old_logprobs(self, minibatches: int) -> bool:
        """Old log-probs need a forward pass of their own unless the update makes one optimizer step
        (``minibatches`` per epoch, those of the batch: a rollout that lost groups still makes its
        batch's steps): then they equal the current log-probs (detached) and that pass is skipped."""
        return self.settings.ppo_epochs > 1 or minibatches > 1


def token_statistics(rollout: Rollout | None, groups: tuple[int, ...]) -> TokenStatistics:
    """The :class:`TokenStatistics` ``[P, G, T]`` of ``rollout`` (``groups``: ``(P, G)``) from its
    ``derived`` ``token_logp`` and ``sum_pi_squared``; the mask: the model's tokens."""
    if rollout is None or "sum_pi_squared" not in rollout.derived:
        raise ValueError("this advantage reads per-token statistics: pass the rollout whose derived tensors hold "
                         "token_logp and sum_pi_squared (the training step's compute_token_statistics).")
    shaped = (rollout.derived["token_logp"], rollout.derived["sum_pi_squared"], rollout.completion_mask)
    return TokenStatistics(*(tensor.view(*groups, -1) for tensor in shaped))


def record_token_shares(metrics: StepMetrics, shares: dict[str, Tensor], mask: Tensor) -> None:
    """Each ``name -> [N, T]`` of ``shares`` (flags or values, e.g. a surrogate's ``clip_ratio/*``)
    as its mean over the tokens of ``mask``, weighted by their count."""
    tokens = mask.sum()
    for name, values in shares.items():
        metrics.update(name, F.masked_mean(values.detach().float(), mask), tokens)


def inapplicable_with(variant: type, surrogate: str | None) -> dict[str, str]:
    """``option -> reason`` of the options ``variant`` has no place for with ``surrogate`` (``None``:
    its own): those it declares, and the clip options the surrogate does not read."""
    name = variant.default_surrogate if surrogate is None else surrogate
    part = SURROGATES.get(name)
    unused = part.unused_clip_options() if part is not None else {}
    if surrogate is not None:
        unused = {option: f"with the surrogate {name}, {reason}" for option, reason in unused.items()}
    return {**unused, **variant.declared_inapplicable}


def resolve_parts(variant: type, advantage: str | None, aggregation: str | None, scale_rewards: str,
                  surrogate: str | None = None) -> tuple:  # fmt: skip
    """``(advantage, aggregation, surrogate)``: the registered names of those given (a name, or an
    import path to a user's part: :meth:`~grpo_lightning.algorithms.parts.Registry.resolve`), or
    ``variant``'s ``default_*`` for ``None``. ``scale_rewards`` picks a form of the advantage (only
    ``group_std`` has others); a per-sequence surrogate needs one advantage per completion."""
    advantage, aggregation = ADVANTAGES.resolve(advantage), AGGREGATIONS.resolve(aggregation)
    surrogate = SURROGATES.resolve(surrogate)
    advantage = variant.default_advantage if advantage is None else advantage
    if advantage is not None and scale_rewards not in ADVANTAGES.scales(advantage):
        scaled = ", ".join(name for name in ADVANTAGES if len(ADVANTAGES.scales(name)) > 1)
        raise ConfigError(
            f"rewards.scale: sets the divisor of {scaled}'s advantages, and the advantage is {advantage}; "
            f"drop --model.rewards.scale, or set --model.advantage {scaled}."
        )
    chosen, surrogate = surrogate, variant.default_surrogate if surrogate is None else surrogate
    if SURROGATES[surrogate].per_sequence and (variant.token_advantages or advantage in TOKEN_STATISTICS_ADVANTAGES):
        per_token = ", ".join(name for name, part in SURROGATES.items() if not part.per_sequence)
        if chosen is None:  # the variant's own surrogate against the advantage this run names
            raise ConfigError(
                f"advantage: {advantage}'s advantages are per token, and {variant.__name__}'s surrogate {surrogate} "
                f"needs one per completion; set --model.loss.surrogate to one of {per_token}, or pick another advantage."
            )
        whose = advantage if advantage in TOKEN_STATISTICS_ADVANTAGES else f"{variant.__name__}'s"
        raise ConfigError(
            f"loss.surrogate: {surrogate} needs one advantage per completion, and {whose} are per token; "
            f"pick one of {per_token}."
        )
    return advantage, variant.default_aggregation if aggregation is None else aggregation, surrogate


def surrogate_clip(surrogate: str, loss: Any) -> tuple[float | None, float | None]:
    """``(clip_eps_low, clip_eps_high)`` of the ``loss`` options for ``surrogate``: a bound given as
    ``None`` is the surrogate's own (its paper's; CISPO's lower one: none)."""
    part = SURROGATES[surrogate]
    bounds = []
    for option in ("clip_eps_low", "clip_eps_high"):
        value = getattr(loss, option)
        if value is None and option in part.options():
            value = part.default(option)
        bounds.append(value)
    return bounds[0], bounds[1]
