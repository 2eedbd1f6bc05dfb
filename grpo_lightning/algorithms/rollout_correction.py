"""Rollout/training mismatch: the sampled tokens' log-probabilities as the rollout engine computed
them, ``log pi_rollout`` (the behaviour policy), against the training pass's, ``log pi_train`` (the
policy that sampled, recomputed, or the old/proximal policy of the update), and the correction of
the policy loss for it.

With ``rho_t = pi_train(y_t) / pi_rollout(y_t)``, the loss of token ``t`` is weighted by
(``sampling.correction``; its bounds are the options named beside each):

- ``token_truncate``: ``min(rho_t, C)`` (``correction_cap``), truncated importance sampling (TIS; Yao
  et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training");
- ``token_mask``: ``rho_t 1[rho_t <= C]``, masked importance sampling (MIS; Liu, Li et al. 2025, "When
  speed kills stability"; TRL's ``vllm_importance_sampling_mode="token_mask"``): the ratio below the
  cap, zero above it;
- ``sequence_truncate`` / ``sequence_mask``: the same with the completion's ratio ``rho = prod_t rho_t``
  (``min(rho, C)``, ``rho 1[rho <= C]``);
- ``icepop``: ``rho_t 1[alpha <= rho_t <= beta]`` (``correction_lower``/``_upper``, default
  [0.5, 5], as prime-rl's IcePop loss first shipped): IcePop (Ring-1T, arXiv 2510.18855), the
  ratio inside the band, zero outside;
- ``geo_rs``: ``1[lower <= exp(mean_t log rho_t) <= upper]`` for every token of the completion
  (default [0.999, 1.001]): verl's geometric rejection sampling. As verl's, it is chosen before the
  update from the old log-probs (:data:`OVER_ROLLOUT`), and a rejected completion leaves the loss
  mask (:data:`OUT_OF_MASK`): its tokens count in none of the loss's token counts, and carry no KL
  term;
- ``kpop``: ``1[max(KL_b(p_t || q_t), KL_b(q_t || p_t)) <= phi]`` (``correction_kl_threshold``,
  default 0.05, ours: no published default was found) with ``p_t = pi_train(y_t)``,
  ``q_t = pi_rollout(y_t)`` and the binary KL ``KL_b(p || q) = p log(p/q) + (1-p) log((1-p)/(1-q))``
  (``1-p`` as ``-expm1(log p)``, bounded below at the dtype's resolution: :func:`binary_kl`):
  AReaL's K-Pop mask;
- ``m2po``: ``1[(log rho_t)^2 < c]``, ``c`` the smallest squared log-ratio that the rollout's second
  moment ``mean_kept (log rho)^2 <= tau`` (``correction_second_moment``, default 0.04) cannot keep:
  M2PO (arXiv 2510.01161), which drops the tokens of largest ``(log rho)^2`` until the second
  moment of those kept is at most ``tau``. Taken over the whole rollout (each process's own under
  DDP), before the update (:data:`OVER_ROLLOUT`), so that the mask does not depend on the micro-batch size.

The update's old (proximal) log-probs, ``sampling.old_logprobs`` (:data:`OLD_LOGPROBS`): ``recompute``,
a forward pass before the update where it takes several steps; ``bypass``, the sampler's own
(``pi_old = pi_rollout``: verl's bypass mode, no pass); ``loglinear``, AReaL's approximation
(:func:`proximal_logprobs`, no pass). Under ``bypass`` the update's ratio ``pi_theta / pi_rollout`` is
already the importance weight, so a correction adds only its rejection (:func:`correction_keep`, of
the current policy against the sampler's: a token or completion it rejects weighs 0, one it keeps
1, as verl's bypass mode with the PPO loss); a correction that only truncates
(:data:`WEIGHT_ONLY`) has nothing left to add there and is refused (:func:`check_old_logprobs`).

Off by default: measured on W1 (benchmarks/RESULTS.md), both engines agree with the training pass
to about 0.01 nats per token (ratios within [0.95, 1.05]) in bf16, so a cap of 2 never binds there.

Metric names are TRL's (``sampling/sampling_logp_difference/*``, ``sampling/importance_sampling_ratio/*``),
with ``sampling/behaviour_kl`` (k3 estimate of ``KL(pi_rollout || pi_theta)``) and
``sampling/masked_fraction`` (share of loss tokens a correction gives weight 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from grpo_lightning.errors import ConfigError, require

#: Values of ``sampling.old_logprobs``: where the update's old (proximal) log-probs come from.
OLD_LOGPROBS = ("recompute", "bypass", "loglinear")
#: The corrections whose mask is chosen over the whole rollout, from its old log-probs.
OVER_ROLLOUT = ("m2po", "geo_rs")
#: The corrections whose rejected tokens leave the loss mask, as verl's rejection sampling removes them
#: from its response mask, rather than weigh 0 inside it (the others, as TRL, AReaL and IcePop's loss):
#: they are out of the loss's denominator, its KL term and the per-token metrics of the update.
OUT_OF_MASK = ("geo_rs",)
#: The corrections that only reweight (no token gets weight 0): refused under ``old_logprobs: bypass``.
WEIGHT_ONLY = ("token_truncate", "sequence_truncate")
#: The default cap of ``token_truncate``, ``token_mask``, ``sequence_truncate`` and ``sequence_mask``.
CAP = 2.0
#: The options that bound a correction (``sampling.<name>``); ``correction_cap`` is unset at :data:`CAP`.
BOUND_NAMES = ("correction_cap", "correction_lower", "correction_upper", "correction_kl_threshold", "correction_second_moment")


@dataclass(frozen=True)
class Correction:
    """A correction mode with its bounds (``None``: the mode's default of :data:`BOUNDS`)."""

    mode: str | None = None
    correction_cap: float | None = None
    correction_lower: float | None = None
    correction_upper: float | None = None
    correction_kl_threshold: float | None = None
    correction_second_moment: float | None = None

    def check(self) -> None:
        """Raise :class:`ConfigError` naming ``sampling.<field>`` for a mode or bound that cannot run."""
        require(self.mode is None or self.mode in CORRECTIONS,
                f"sampling.correction: {self.mode!r} is not one of {', '.join(CORRECTIONS)} or null (off).")  # fmt: skip
        cap = self.correction_cap
        require(cap is None or cap >= 1, f"sampling.correction_cap: must be >= 1 (got {cap}); e.g. 2.0.")
        require(self.mode is not None or cap in (None, CAP),
                "sampling.correction_cap: caps the weights of sampling.correction, which is off; set sampling.correction "
                "(e.g. token_truncate) or drop sampling.correction_cap.")  # fmt: skip
        reads = BOUNDS.get(self.mode, {})
        for name in BOUND_NAMES:
            if getattr(self, name) != (CAP if name == "correction_cap" else None) and name not in reads:
                users = ", ".join(mode for mode, bounds in BOUNDS.items() if name in bounds)
                raise ConfigError(f"sampling.{name}: bounds sampling.correction {users}, not {self.mode}; set "
                                  f"sampling.correction to one of them or drop sampling.{name}.")  # fmt: skip
        lower, upper = self.bound("correction_lower"), self.bound("correction_upper")
        require(lower is None or 0 <= lower <= 1,
                f"sampling.correction_lower: must be in [0, 1] (got {lower}); e.g. 0.5 for icepop.")  # fmt: skip
        require(upper is None or (upper >= 1 and upper > (lower or 0)),
                f"sampling.correction_upper: must be >= 1 and above correction_lower (got {upper}); e.g. 5.0.")  # fmt: skip
        for name, example in (("correction_kl_threshold", 0.05), ("correction_second_moment", 0.04)):
            value = self.bound(name)
            require(value is None or value > 0, f"sampling.{name}: must be > 0 (got {value}); e.g. {example}.")

    def bound(self, name: str) -> float | None:
        """The bound ``name`` as this mode reads it (its default where unset), ``None`` if it reads none."""
        value = getattr(self, name)
        return BOUNDS.get(self.mode, {}).get(name) if value is None else value

    @property
    def over_rollout(self) -> bool:
        return self.mode in OVER_ROLLOUT

    @property
    def out_of_mask(self) -> bool:
        return self.mode in OUT_OF_MASK

    def weights(self, train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, keep_only: bool = False) -> Tensor:
        """Weights ``[N, T]`` of the per-token policy loss (:func:`correction_weights`); ``keep_only``:
        its rejection alone, 0 or 1 (:func:`correction_keep`, under ``old_logprobs: bypass``)."""
        bounds = {name.removeprefix("correction_"): self.bound(name) for name in BOUNDS[self.mode]}
        if keep_only:
            return correction_keep(train_logp, sampling_logp, mask, self.mode, **bounds)
        return correction_weights(train_logp, sampling_logp, mask, self.mode, **bounds)


def importance_ratio(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """``rho`` ``[N, T]``: per token (``level="token"``), or the completion's product over its
    masked tokens broadcast to each of them (``"sequence"``); 1 outside ``mask``."""
    log_ratio = (train_logp.detach() - sampling_logp) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    return torch.where(mask > 0, log_ratio.exp(), torch.ones_like(log_ratio))


def geometric_ratio(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> Tensor:
    """``exp(mean_t log rho_t)`` over each completion's masked tokens, broadcast ``[N, T]`` (1 for none)."""
    log_ratio = (train_logp.detach() - sampling_logp) * mask
    mean = log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return mean.exp().expand_as(mask)


def binary_kl(logp: Tensor, logq: Tensor) -> Tensor:
    """``KL_b(p || q) = p log(p/q) + (1-p) log((1-p)/(1-q))`` of the Bernoulli distributions with
    ``p = exp(logp)``, ``q = exp(logq)``, elementwise (AReaL's K-Pop divergence).

    The complements are ``-expm1(log p)`` (exact near ``p = 1``, where ``1 - exp(log p)`` cancels),
    bounded below at the dtype's resolution ``eps``: a log-prob that rounds to exactly 0 says only that
    the complement is under about ``eps``, so two passes of a near-certain token that agree to
    ~1e-6 nats have a KL of that order, not ``+inf``. Finite everywhere; a token whose
    probabilities really differ keeps a large KL (``q = 1``, ``p = 0.5``: ``0.5 log(0.5 / eps)``)."""
    resolution = torch.finfo(logp.dtype).eps
    p = logp.exp()
    not_p = (-torch.expm1(logp)).clamp(min=resolution)
    not_q = (-torch.expm1(logq)).clamp(min=resolution)
    return p * (logp - logq) + not_p * (not_p.log() - not_q.log())


def second_moment_mask(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, tau: float) -> Tensor:
    """M2PO's keep-mask ``[N, T]`` over every masked token of the batch: sorted ascending, ``(log
    rho)^2`` keeps the longest prefix whose mean is ``<= tau`` (the running mean of sorted values
    never falls, so that prefix is where it stays under ``tau``); a token tied with the first one
    dropped is dropped too, so the kept set does not depend on the order of the rows."""
    squared = ((train_logp.detach() - sampling_logp) * mask) ** 2
    values = squared[mask > 0].sort().values
    running_mean = values.cumsum(0) / torch.arange(1, values.numel() + 1, device=values.device)
    kept = int((running_mean <= tau).sum())
    if kept == values.numel():
        return (mask > 0).to(mask.dtype)
    return ((squared < values[kept]) & (mask > 0)).to(mask.dtype)


def token_truncate(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, cap: float) -> Tensor:
    """TIS: ``min(rho_t, C)``."""
    return importance_ratio(train_logp, sampling_logp, mask, "token").clamp(max=cap)


def ratio_in_band(ratio: Tensor, lower: float | None, upper: float) -> Tensor:
    """``1[lower <= ratio <= upper]`` (no lower bound for ``None``), in ``ratio``'s dtype."""
    kept = ratio <= upper
    if lower is not None:
        kept = kept & (ratio >= lower)
    return kept.to(ratio.dtype)


def ratio_kept(ratio: Tensor, lower: float | None, upper: float) -> Tensor:
    """``ratio 1[lower <= ratio <= upper]``: zero outside the band (also where the ratio overflowed to ``inf``)."""
    return torch.where(ratio_in_band(ratio, lower, upper) > 0, ratio, torch.zeros_like(ratio))


def token_mask(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, cap: float) -> Tensor:
    """MIS (masked importance sampling; Liu, Li et al. 2025; TRL's ``token_mask``): ``rho_t 1[rho_t <= C]``,
    the ratio below the cap and zero above it."""
    return ratio_kept(importance_ratio(train_logp, sampling_logp, mask, "token"), None, cap)


def sequence_truncate(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, cap: float) -> Tensor:
    """``min(prod_t rho_t, C)`` for every token of the completion."""
    return importance_ratio(train_logp, sampling_logp, mask, "sequence").clamp(max=cap)


def sequence_mask(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Sequence-level MIS (TRL's ``sequence_mask``): ``rho 1[rho <= C]`` with ``rho = prod_t rho_t``,
    for every token of the completion."""
    return ratio_kept(importance_ratio(train_logp, sampling_logp, mask, "sequence"), None, cap)


def icepop(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, lower: float, upper: float) -> Tensor:
    """IcePop: ``rho_t 1[lower <= rho_t <= upper]``."""
    return ratio_kept(importance_ratio(train_logp, sampling_logp, mask, "token"), lower, upper)


def geo_rs(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, lower: float, upper: float) -> Tensor:
    """Geometric rejection: ``1[lower <= exp(mean_t log rho_t) <= upper]`` for every token of the completion."""
    ratio = geometric_ratio(train_logp, sampling_logp, mask)
    return ((ratio >= lower) & (ratio <= upper)).to(mask.dtype)


def kpop(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, kl_threshold: float) -> Tensor:
    """K-Pop: ``1[max(KL_b(p_t || q_t), KL_b(q_t || p_t)) <= phi]`` (:func:`binary_kl`)."""
    train = train_logp.detach()
    divergence = torch.maximum(binary_kl(train, sampling_logp), binary_kl(sampling_logp, train))
    return (divergence <= kl_threshold).to(mask.dtype)


def m2po(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, second_moment: float) -> Tensor:
    """M2PO: :func:`second_moment_mask` with ``tau`` = ``second_moment``, over the rows given."""
    return second_moment_mask(train_logp, sampling_logp, mask, second_moment)


#: ``sampling.correction`` -> (its weights ``[N, T]`` of ``(train_logp, sampling_logp, mask, **bounds)``,
#: the bounds' defaults by option name ``correction_<bound>``). Dispatch goes through it.
CORRECTION_PARTS: dict[str, tuple[Callable[..., Tensor], dict[str, float]]] = {
    "token_truncate": (token_truncate, {"correction_cap": CAP}),
    "token_mask": (token_mask, {"correction_cap": CAP}),
    "sequence_truncate": (sequence_truncate, {"correction_cap": CAP}),
    "sequence_mask": (sequence_mask, {"correction_cap": CAP}),
    "icepop": (icepop, {"correction_lower": 0.5, "correction_upper": 5.0}),
    "geo_rs": (geo_rs, {"correction_lower": 0.999, "correction_upper": 1.001}),
    "kpop": (kpop, {"correction_kl_threshold": 0.05}),
    "m2po": (m2po, {"correction_second_moment": 0.04}),
}
#: Values of ``sampling.correction`` besides ``None`` (off).
CORRECTIONS = tuple(CORRECTION_PARTS)
#: ``sampling.correction`` -> its rejection alone ``[N, T]`` (1 kept, 0 rejected) of ``(train_logp,
#: sampling_logp, mask, **bounds)``, without the ratio it weights the kept tokens by: what it adds
#: under ``old_logprobs: bypass``. Every correction but :data:`WEIGHT_ONLY`.
KEEP_PARTS: dict[str, Callable[..., Tensor]] = {
    "token_mask": lambda t, s, m, cap: ratio_in_band(importance_ratio(t, s, m, "token"), None, cap),
    "sequence_mask": lambda t, s, m, cap: ratio_in_band(importance_ratio(t, s, m, "sequence"), None, cap),
    "icepop": lambda t, s, m, lower, upper: ratio_in_band(importance_ratio(t, s, m, "token"), lower, upper),
    "geo_rs": geo_rs,
    "kpop": kpop,
    "m2po": m2po,
}
#: Each correction's bound options and their defaults.
BOUNDS: dict[str, dict[str, float]] = {mode: defaults for mode, (_, defaults) in CORRECTION_PARTS.items()}


def correction_weights(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, mode: str, cap: float = CAP,
                       **bounds: float) -> Tensor:  # fmt: skip
    """Weights ``[N, T]`` of the per-token policy loss for ``mode`` (one of :data:`CORRECTIONS`), 1
    outside ``mask``; ``cap`` and ``bounds`` (``lower``, ``upper``, ``kl_threshold``, ``second_moment``)
    as the mode reads them, its defaults for those not given. ``m2po`` takes the rows given as its batch."""
    if mode not in CORRECTION_PARTS:
        raise ConfigError(f"sampling.correction: {mode!r} is not one of {', '.join(CORRECTIONS)} or null")
    function, defaults = CORRECTION_PARTS[mode]
    weights = function(train_logp, sampling_logp, mask, **mode_arguments(defaults, cap, bounds))
    return torch.where(mask > 0, weights, torch.ones_like(weights))  # 1 outside the mask, as the ratios


def mode_arguments(defaults: dict[str, float], cap: float, bounds: dict[str, float]) -> dict[str, float]:
    """The bounds a mode reads (``defaults``, by option name), as given in ``cap`` and ``bounds``, else their defaults."""
    given = {"cap": cap, **bounds}
    return {name.removeprefix("correction_"): given.get(name.removeprefix("correction_"), value)
            for name, value in defaults.items()}  # fmt: skip


def correction_keep(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, mode: str, cap: float = CAP,
                    **bounds: float) -> Tensor:  # fmt: skip
    """The rejection of ``mode`` alone ``[N, T]``: 0 where it rejects a token (or its completion), 1
    where it keeps it and outside ``mask``, no ratio (:data:`KEEP_PARTS`). The weights under
    ``old_logprobs: bypass``, whose update ratio ``pi_theta / pi_rollout`` is the importance weight
    already (verl's bypass mode with the PPO loss applies no IS weight, only its rejection masks).
    A mode of :data:`WEIGHT_ONLY` has none: :class:`ConfigError`."""
    if mode not in KEEP_PARTS:
        raise ConfigError(f"sampling.correction: {mode} only reweights and rejects nothing, so under "
                          "sampling.old_logprobs bypass it has nothing to add to the update's ratio")  # fmt: skip
    keep = KEEP_PARTS[mode](train_logp, sampling_logp, mask, **mode_arguments(BOUNDS[mode], cap, bounds))
    return torch.where(mask > 0, keep, torch.ones_like(keep))


def check_old_logprobs(correction: Correction, old_logprobs: str) -> None:
    """Raise :class:`ConfigError` for ``sampling.old_logprobs: bypass`` with a correction that only
    reweights (:data:`WEIGHT_ONLY`): under bypass the update's ratio is ``pi_theta / pi_rollout``
    already, and such a correction could only apply the importance weight a second time."""
    require(old_logprobs != "bypass" or correction.mode not in WEIGHT_ONLY,
            f"sampling.correction: {correction.mode} with sampling.old_logprobs bypass would weight each token by "
            "pi_theta / pi_rollout twice (the update's ratio is that importance weight already under bypass); set "
            "sampling.old_logprobs to recompute, or sampling.correction to a masking correction "
            f"({', '.join(mode for mode in KEEP_PARTS if mode not in OVER_ROLLOUT)}), which under bypass adds only its "
            "rejection.")  # fmt: skip


def mismatch_metrics(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> dict[str, tuple[Tensor, str]]:
    """``name -> (value, reduce)`` over the masked tokens: ``|log pi_train - log pi_rollout|`` (mean,
    max) and the token ratio ``rho_t`` (min, mean, max)."""
    kept = mask > 0
    difference = train_logp.detach() - sampling_logp
    ratio, gap, tokens = difference.exp(), difference.abs(), mask.sum()  # no host synchronisation
    return {
        "sampling/sampling_logp_difference/mean": ((gap * mask).sum() / tokens, "mean"),
        "sampling/sampling_logp_difference/max": (gap.masked_fill(~kept, float("-inf")).max(), "max"),
        "sampling/importance_sampling_ratio/min": (ratio.masked_fill(~kept, float("inf")).min(), "min"),
        "sampling/importance_sampling_ratio/mean": ((ratio * mask).sum() / tokens, "mean"),
        "sampling/importance_sampling_ratio/max": (ratio.masked_fill(~kept, float("-inf")).max(), "max"),
    }


def proximal_logprobs(
    logp: Tensor, sampling_logp: Tensor, sampling_version: Tensor, proximal_version: Tensor, version: int
) -> Tensor:
    """AReaL's log-linear proximal policy (decoupled PPO without its forward pass), per token::

        log pi_prox = log pi_behav + alpha (log pi_theta - log pi_behav),
        alpha = (v_prox - v_behav) / (v_theta - v_behav)        (1 where v_theta = v_behav)

    ``logp`` (``log pi_theta``, detached here), ``sampling_logp`` (``log pi_behav``) and
    ``sampling_version`` (``v_behav``, the policy version each token was sampled with) ``[N, T]``;
    ``proximal_version`` ``[N]``: the version the update started from; ``version``: the weights' of ``logp``."""
    span = version - sampling_version
    alpha = (proximal_version.unsqueeze(1) - sampling_version) / span.clamp(min=1)
    alpha = torch.where(span > 0, alpha.to(logp.dtype), torch.ones_like(logp))
    return sampling_logp + alpha * (logp.detach() - sampling_logp)


def behaviour_kl(logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of ``KL(pi_rollout || pi_theta)`` from the rollout's own samples: the mean over
    the masked tokens of ``rho - 1 - log rho``, ``rho = pi_theta / pi_rollout`` (Schulman's k3)."""
    log_ratio = (logp.detach() - sampling_logp) * mask
    return ((log_ratio.exp() - 1 - log_ratio) * mask).sum() / mask.sum().clamp(min=1)


def correct_policy_loss(
    loss: Tensor, train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, correction: Correction, metrics: Any,
    weights: Tensor | None = None, current_logp: Tensor | None = None, keep_only: bool = False,
) -> Tensor:  # fmt: skip
    """Log the mismatch (:func:`mismatch_metrics`, and :func:`behaviour_kl` of ``current_logp``,
    default ``train_logp``) into the step's ``metrics`` and return the per-token ``loss`` weighted for
    ``correction`` (unchanged when its mode is ``None``); ``weights``: those chosen over the whole
    rollout (:data:`OVER_ROLLOUT`), at these rows; ``keep_only``: the correction's rejection alone,
    no ratio (:func:`correction_keep`: ``old_logprobs: bypass``, whose update ratio is the importance weight)."""
    tokens = mask.sum()
    for name, (value, reduce) in mismatch_metrics(train_logp, sampling_logp, mask).items():
        metrics.update(name, value, tokens if reduce == "mean" else 1.0, reduce=reduce)
    current = train_logp if current_logp is None else current_logp
    metrics.update("sampling/behaviour_kl", behaviour_kl(current, sampling_logp, mask), tokens)
    if correction.mode is None or correction.out_of_mask:  # its rejection is in the loss mask already
        return loss
    if weights is None:
        weights = correction.weights(train_logp, sampling_logp, mask, keep_only)
    record_masked_fraction(metrics, weights, mask)
    return loss * weights


def record_masked_fraction(metrics: Any, weights: Tensor, mask: Tensor) -> None:
    """``sampling/masked_fraction`` into ``metrics``: the share of ``mask``'s tokens that ``weights`` gives weight 0."""
    tokens = mask.sum()
    metrics.update("sampling/masked_fraction", ((weights == 0) & (mask > 0)).sum() / tokens.clamp(min=1), tokens)
