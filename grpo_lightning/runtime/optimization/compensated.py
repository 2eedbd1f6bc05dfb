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
#: Most elements in a bucket of weights updated at once (:func:`adamw_bucket`) on the CPU, where kernels cost
#: little to start and its float32 buffers (16 bytes an element) had best stay in cache; elsewhere CHUNK
#: (few launches for many weights, 256 MiB of buffers: on an H200 a step over Qwen2.5-0.5B's 290 bf16 weights
#: took 26.8 ms against 47.1 one weight at a time; 25.4 with buckets four times larger, for 1 GiB).
CPU_BUCKET = 1 << 16


class CompensatedAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (decoupled weight decay, Loshchilov & Hutter 2019, Alg. 2) whose bf16
    and fp16 weights get a float32 update with Kahan-compensated rounding; the state keeps AdamW's
    ``step``, ``exp_avg`` and ``exp_avg_sq`` (in the weight's dtype) and adds ``compensation``, so a
    checkpoint of either optimizer loads into the other. Weights of one dtype, device and step count take
    one multi-tensor update (:func:`adamw_bucket`)."""

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
        sets: dict[tuple, list] = {}  # weights updated together: one group, device, dtype and step count
        for group, p, grad in held:
            state = self._state(p)
            tensors = tuple(local(t) for t in (p, grad, state["exp_avg"], state["exp_avg_sq"], state["compensation"]))
            key = (id(group), tensors[0].device, tensors[0].dtype, float(state["step"]))
            sets.setdefault(key, [group]).append(tensors)
        for (*_, step), (group, *weights) in sets.items():
            self._compensated_step(weights, group, step)
        return loss

    def _state(self, p: Tensor) -> dict:
        """``p``'s state, made or completed where new or loaded from ``torch.optim.AdamW``, its step counted."""
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
        return state

    def _compensated_step(self, weights: list[tuple[Tensor, ...]], group: dict, step: float) -> None:
        """Updates ``weights`` (each ``(p, grad, exp_avg, exp_avg_sq, compensation)``, of one device and step count)
        in buckets of at most :data:`CHUNK` (:data:`CPU_BUCKET`) elements; a larger weight alone, chunk by chunk."""
        limit = min(CHUNK, CPU_BUCKET) if weights[0][0].device.type == "cpu" else CHUNK
        beta1, beta2 = group["betas"]
        lr = float(group["lr"])
        scalars = (beta1, beta2, group["eps"], lr * group["weight_decay"], lr / (1 - beta1**step), math.sqrt(1 - beta2**step))
        bucket, size = [], 0
        for tensors in weights:
            numel = tensors[0].numel()
            if numel > limit:
                for chunk in chunks(tensors):
                    adamw_chunk(*chunk, *scalars)
                continue
            if size + numel > limit:
                adamw_bucket(bucket, *scalars)
                bucket, size = [], 0
            bucket.append(tensors)
            size += numel
        if bucket:
            adamw_bucket(bucket, *scalars)


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


def adamw_bucket(weights: list[tuple[Tensor, ...]], *scalars: float) -> None:
    """:func:`adamw_chunk` on several weights (of one dtype and device) at once, bit for bit: each of
    ``g``, ``m``, ``v``, ``exact`` is one float32 buffer for all of them, filled and written back by a
    multi-tensor copy (``torch._foreach_copy_``), and each step of the update is one kernel."""
    beta1, beta2, eps, decay, step_size, bias_correction2_sqrt = scalars
    p, grad, exp_avg, exp_avg_sq, compensation = (list(t) for t in zip(*weights))
    sizes = [t.numel() for t in p]
    flat = torch.empty(4, sum(sizes), dtype=torch.float32, device=p[0].device)
    g, m, v, exact = flat
    gs, ms, vs, exacts = ([part.view(t.shape) for part, t in zip(buffer.split(sizes), p)] for buffer in flat)
    torch._foreach_copy_(gs, grad)
    torch._foreach_copy_(ms, exp_avg)
    torch._foreach_copy_(vs, exp_avg_sq)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    torch._foreach_copy_(exp_avg, ms)
    torch._foreach_copy_(exp_avg_sq, vs)
    torch._foreach_copy_(exacts, p)
    torch._foreach_copy_(gs, compensation)  # g is spent: it holds the compensation, then the rounded weight
    exact.add_(g)
    exact.mul_(1 - decay).addcdiv_(m, v.sqrt_().div_(bias_correction2_sqrt).add_(eps), value=-step_size)
    torch._foreach_copy_(p, exacts)
    torch._foreach_copy_(gs, p)
    exact.sub_(g)
    torch._foreach_copy_(compensation, exacts)


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
