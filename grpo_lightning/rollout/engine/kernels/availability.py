"""Where the Triton kernels can run: on CUDA, or on any device under Triton's interpreter.

Triton is not a dependency of the package, so this module does not import it.
"""

from __future__ import annotations

import importlib
import os

import torch

TRITON_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Whether Triton kernels run on the CPU, interpreted (``TRITON_INTERPRET=1`` at import)."""


def kernels_run_on(device: torch.device) -> bool:
    """Whether a Triton kernel can run on ``device``: CUDA, or anywhere when interpreted."""
    return device.type == "cuda" or TRITON_INTERPRETED


def importable(module: str) -> bool:
    """Whether ``module`` imports (the kernel modules need the ``triton`` package)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
