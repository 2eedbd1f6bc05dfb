"""Every variant's loss and gradient on one fixed model and rollout, pinned to recorded values.

Refactors of the module, the variants and their parts (``grpo_lightning.algorithms``) must leave
these numbers as they are: the values below were recorded once from the code before the variants
became compositions of registered parts. A change to the math of a variant changes them on purpose,
and then they are recorded again.

The rollout is sampled from the tiny model under a fixed seed; its old and reference log-probs are
the policy's own plus a fixed perturbation, so that ratios leave 1 (clipping and gates act) and the
KL is not 0.
"""

from __future__ import annotations

import pytest
import torch

from grpo_lightning import variants
from grpo_lightning.algorithms import dpo
from tests.helpers import micro_batched_gradient

PROMPTS = ["1+1=", "2+3=", "7-4="]
ANSWERS = ["2", "5", "3"]
#: variant -> (loss, sum |A|, gradient sum, gradient norm), recorded from the code of 2026-11-28.
GOLDEN = {
    "CISPO": (0.3329049348831177, 9.13187026977539, -0.35579576236036004, 0.8870289015398732),
    "ClipCov": (-0.07953817397356033, 9.13187026977539, -0.9261063135066587, 0.7898159753683227),
    "DAPO": (0.02551206201314926, 9.13187026977539, -0.591299847590907, 0.9216462335),
    "DrGRPO": (-0.03354446962475777, 6.0, -0.41125088011155597, 0.46179875864710157),
    "OnPolicyDistillation": (-0.09172756224870682, 19.177532196044922, -0.06963698778178881, 0.06457509458622729),
    "GMPO": (0.03090481646358967, 9.13187026977539, 1.0274101027756863, 1.4552628615716034),
    "GRPO": (0.04563413932919502, 9.13187026977539, 0.5916239538991537, 1.4214665739612455),
    "GSPO": (0.05624600127339363, 9.13187026977539, 0.8538329386425989, 1.4170150890525461),
    "KLCov": (-0.07789790630340576, 9.13187026977539, -0.873672507806428, 0.7895942831385838),
    "OnlineDPOGRPO": (2.0857709534466267, 9.13187026977539, 0.5916239538991537, 1.4214665739612455),
    "ProcessGRPO": (-0.42590001225471497, 47.14988708496094, -0.2522275326074759, 0.9042255028664401),
    "PPO": (0.03539812192320824, 64.79403686523438, -0.6601632848365568, 0.8168804373351903),
    "RLOO": (-0.4247859716415405, 7.72747802734375, -4.0394229681811, 4.611307681969165),
    "ReinforcePlusPlus": (-0.062100838869810104, 9.63705062866211, -0.7222539427155859, 0.8124252922850915),
    "SAPO": (-0.009945725090801716, 9.13187026977539, 1.1753693497414548, 1.4552258291361186),
    # Presets added after the refactor, recorded when they were added.
    "DPPO": (0.3329049348831177, 9.13187026977539, -0.35579576236036004, 0.8870289015398732),
    "DRO": (2.7695562839508057, 9.13187026977539, -2.430599853305587, 5.858633886195627),
    "GPG": (0.22881066799163818, 7.200000286102295, -0.01355851027521393, 0.6621179168816074),
    "LUSPO": (-0.48833444714546204, 9.13187026977539, -4.730706637475469, 5.162435110543963),
    "MaxRL": (0.022317832335829735, 5.59999418258667, 0.6351886397981463, 0.9239044912570857),
    "VESPO": (0.9001140594482422, 9.13187026977539, -0.3391224851418517, 0.6500130438310082),
}


def perturbation(like: torch.Tensor, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 0.3 * torch.randn(like.shape, generator=generator, dtype=like.dtype)


def fingerprint(module, rollout) -> tuple[float, float, float, float]:
    """Loss, advantages and gradient of one update's micro-batches on ``rollout``."""
    logp = module.compute_logprobs(module.policy, rollout)
    rollout.old_logp = logp + perturbation(logp, 1)
    if module.needs_reference_model():
        rollout.ref_logp = logp + perturbation(logp, 2)
    rewards = module.shape_rewards(rollout.rewards, rollout)
    advantages = module.advantages(rewards.view(-1, rollout.group_size), rollout).flatten(0, 1)
    n = len(rollout)
    num_tokens = module.loss_mask(rollout, torch.arange(n)).sum()
    loss = sum(
        float(module.micro_batch_loss(rollout, advantages, rows, num_sequences=n, num_tokens=num_tokens).detach())
        for rows in torch.arange(n).split(n)
    )
    if isinstance(module, variants.OnlineDPOGRPO):  # its DPO term: the pairs' losses
        winners, losers = dpo.best_worst_pairs(rollout.rewards.view(-1, rollout.group_size))
        loss += float(module.pair_losses(rollout, winners, losers)[0].detach().sum())
    grads = micro_batched_gradient(module, rollout, advantages, [n], num_tokens)
    flat = torch.cat([g.flatten() for g in grads.values()]).double()
    return loss, float(advantages.abs().sum()), float(flat.sum()), float(flat.norm())


def alternating_steps(prompts, completions, token_ends, **columns):
    """A step per token, scored 0, 1, 0, ...: per-token advantages that are not all 0."""
    return [[(t, float(t % 2)) for t in range(len(ends))] for ends in token_ends]


def measure(make_module, make_rollout, name: str) -> tuple[float, float, float, float]:
    torch.manual_seed(0)
    kwargs = {"step_reward_func": alternating_steps} if name == "ProcessGRPO" else {}
    module = make_module(getattr(variants, name), optim={"micro_batch_size": 12}, **kwargs)
    rollout = make_rollout(module, PROMPTS, seed=0, answer=ANSWERS)
    return fingerprint(module, rollout)


@pytest.mark.parametrize("name", variants.__all__)
def test_variant_loss_and_gradient_are_unchanged(name, make_module, make_rollout, one_torch_thread):
    measured = measure(make_module, make_rollout, name)
    assert name in GOLDEN, f"no recorded values for {name}: {measured}"
    norm = GOLDEN[name][3]
    for label, got, want in zip(("loss", "sum |A|", "gradient sum", "gradient norm"), measured, GOLDEN[name]):
        # A signed sum's rounding (other torch builds, other CPUs) scales with its terms, not with the sum.
        tolerance = 1e-6 * norm if label == "gradient sum" else 1e-9
        assert got == pytest.approx(want, rel=1e-6, abs=tolerance), f"{name}: {label} {got!r} != recorded {want!r}"
