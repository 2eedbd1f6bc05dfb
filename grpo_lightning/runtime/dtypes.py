"""The dtypes a setting names (``policy.dtype``, ``sampling.dtype``), by their names."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
