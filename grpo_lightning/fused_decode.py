"""Deprecated alias of ``grpo_lightning.engine.fused_decode``, kept for one release."""

import importlib
import sys
import warnings

warnings.warn("grpo_lightning.fused_decode moved to grpo_lightning.engine.fused_decode", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("grpo_lightning.engine.fused_decode")
