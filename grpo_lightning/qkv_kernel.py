"""Deprecated alias of ``grpo_lightning.engine.kernels.qkv``, kept for one release."""

import importlib
import sys
import warnings

warnings.warn("grpo_lightning.qkv_kernel moved to grpo_lightning.engine.kernels.qkv", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("grpo_lightning.engine.kernels.qkv")
