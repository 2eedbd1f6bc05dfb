"""Our GRPO, Dr. GRPO and DAPO presets as TRL's ``GRPOConfig`` runs them (``parity.py``'s TRL side).

Our preset is built as the recipe configures it (no model is loaded: the option groups and parts
resolve as a fit resolves them) and :func:`trl_settings` maps what it resolved to TRL's settings.
What TRL 1.16 computes (``trl/trainer/grpo_trainer.py``), for ``N`` completions a step in
micro-batches of ``n``, ``GA = N / n`` accumulation steps and one optimizer step per generation
batch (``steps_per_generation = GA``, as ``smollm2.trl_config`` sets it); the Trainer adds up the
micro-batches' returns and divides no further (``loss_is_scaled_for_ga = True``)::

    loss_type   _compute_loss, per micro-batch                  over the step                 ours
    grpo        mean_i (sum_t l_it / |o_i|) / GA                1/N sum_i 1/|o_i| sum_t l_it  seq_mean_token_mean
    dr_grpo     sum_it l_it / (n L) / GA                        1/(N L) sum_it l_it           seq_mean_token_sum_norm
    dapo        sum_it l_it / num_items_in_batch                sum_it l_it / sum_i |o_i|     token_mean
    bnpo        sum_it l_it / sum_i |o_i| of the micro-batch    (ours' token_mean only at GA = 1: not mapped)

    l_it = -min(rho_it A_i, clip(rho_it, 1 - epsilon, 1 + epsilon_high) A_i) + beta w_it k3_it

``_compute_loss`` clips the ratio ``rho = pi / pi_old`` of each token and adds the k3 KL
``exp(ref - logp) - (ref - logp) - 1`` to each token's loss, weighted by ``w = rho`` under
``use_bias_correction_kl`` (ours' ``kl.unbiased``) and by 1 otherwise; ``num_items_in_batch``, the
loss tokens of the generation batch, is scaled by ``GA / steps_per_generation = 1``. The advantage
(``_generate_and_score_completions``) is ``r - mean_g(r)``, divided by ``std + 1e-4`` with the
unbiased std of the group (``scale_rewards="group"``) or of the batch (``"batch"``), or by nothing
(``"none"``): ours' ``group_std`` under ``rewards.scale`` group, batch or none, and ``group_mean`` is
``"none"``. ``mask_truncated_completions`` drops the completions that end without EOS from the loss
and from ``num_items_in_batch``, as ours does. TRL's defaults are not ours (``loss_type="dapo"``,
``use_bias_correction_kl=True``): :func:`trl_settings` sets every setting the match relies on.

DAPO's overlong reward shaping (eq. 13) is TRL's reward function ``trl.rewards.get_soft_overlong_punishment``
(lengths counted as ours, end of turn included), added with the weight of our ``overlong_penalty``:
:func:`trl_overlong`. DAPO's dynamic sampling (drop the groups of equal rewards, sample until the batch
is full) has no TRL setting: the matched arm runs our DAPO without it (:func:`matched_arguments`),
and :func:`ours_only` says so in the results.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import yaml

#: The presets both sides run: ``configs/variant/<name>.yaml``.
VARIANTS = ("grpo", "dr_grpo", "dapo")
#: Our aggregation -> TRL's ``loss_type`` that computes it over a step (the table above).
LOSS_TYPES = {"seq_mean_token_mean": "grpo", "seq_mean_token_sum_norm": "dr_grpo", "token_mean": "dapo"}
#: Our ``(advantage, rewards.scale)`` -> TRL's ``scale_rewards``.
SCALE_REWARDS = {("group_std", "group"): "group", ("group_std", "batch"): "batch", ("group_std", "none"): "none",
                 ("group_mean", "group"): "none"}  # fmt: skip
#: Our options that no TRL setting is mapped to here: each must hold the value that turns it off.
UNMAPPED = {"loss.delta": None, "loss.clip_ratio_c": None, "loss.off_policy_mask_threshold": None,
            "loss.entropy_coef": 0.0, "loss.top_entropy_quantile": 1.0, "sampling.correction": None,
            "rewards.aggregation": "sum_then_normalize", "optim.ppo_epochs": 1, "optim.minibatch_size": None}  # fmt: skip
#: TRL's counterparts of those, off (set, not left to TRL's defaults, which change between versions).
TRL_OFF = {"delta": None, "off_policy_mask_threshold": None, "entropy_coef": 0.0, "top_entropy_quantile": 1.0,
           "importance_sampling_level": "token", "multi_objective_aggregation": "sum_then_normalize"}  # fmt: skip
#: Our preset's arguments for what TRL lacks: name -> (the value that turns it off, what TRL lacks).
OURS_ONLY = {"dynamic_sampling": (False, "dynamic sampling (drop groups of equal rewards and sample until the "
                                         "batch is full): TRL's GRPOTrainer has none")}  # fmt: skip


def preset_class(variant: str) -> type:
    """The class of ``configs/variant/<variant>.yaml``."""
    from grpo_lightning.cli.resources import config_path

    class_path = yaml.safe_load(config_path(f"variant/{variant}").read_text())["model"]["class_path"]
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def resolve(variant: str, settings: dict[str, Any], **arguments: Any) -> Any:
    """Our preset ``variant`` as the recipe ``settings`` configure it, with ``arguments`` on top
    (e.g. :func:`matched_arguments`): built, not loaded."""
    init_args = {**settings["model"]["init_args"], **arguments}
    return preset_class(variant)(**init_args)


def matched_arguments(variant: str) -> dict[str, Any]:
    """The arguments that turn off, in our preset ``variant``, what TRL has no setting for (DAPO:
    ``dynamic_sampling=False``); none for a preset without such a part."""
    parameters = inspect.signature(preset_class(variant)).parameters
    return {name: off for name, (off, _) in OURS_ONLY.items() if name in parameters and parameters[name].default != off}


def ours_only(ours: Any) -> list[str]:
    """What ``ours`` runs that TRL's run of :func:`trl_settings` lacks, in words (none: a matched pair)."""
    return [why for name, (off, why) in OURS_ONLY.items() if getattr(ours, name, off) != off]


