"""AdamW that keeps the updates bf16 weights cannot hold.

A bf16 weight keeps 8 significant bits: an update below half a unit of its last place rounds to
nothing. AdamW moves each weight by about the learning rate, so at 1e-6 (GRPO's usual) a weight of
magnitude above ~2.6e-4 never changes, and at SmolLM2's 2e-5 one above ~5e-3: nearly every weight
of a pretrained model. ``policy.dtype: auto`` loads most hub checkpoints in bf16, and
``torch.optim.AdamW`` updates them in place, so such a fit trains a small part of the model
without saying so.

:class:`CompensatedAdamW` computes each update of a bf16 or fp16 weight in float32 and keeps what
rounding dropped in a compensation buffer of the weight's dtype, added back at the next step (Kahan
summation; Zamirai et al. 2020, "Revisiting BFloat16 Training"). The weight plus its
compensation holds about 16 significant bits, for 2 more bytes per weight; float32 master weights
would cost 4. float32 weights take ``torch.optim.AdamW``'s own (fused) step unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

#: Dtypes whose weights take the compensated update.
LOW_PRECISION = (torch.bfloat16, torch.float16)
#: Elements per float32 chunk of one weight's update, so a large embedding needs no full-size
#: float32 temporaries.
CHUNK = 1 << 24


class CompensatedAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (decoupled weight decay, Loshchilov & Hutter 2019, Alg. 2) whose bf16
    and fp16 weights get a float32 update with Kahan-compensated rounding; the state keeps AdamW's
    ``step``, ``exp_avg`` and ``exp_avg_sq`` (in the weight's dtype) and adds ``compensation``, so a
    checkpoint of either optimizer loads into the other."""

    def __init__(self, params: Iterable, **kwargs) -> None:
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            if group["amsgrad"] or group["maximize"] or group.get("differentiable"):
                raise ValueError("CompensatedAdamW: amsgrad, maximize and differentiable are not supported.")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        held = []  # low-precision weights' gradients, hidden from the float32 step
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.dtype in LOW_PRECISION:
                    held.append((group, p, p.grad))
                    p.grad = None
        try:
            super().step()
        finally:
            for _, p, grad in held:
                p.grad = grad
        for group, p, grad in held:
            self._compensated_step(p, grad, group)
        return loss

    def _compensated_step(self, p: Tensor, grad: Tensor, group: dict) -> None:
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if "compensation" not in state:  # also a state loaded from torch.optim.AdamW
            state["compensation"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if state["step"].device.type != "cpu":  # loaded as the fused step keeps it: read without a device sync
            state["step"] = state["step"].cpu()
        state["step"] += 1
        step = float(state["step"])
        beta1, beta2 = group["betas"]
        lr = float(group["lr"])
        step_size = lr / (1 - beta1**step)
        bias_correction2_sqrt = math.sqrt(1 - beta2**step)
        tensors = tuple(local(t) for t in (p, grad, state["exp_avg"], state["exp_avg_sq"], state["compensation"]))
        for chunk in chunks(tensors):
            adamw_chunk(*chunk, beta1, beta2, group["eps"], lr * group["weight_decay"], step_size, bias_correction2_sqrt)


def local(tensor: Tensor) -> Tensor:
    """This process's shard of a ``DTensor`` (sharded alike, the update is elementwise), else ``tensor``."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def chunks(tensors: tuple[Tensor, ...]) -> list[tuple[Tensor, ...]]:
    """The tensors (of one shape) as views of at most :data:`CHUNK` elements each, taken alike from
    each; whole where one of them is not contiguous."""
    if tensors[0].numel() <= CHUNK or not all(t.is_contiguous() for t in tensors):
        return [tensors]
    return list(zip(*(t.view(-1).split(CHUNK) for t in tensors)))


def adamw_chunk(p, grad, exp_avg, exp_avg_sq, compensation, beta1, beta2, eps, decay, step_size, bias_correction2_sqrt):
    """One AdamW update of ``p`` in float32, written back with Kahan compensation:
    ``w = p + c``; ``w <- w (1 - lr wd) - step_size m / (sqrt(v) / sqrt(bc2) + eps)``;
    ``p <- round(w)``; ``c <- w - p``."""
    g = grad.float()
    m = exp_avg.float().lerp_(g, 1 - beta1)
    v = exp_avg_sq.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    exact = p.float().add_(compensation.float())
    exact.mul_(1 - decay).addcdiv_(m, v.sqrt_().div_(bias_correction2_sqrt).add_(eps), value=-step_size)
    p.copy_(exact)
    compensation.copy_(exact.sub_(p.float()))


def adamw(parameters: list[Tensor], learning_rate: float, weight_decay: float, trained: str = "the policy's") -> torch.optim.Optimizer:
    """An AdamW for ``parameters``: :class:`CompensatedAdamW` where one is bf16 or fp16 (said once),
    else ``torch.optim.AdamW``; fused (one kernel for all float32 weights) on CPU and CUDA."""
    fused = True if all(p.device.type in ("cuda", "cpu") for p in parameters) else None
    low = [p for p in parameters if p.dtype in LOW_PRECISION]
    if not low:
        return torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=weight_decay, fused=fused)
    count = sum(p.numel() for p in low)
    rank_zero_info(
        f"optimizer: {count / 1e6:.1f}M of {trained} trained weights are {str(low[0].dtype).removeprefix('torch.')}: AdamW updates "
        f"them in float32 and keeps what rounding drops (Kahan compensation, 2 bytes per weight), so updates "
        f"smaller than their precision add up instead of vanishing. Float32 weights (--model.policy.dtype float32, "
        f"with --model.sampling.dtype bfloat16 for the rollouts) need none."
    )
    return CompensatedAdamW(parameters, lr=learning_rate, weight_decay=weight_decay, fused=fused)
