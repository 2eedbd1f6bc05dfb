"""The GRPO family, one file per paper. Each is a ``GroupPolicyOptimization`` subclass."""

from variants.dapo import DAPO
from variants.dr_grpo import DrGRPO
from variants.grpo import GRPO
from variants.gspo import GSPO
from variants.rloo import RLOO

__all__ = ["DAPO", "DrGRPO", "GRPO", "GSPO", "RLOO"]