def trl_settings(ours: Any) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments for the algorithm our built preset ``ours`` runs: loss type,
    advantage scaling, clip range, KL coefficient and its ratio weighting, truncation mask, the reward
    weights (ours', and the overlong shaping's where :func:`trl_overlong` adds TRL's function), and
    :data:`TRL_OFF`. ``ValueError`` for a setting of ours that these cannot express."""
    values, settings = ours.option_values(), ours.settings
    for option, off in UNMAPPED.items():
        if values[option] != off:
            raise ValueError(f"{option}: {values[option]!r} has no TRL setting mapped here; set it to {off!r}.")
    if settings.surrogate != "ppo_clip":
        raise ValueError(f"loss.surrogate: TRL's clipped losses are ppo_clip's, not {settings.surrogate}'s.")
    if settings.aggregation not in LOSS_TYPES:
        raise ValueError(f"aggregation: {settings.aggregation} is no TRL loss_type; give one of {', '.join(LOSS_TYPES)}.")
    scale = SCALE_REWARDS.get((settings.advantage, ours.rewards_options.scale))
    if scale is None:
        raise ValueError(f"advantage: {settings.advantage} under rewards.scale {ours.rewards_options.scale} is no "
                         "TRL scale_rewards; give group_std (group, batch or none) or group_mean.")  # fmt: skip
    if ours.kl_options.beta and (settings.kl_placement, settings.kl_estimator) != ("loss", "k3"):
        raise ValueError(f"kl: TRL adds k3 to the loss; ours puts {settings.kl_estimator} in the {settings.kl_placement}.")
    overlong = trl_overlong(ours)
    return {
        **TRL_OFF,
        "loss_type": LOSS_TYPES[settings.aggregation],
        "scale_rewards": scale,
        "epsilon": settings.clip_eps_low,
        "epsilon_high": settings.clip_eps_high,
        "beta": ours.kl_options.beta,
        "use_bias_correction_kl": ours.kl_options.unbiased,
        "mask_truncated_completions": ours.loss_options.mask_truncated_completions,
        "reward_weights": [*ours.reward_weights.tolist(), *([overlong["weight"]] if overlong else [])],
    }


def trl_overlong(ours: Any) -> dict[str, Any] | None:
    """DAPO's overlong shaping of ``ours`` as TRL's reward function takes it: the arguments of
    ``trl.rewards.get_soft_overlong_punishment`` (its penalty reaches -1) and the weight that scales
    it to our ``overlong_penalty``; ``None`` where ours shapes no reward by length."""
    buffer, penalty = getattr(ours, "overlong_buffer", 0), getattr(ours, "overlong_penalty", 0.0)
    if not buffer or not penalty:
        return None
    return {"max_completion_len": ours.max_new_tokens, "soft_punish_cache": buffer, "weight": penalty}


def trl_reward_functions(ours: Any, task_rewards: list) -> list:
    """TRL's reward functions for ``ours``: ``task_rewards``, then the overlong shaping's where ours shapes."""
    overlong = trl_overlong(ours)
    if overlong is None:
        return list(task_rewards)
    from trl.rewards import get_soft_overlong_punishment

    return [*task_rewards, get_soft_overlong_punishment(overlong["max_completion_len"], overlong["soft_punish_cache"])]


def mapping(variant: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The record of ``variant``'s pair: our matched arm's arguments, TRL's settings and reward shaping,
    and what the full preset runs that TRL lacks."""
    matched = matched_arguments(variant)
    ours = resolve(variant, settings, **matched)
    return {"ours_arguments": matched, "trl": trl_settings(ours), "trl_overlong": trl_overlong(ours),
            "ours_only": ours_only(resolve(variant, settings))}  # fmt: skip
