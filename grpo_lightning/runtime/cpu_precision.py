"""bf16 on a CPU that only emulates it: said before a fit loads anything.

oneDNN runs bf16 matrix products natively on x86 CPUs with AVX-512 (and AMX); on one with AVX2 alone, PyTorch
falls back to a path that was measured 30-80x slower than fp32 for the products of a 135M model (a 2-core AMD
EPYC, torch 2.13), and the one-step SmolLM2 recipe test took 217 s in ``bf16-mixed`` against 47 s in
``32-true``. The setting is the user's to keep (an ablation of precisions must run what it says), so this warns.
"""

from __future__ import annotations

import platform
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

X86 = ("x86_64", "amd64", "i386", "i686")


def cpu_runs_bf16_natively() -> bool | None:
    """Whether oneDNN runs bf16 natively on this CPU; ``None`` where that cannot be told (not x86, or no probe)."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if platform.machine().lower() not in X86 or probe is None:
        return None
    return bool(probe())


def warn_emulated_bf16(trainer: Any) -> None:
    """Warn when ``trainer`` computes in bf16 on a CPU that emulates it, naming the fix."""
    precision = str(getattr(trainer, "precision", ""))
    device = getattr(getattr(trainer, "strategy", None), "root_device", None)
    if precision.startswith("bf16") and getattr(device, "type", None) == "cpu" and cpu_runs_bf16_natively() is False:
        rank_zero_warn(
            f"trainer.precision={precision} on a CPU without native bf16 (no AVX-512: oneDNN emulates bf16 "
            "products, measured 30-80x slower than fp32 on such a CPU): set --trainer.precision 32-true, unless "
            "bf16 itself is what this run compares."
        )
