"""Deprecated alias of ``grpo_lightning.quickstart.tiny``, kept for one release."""

import importlib
import sys
import warnings

warnings.warn("grpo_lightning.tiny moved to grpo_lightning.quickstart.tiny", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("grpo_lightning.quickstart.tiny")
