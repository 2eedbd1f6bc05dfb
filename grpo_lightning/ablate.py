"""Deprecated alias of ``grpo_lightning.ablation``, kept for one release."""

import importlib
import sys
import warnings

warnings.warn("grpo_lightning.ablate moved to grpo_lightning.ablation", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("grpo_lightning.ablation")
