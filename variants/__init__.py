"""The GRPO family, one file per paper. Each is a ``GroupPolicyOptimization`` subclass."""

from variants.cispo import CISPO
from variants.clip_cov import ClipCov
from variants.dapo import DAPO
from variants.dppo import DPPO
from variants.dr_grpo import DrGRPO
from variants.dro import DRO
from variants.gmpo import GMPO
from variants.gpg import GPG
from variants.grpo import GRPO
from variants.gspo import GSPO
from variants.kl_cov import KLCov
from variants.luspo import LUSPO
from variants.max_rl import MaxRL
from variants.on_policy_distillation import OnPolicyDistillation
from variants.online_dpo_grpo import OnlineDPOGRPO
from variants.ppo import PPO
from variants.process_grpo import ProcessGRPO
from variants.reinforce_plus_plus import ReinforcePlusPlus
from variants.rloo import RLOO
from variants.sapo import SAPO
from variants.vespo import VESPO

__all__ = [
    "CISPO", "ClipCov", "DAPO", "DPPO", "DRO", "DrGRPO", "GMPO", "GPG", "GRPO", "GSPO", "KLCov", "LUSPO", "MaxRL",
    "OnPolicyDistillation", "OnlineDPOGRPO", "ProcessGRPO", "PPO", "RLOO", "ReinforcePlusPlus", "SAPO", "VESPO",
]
