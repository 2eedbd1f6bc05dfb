"""AdamW with Kahan-compensated bf16 weights: hand-computed steps, the float32 AdamW it tracks,
chunking, the multi-tensor update against the per-weight one, checkpoints, and the module's choice of optimizer."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch

from grpo_lightning.runtime.optimization import compensated
from grpo_lightning.runtime.optimization.compensated import CompensatedAdamW, adamw
from grpo_lightning.variants import GRPO


def run(optimizer_class, start, grads, **kwargs):
    """The weight ``start`` after one step per gradient, and its optimizer."""
    p = torch.nn.Parameter(start.clone())
    optimizer = optimizer_class([p], **kwargs)
    for grad in grads:
        p.grad = grad.to(p.dtype)
        optimizer.step()
    return p, optimizer


def test_a_bf16_weight_moves_by_updates_below_its_precision_which_plain_adamw_drops():
    """By hand: a weight of 1.0, gradient 1.0, lr 1e-3: step 1 of AdamW is -lr * m_hat / (sqrt(v_hat) + eps)
    = -1e-3 each step. bf16's neighbours of 1.0 are 1 - 2^-8 and 1 + 2^-7, so 0.999 rounds back to 1.0 and plain
    AdamW never moves. Compensated: w = 1 - k e-3 after k steps, held as round(w) plus the rest;
    after 2 steps 0.998 < 0.998046875 (the midpoint) rounds to 0.99609375; after 10, 0.99 to 0.98828125."""
    start, grads = torch.tensor([1.0], dtype=torch.bfloat16), [torch.ones(1)] * 10
    plain, _ = run(torch.optim.AdamW, start, grads, lr=1e-3, weight_decay=0.0)
    assert plain.item() == 1.0
    for steps, rounded in ((1, 1.0), (2, 0.99609375), (10, 0.98828125)):
        p, optimizer = run(CompensatedAdamW, start, grads[:steps], lr=1e-3, weight_decay=0.0)
        compensation = optimizer.state[p]["compensation"]
        assert p.item() == rounded
        assert p.item() + compensation.item() == pytest.approx(1 - steps * 1e-3, abs=2e-5)


def test_weight_decay_and_bias_correction_follow_torch_adamw_in_float32():
    """From a start bf16 can hold, over 300 steps of noisy gradients with decay, the compensated
    weight (p + c) stays within 1% of the distance float32 AdamW moved (the moments are rounded to
    bf16 as AdamW's own are); plain bf16 AdamW misses most of that distance."""
    torch.manual_seed(0)
    start = (torch.randn(64, 32) * 0.05).bfloat16()
    grads = [torch.randn(64, 32) * 1e-3 + 5e-4 for _ in range(300)]
    settings = {"lr": 1e-5, "weight_decay": 0.1, "betas": (0.9, 0.99)}
    reference, _ = run(torch.optim.AdamW, start.float(), grads, **settings)
    plain, _ = run(torch.optim.AdamW, start, grads, **settings)
    p, optimizer = run(CompensatedAdamW, start, grads, **settings)
    held = p.detach().float() + optimizer.state[p]["compensation"].float()
    moved = (reference - start.float()).abs().mean()
    assert (held - reference).abs().mean() < 0.01 * moved
    assert (plain.float() - reference).abs().mean() > 0.5 * moved
    assert optimizer.state[p]["exp_avg"].dtype == torch.bfloat16


def test_float32_weights_take_torch_adamws_own_step_beside_bf16_ones():
    torch.manual_seed(1)
    w32, w16 = torch.randn(5, 3), torch.randn(4).bfloat16()
    params = [torch.nn.Parameter(w32.clone()), torch.nn.Parameter(w16.clone())]
    expected = torch.nn.Parameter(w32.clone())
    ours, theirs = CompensatedAdamW(params, lr=1e-2, weight_decay=0.1), torch.optim.AdamW([expected], lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        grad = torch.randn(5, 3)
        params[0].grad, expected.grad, params[1].grad = grad.clone(), grad.clone(), torch.randn(4).bfloat16()
        ours.step(), theirs.step()
    assert torch.equal(params[0], expected)
    assert "compensation" not in ours.state[params[0]] and "compensation" in ours.state[params[1]]
    assert params[1].grad is not None  # the gradient is given back after the step


def test_a_large_weight_is_updated_in_chunks_with_the_same_result(monkeypatch):
    torch.manual_seed(2)
    start, grads = torch.randn(10, 7).bfloat16(), [torch.randn(10, 7) for _ in range(3)]
    whole, _ = run(CompensatedAdamW, start, grads, lr=1e-3)
    monkeypatch.setattr(compensated, "CHUNK", 16)
    assert len(compensated.chunks((start, start))) == 5
    chunked, _ = run(CompensatedAdamW, start, grads, lr=1e-3)
    assert torch.equal(whole, chunked)


def per_weight(starts, grads, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """The weights and states after one step per list of gradients (None: no step for that weight), each weight
    updated alone by ``adamw_chunk``, as the optimizer did before its multi-tensor update."""
    params, states = [s.clone() for s in starts], [None] * len(starts)
    for step_grads in grads:
        for i, (p, grad) in enumerate(zip(params, step_grads)):
            if grad is None:
                continue
            if states[i] is None:
                states[i] = {"step": 0, **{k: torch.zeros_like(p) for k in ("exp_avg", "exp_avg_sq", "compensation")}}
            state = states[i]
            state["step"] += 1
            scalars = (betas[0], betas[1], eps, lr * weight_decay, lr / (1 - betas[0] ** state["step"]), math.sqrt(1 - betas[1] ** state["step"]))
            compensated.adamw_chunk(p, grad, state["exp_avg"], state["exp_avg_sq"], state["compensation"], *scalars)
    return params, states


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("late", [False, True])
def test_the_multi_tensor_update_matches_the_per_weight_one_bit_for_bit(monkeypatch, late, device):
    """bf16 and fp16 weights of several sizes, one not contiguous, with CHUNK at 16: buckets of up to 16 elements
    and, for the larger weights, the chunked path; with ``late``, one weight has no gradient in the
    first 2 steps, so it runs 2 steps behind (a step count of its own). Weights, moments and compensation after
    5 steps equal the per-weight update's (the same float32 kernels, on the weights' elements in one buffer)."""
    torch.manual_seed(5)
    monkeypatch.setattr(compensated, "CHUNK", 16)
    shapes = [(3,), (10, 7), (5, 4), (33,), (8, 8), (100,), (2, 3, 5), (1,), (6, 9), (12,)]
    starts = [torch.randn(shape).bfloat16().to(device) for shape in shapes]
    starts[8] = starts[8].t()  # not contiguous
    starts[9] = starts[9].half()
    grads = [[torch.randn(s.shape).to(device, s.dtype) for s in starts] for _ in range(5)]
    if late:
        grads[0][2] = grads[1][2] = None
    expected, states = per_weight(starts, grads, lr=1e-3, weight_decay=0.1)
    calls = []
    for name in ("adamw_bucket", "adamw_chunk"):
        update = getattr(compensated, name)
        monkeypatch.setattr(compensated, name, lambda *args, name=name, update=update: calls.append(name) or update(*args))
    params = [torch.nn.Parameter(s.clone()) for s in starts]
    optimizer = CompensatedAdamW(params, lr=1e-3, weight_decay=0.1)
    for step_grads in grads:
        for p, grad in zip(params, step_grads):
            p.grad = grad
        optimizer.step()
    assert set(calls) == {"adamw_bucket", "adamw_chunk"} and not params[8].is_contiguous()
    for p, want, state in zip(params, expected, states):
        assert torch.equal(p.detach(), want)
        got = optimizer.state[p]
        assert float(got["step"]) == state["step"] and got["step"].device.type == "cpu"
        for key in ("exp_avg", "exp_avg_sq", "compensation"):
            assert torch.equal(got[key], state[key]), key
    assert float(optimizer.state[params[2]]["step"]) == (3 if late else 5)


def test_a_checkpointed_state_resumes_exactly_and_a_plain_adamw_state_loads():
    torch.manual_seed(3)
    start, grads = torch.randn(6).bfloat16(), [torch.randn(6) for _ in range(6)]
    straight, _ = run(CompensatedAdamW, start, grads, lr=1e-4)
    p, first = run(CompensatedAdamW, start, grads[:3], lr=1e-4)
    resumed = torch.nn.Parameter(p.detach().clone())
    second = CompensatedAdamW([resumed], lr=1e-4)
    second.load_state_dict(first.state_dict())
    for grad in grads[3:]:
        resumed.grad = grad.bfloat16()
        second.step()
    assert torch.equal(resumed, straight)
    p, plain = run(torch.optim.AdamW, start, grads[:3], lr=1e-4)
    results = []
    for explicit_zeros in (False, True):  # a plain AdamW state starts the compensation at zero
        loaded = torch.nn.Parameter(p.detach().clone())
        compensated = CompensatedAdamW([loaded], lr=1e-4)
        state = copy.deepcopy(plain.state_dict())
        if explicit_zeros:
            state["state"][0] = {**state["state"][0], "compensation": torch.zeros_like(loaded)}
        compensated.load_state_dict(state)
        loaded.grad = grads[3].bfloat16()
        compensated.step()
        assert float(compensated.state[loaded]["step"]) == 4
        results.append(loaded.detach())
    assert torch.equal(*results)


def test_unsupported_adamw_settings_are_refused():
    with pytest.raises(ValueError, match="amsgrad"):
        CompensatedAdamW([torch.nn.Parameter(torch.zeros(2))], amsgrad=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_module_compensates_bf16_policy_weights_and_says_so(make_module, caplog, dtype):
    """The tiny policy loaded in bf16 (as ``policy.dtype: auto`` loads most hub checkpoints) gets
    :class:`CompensatedAdamW`; over 20 steps at lr 1e-5 most of its weights move, where plain AdamW
    moves few (float32 weights: ``torch.optim.AdamW`` itself)."""
    module = make_module(GRPO, policy={"dtype": dtype}, optim={"learning_rate": 1e-5})
    with caplog.at_level(logging.INFO):
        optimizer = module.configure_optimizers()["optimizer"]
    if dtype == "float32":
        assert type(optimizer) is torch.optim.AdamW and "Kahan" not in caplog.text
        return
    assert type(optimizer) is CompensatedAdamW and "Kahan compensation" in caplog.text
    params = [p for p in module.policy.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    plain_params = [torch.nn.Parameter(p.clone()) for p in start]
    plain = torch.optim.AdamW(plain_params, lr=1e-5)
    ids = torch.randint(0, module.policy.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(0))
    for _ in range(20):
        optimizer.zero_grad()
        module.policy(input_ids=ids).logits.float().pow(2).mean().backward()
        for p, q in zip(params, plain_params):
            q.grad = p.grad.clone()
        optimizer.step(), plain.step()
    moved = sum((p != s).sum().item() for p, s in zip(params, start)) / sum(s.numel() for s in start)
    plain_moved = sum((q != s).sum().item() for q, s in zip(plain_params, start)) / sum(s.numel() for s in start)
    assert moved > 0.5 and plain_moved < moved / 2, (moved, plain_moved)


def test_a_sharded_weight_is_updated_shard_by_shard_as_a_whole_one(tmp_path):
    """FSDP2's ``DTensor`` weights take the update a whole weight takes (a world of one here, over gloo)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    torch.manual_seed(4)
    start, grads = torch.randn(8, 3).bfloat16(), [torch.randn(8, 3) for _ in range(4)]
    whole, _ = run(CompensatedAdamW, start, grads, lr=1e-3, weight_decay=0.1)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        p = torch.nn.Parameter(distribute_tensor(start.clone(), mesh, [Shard(0)]))
        optimizer = CompensatedAdamW([p], lr=1e-3, weight_decay=0.1)
        for grad in grads:
            p.grad = distribute_tensor(grad.bfloat16(), mesh, [Shard(0)])
            optimizer.step()
        assert torch.equal(p.detach().full_tensor(), whole.detach())
    finally:
        dist.destroy_process_group()
