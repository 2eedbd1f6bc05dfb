"""The parts an algorithm is composed of, registered by name: advantage estimators, per-token
surrogates and loss aggregations. A variant names its own (``default_advantage``,
``default_surrogate``, ``default_aggregation``); a run picks others with ``--model.advantage NAME``,
``--model.loss.surrogate NAME`` and ``--model.aggregation NAME``."""

from grpo_lightning.algorithms.advantages import ADVANTAGES
from grpo_lightning.algorithms.aggregations import AGGREGATIONS
from grpo_lightning.algorithms.parts import check_part, resolve_parts, surrogate_clip
from grpo_lightning.algorithms.surrogates import SURROGATES

__all__ = ["ADVANTAGES", "AGGREGATIONS", "SURROGATES", "check_part", "resolve_parts", "surrogate_clip"]
