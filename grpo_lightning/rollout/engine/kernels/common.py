"""Triton helpers shared by the kernels: the matrix product and its precision setting."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in fp32; ``UPCAST`` multiplies in fp32 (Triton's interpreter computes
    bf16 products wrongly); on a GPU bf16 inputs go to the tensor cores as they are."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s ``input_precision`` for operands of ``dtype``: exact products for fp32 (bf16 and
    fp16 operands ignore it)."""
    return "ieee" if dtype == torch.float32 else "tf32"
