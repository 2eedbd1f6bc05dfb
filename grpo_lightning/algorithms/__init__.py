"""The parts an algorithm is composed of, registered by name: advantage estimators, per-token
surrogates, loss aggregations and the KL's placements. A variant names its own (``default_advantage``,
``default_surrogate``, ``default_aggregation``, ``default_kl_placement``); a run picks others with
``--model.advantage NAME``, ``--model.loss.surrogate NAME``, ``--model.aggregation NAME`` and
``--model.kl.placement NAME``."""

from grpo_lightning.algorithms.advantages import ADVANTAGES
from grpo_lightning.algorithms.aggregations import AGGREGATIONS
from grpo_lightning.algorithms.kl import KL_PLACEMENTS
from grpo_lightning.algorithms.parts import check_part, resolve_parts, surrogate_clip
from grpo_lightning.algorithms.surrogates import SURROGATES

__all__ = ["ADVANTAGES", "AGGREGATIONS", "KL_PLACEMENTS", "SURROGATES", "check_part", "resolve_parts", "surrogate_clip"]
