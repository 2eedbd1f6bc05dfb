"""The parts an algorithm is composed of, registered by name: advantage estimators, per-token
surrogates, loss aggregations and the KL's placements. A variant names its own (``default_advantage``,
``default_surrogate``, ``default_aggregation``, ``default_kl_placement``); a run picks others with
``--model.advantage NAME``, ``--model.loss.surrogate NAME``, ``--model.aggregation NAME`` and
``--model.kl.placement NAME``. A user's module registers its own with the ``register_*`` decorators,
and an option takes it by name or by import path (``--model.advantage my_module.my_advantage``)."""

from grpo_lightning.algorithms.advantages import ADVANTAGES, register_advantage
from grpo_lightning.algorithms.aggregations import AGGREGATIONS, register_aggregation
from grpo_lightning.algorithms.hooks import resolve_parts, surrogate_clip
from grpo_lightning.algorithms.kl import KL_PLACEMENTS, KLPlacement, register_kl_placement
from grpo_lightning.algorithms.surrogates import SURROGATES, register_surrogate

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "KL_PLACEMENTS", "SURROGATES", "KLPlacement", "register_advantage",
    "register_aggregation", "register_kl_placement", "register_surrogate", "resolve_parts", "surrogate_clip",
]  # fmt: skip
