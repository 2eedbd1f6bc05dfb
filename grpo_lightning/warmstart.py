"""Deprecated alias of ``grpo_lightning.quickstart.warmstart``, kept for one release."""

import importlib
import sys
import warnings

warnings.warn("grpo_lightning.warmstart moved to grpo_lightning.quickstart.warmstart", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("grpo_lightning.quickstart.warmstart")
