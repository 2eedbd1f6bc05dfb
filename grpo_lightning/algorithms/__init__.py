"""The parts an algorithm is composed of, registered by name: advantage estimators and loss
aggregations. A variant names its own (``default_advantage``, ``default_aggregation``); a run picks
others with ``--model.advantage NAME`` and ``--model.aggregation NAME``."""

from grpo_lightning.algorithms.advantages import ADVANTAGES
from grpo_lightning.algorithms.aggregations import AGGREGATIONS
from grpo_lightning.algorithms.parts import check_part, resolve_parts

__all__ = ["ADVANTAGES", "AGGREGATIONS", "check_part", "resolve_parts"]
