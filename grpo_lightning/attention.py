"""Deprecated alias of ``grpo_lightning.engine.attention``, kept for one release."""

import importlib
import sys
import warnings

warnings.warn("grpo_lightning.attention moved to grpo_lightning.engine.attention", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("grpo_lightning.engine.attention")
