"""benchmarks/parity_trl.py: our GRPO, Dr. GRPO and DAPO presets as TRL's ``GRPOConfig`` settings, and
TRL's own loss code on those settings against ours on one hand-made step. TRL is not in the test
extra: without it these tests skip."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import hand_rollout

pytest.importorskip("trl")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark(name: str):
    """``benchmarks/<name>.py``, loaded once (``parity.py`` puts ``benchmarks/`` on the path for the others)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


parity = benchmark("parity")
parity_trl = benchmark("parity_trl")

#: What the parity recipe (configs/recipes/smollm2.yaml: beta 0, 16 new tokens) resolves to on TRL's side
#: (besides TRL's parts that ours keeps off: delta, entropy bonus, entropy mask, sequence-level ratios, ...).
RECIPE_TRL = {
    "grpo": {"loss_type": "grpo", "scale_rewards": "group", "epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.0,
             "use_bias_correction_kl": False, "mask_truncated_completions": False, "reward_weights": [1.0]},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none", "epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.0,
                "use_bias_correction_kl": False, "mask_truncated_completions": False, "reward_weights": [1.0]},
    # the accuracy reward, and TRL's soft overlong punishment at our overlong_penalty's weight
    "dapo": {"loss_type": "dapo", "scale_rewards": "group", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0,
             "use_bias_correction_kl": False, "mask_truncated_completions": False, "reward_weights": [1.0, 1.0]},
}  # fmt: skip


@pytest.mark.parametrize("variant", parity_trl.VARIANTS)
def test_the_recipe_s_presets_map_to_these_trl_settings(variant, tiny_model_dir):
    pair = parity_trl.mapping(variant, parity.task_settings(tiny_model_dir, [], "mul_3digit"))
    assert pair["trl"] == {**parity_trl.TRL_OFF, **RECIPE_TRL[variant]}
    if variant == "dapo":  # L_cache: 20% of the 16 new tokens
        assert pair["trl_overlong"] == {"max_completion_len": 16, "soft_punish_cache": 3, "weight": 1.0}
        assert pair["ours_arguments"] == {"dynamic_sampling": False}  # the matched arm
        assert len(pair["ours_only"]) == 1 and pair["ours_only"][0].startswith("dynamic sampling")  # the full preset
    else:
        assert pair["trl_overlong"] is None and pair["ours_arguments"] == {} and pair["ours_only"] == []


@pytest.mark.parametrize(
    ("variant", "overrides", "expected"),
    [
        ("grpo", {"rewards": {"scale": "batch"}}, {"scale_rewards": "batch"}),
        ("grpo", {"rewards": {"scale": "none"}}, {"scale_rewards": "none"}),
        ("grpo", {"aggregation": "token_mean"}, {"loss_type": "dapo"}),
        ("dr_grpo", {"loss": {"mask_truncated_completions": True}}, {"mask_truncated_completions": True}),
        ("dapo", {"loss": {"clip_eps_low": 0.1}, "kl": {"beta": 0.05}}, {"epsilon": 0.1, "beta": 0.05}),
        ("grpo", {"kl": {"unbiased": True}}, {"use_bias_correction_kl": True}),
        ("dapo", {"overlong_penalty": 0.5}, {"reward_weights": [1.0, 0.5]}),
        ("dapo", {"overlong_buffer": 0}, {"reward_weights": [1.0]}),  # no shaping: no TRL reward function for it
    ],
)
def test_an_option_changed_from_the_preset_changes_the_trl_setting_that_computes_it(
    variant, overrides, expected, tiny_model_dir
):
    ours = parity_trl.preset_class(variant)(model=tiny_model_dir, **overrides)
    settings = parity_trl.trl_settings(ours)
    assert {key: settings[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"loss": {"entropy_coef": 0.01}}, "loss.entropy_coef"),
        ({"optim": {"ppo_epochs": 2}}, "optim.ppo_epochs"),
        ({"aggregation": "seq_mean_token_sum"}, "aggregation: seq_mean_token_sum"),
        ({"advantage": "leave_one_out"}, "advantage: leave_one_out"),
        ({"kl": {"beta": 0.1, "placement": "reward"}}, "kl: TRL adds k3 to the loss"),
    ],
)
def test_a_setting_trl_cannot_express_is_refused_by_name(overrides, named, tiny_model_dir):
    ours = parity_trl.preset_class("grpo")(model=tiny_model_dir, **overrides)
    with pytest.raises(ValueError, match=named):
        parity_trl.trl_settings(ours)


def test_trl_s_overlong_punishment_at_the_mapped_weight_is_dapo_s_shaping(tiny_model_dir):
    ours = parity_trl.preset_class("dapo")(model=tiny_model_dir, sampling={"max_new_tokens": 10}, overlong_buffer=4,
                                           overlong_penalty=0.5)  # fmt: skip
    lengths = list(range(1, 11))
    shaped = ours.shape_rewards(torch.zeros(len(lengths)), hand_rollout(lengths, 10, group_size=2))
    _, punishment = parity_trl.trl_reward_functions(ours, [None])
    weight = parity_trl.trl_settings(ours)["reward_weights"][1]
    trl = [weight * r for r in punishment(completion_ids=[[7] * n for n in lengths])]
    torch.testing.assert_close(shaped, torch.tensor(trl, dtype=shaped.dtype))
    assert trl[:6] == [0.0] * 6 and trl[-1] == -0.5  # none up to L - L_cache, the whole penalty at L


# ------------------------------------------------------------------ one step on both sides

P, G, L, MICRO = 3, 4, 6, 4  # 3 prompts x 4 completions of up to 6 tokens, in 3 micro-batches of 4
LENGTHS = [6, 3, 5, 1, 6, 2, 6, 4, 2, 5, 6, 3]  # the 6s end without EOS: truncated
TASK_REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # the last group: all equal


def trl_advantages(rewards_per_func: torch.Tensor, weights: list[float], scale: str) -> torch.Tensor:
    """TRL 1.16's advantages, as ``_generate_and_score_completions`` computes them (trl/trainer/grpo_trainer.py,
    lines 2763-2788, ``multi_objective_aggregation="sum_then_normalize"``); its body is not callable alone."""
    from trl.trainer.utils import nanstd

    rewards = (rewards_per_func * torch.tensor(weights, dtype=rewards_per_func.dtype)).nansum(dim=1)
    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G)
    std = nanstd(rewards).expand_as(rewards) if scale == "batch" else nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
    advantages = rewards - mean
    return advantages if scale == "none" else advantages / (std + 1e-4)


def trl_trainer(ours, model_dir: str, tmp_path: Path):
    """A ``GRPOTrainer`` on the tiny model with ``ours``'s mapped settings (built by its own ``__init__``), whose
    per-token log-probs are set by hand: ``trainer.logp`` (all rows, with its gradient) at ``trainer.rows``.
    Its ``_compute_loss`` (grpo_trainer.py lines 3020-3292) then runs as in training."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=MICRO,
                        gradient_accumulation_steps=P * G // MICRO, generation_batch_size=P * G, num_generations=G,
                        max_completion_length=L, **parity_trl.trl_settings(ours))  # fmt: skip
    rewards = parity_trl.trl_reward_functions(ours, [lambda completions, **kwargs: [0.0] * len(completions)])
    trainer = GRPOTrainer(model=model_dir, reward_funcs=rewards, args=config, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * P}))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = P * G // MICRO  # the Trainer's loop sets it per optimizer step
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (trainer.logp[trainer.rows],
                                                                          torch.zeros(MICRO, L, dtype=torch.float64), None)  # fmt: skip
    return trainer, rewards


CASES = {
    "grpo": ("grpo", {}),  # the preset's own KL: beta 0.04, k3 in the loss (TRL's default weighs it by the ratio)
    "grpo_unbiased_kl": ("grpo", {"kl": {"unbiased": True}}),  # ... as ours' kl.unbiased does
    "dr_grpo": ("dr_grpo", {}),
    "dapo": ("dapo", {}),  # with its overlong shaping, as TRL's reward function
    "grpo_batch_scale_truncation_masked": ("grpo", {"rewards": {"scale": "batch"}, "loss": {"mask_truncated_completions": True}}),
    "dapo_truncation_masked": ("dapo", {"loss": {"mask_truncated_completions": True}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trl_s_loss_on_the_mapped_settings_is_ours_in_value_and_gradient(case, tiny_model_dir, tmp_path):
    """One step of 12 completions in 3 micro-batches, from the same rewards and log-probs: the advantages
    (TRL's, as its code computes them, from its reward functions and weights), the step's loss (the sum
    of what ``_compute_loss`` returns per micro-batch: the Trainer divides it no further) and its gradient
    with respect to the log-probs are ours."""
    variant, overrides = CASES[case]
    ours = parity_trl.preset_class(variant)(model=tiny_model_dir, sampling={"group_size": G, "max_new_tokens": L},
                                            optim={"micro_batch_size": MICRO}, **parity_trl.matched_arguments(variant),
                                            **overrides)  # fmt: skip
    trainer, trl_rewards = trl_trainer(ours, tiny_model_dir, tmp_path)
    generator = torch.Generator().manual_seed(0)
    rollout = hand_rollout(LENGTHS, L, group_size=G)
    mask, truncated = rollout.completion_mask.double(), rollout.truncated
    logp = (-torch.rand(P * G, L, generator=generator, dtype=torch.float64) * 3).requires_grad_()
    old_logp = logp.detach() + 0.3 * torch.randn(P * G, L, generator=generator, dtype=torch.float64)  # ratios past both bounds
    ref_logp = logp.detach() + 0.5 * torch.randn(P * G, L, generator=generator, dtype=torch.float64)
    rollout.old_logp, rollout.ref_logp = old_logp, ref_logp if ours.coefficients.beta else None

    task = torch.tensor(TASK_REWARDS, dtype=torch.float64)
    advantages = ours.advantages(ours.shape_rewards(task, rollout).view(P, G), rollout).flatten()
    ids = [[7] * n for n in LENGTHS]
    per_func = torch.tensor([[r, *(f(completion_ids=[c])[0] for f in trl_rewards[1:])] for r, c in zip(TASK_REWARDS, ids)],
                            dtype=torch.float64)  # fmt: skip
    settings = parity_trl.trl_settings(ours)
    trl_adv = trl_advantages(per_func, settings["reward_weights"], settings["scale_rewards"])
    torch.testing.assert_close(advantages, trl_adv)

    ours._forward = lambda model, rollout, rows, with_entropy=True: (logp[rows], torch.zeros(len(rows), L, dtype=torch.float64))
    rows = torch.arange(P * G)
    tokens = ours.loss_mask(rollout, rows).sum()
    ours_loss = sum(ours.micro_batch_loss(rollout, advantages, micro, P * G, tokens) for micro in rows.split(MICRO))
    (ours_grad,) = torch.autograd.grad(ours_loss, logp)

    # TRL's loss mask: a truncated completion (last id neither EOS nor pad) masked out, and counted out of
    # num_items_in_batch (grpo_trainer.py lines 2487-2498)
    trl_mask = mask * (~truncated).unsqueeze(1) if settings["mask_truncated_completions"] else mask
    trl_loss = 0.0
    for micro in rows.split(MICRO):
        trainer.logp, trainer.rows = logp, micro
        inputs = {"prompt_ids": torch.ones(MICRO, 1, dtype=torch.long), "prompt_mask": torch.ones(MICRO, 1, dtype=torch.long),
                  "completion_ids": torch.full((MICRO, L), 7), "completion_mask": trl_mask[micro].long(),
                  "advantages": trl_adv[micro], "old_per_token_logps": old_logp[micro],
                  "ref_per_token_logps": ref_logp[micro], "num_items_in_batch": trl_mask.sum()}  # fmt: skip
        trl_loss = trl_loss + trainer._compute_loss(trainer.model, inputs)
    (trl_grad,) = torch.autograd.grad(trl_loss, logp)

    assert float(ours_loss) != 0.0 and bool((ours_grad != 0).any())
    torch.testing.assert_close(ours_loss, trl_loss)
    torch.testing.assert_close(ours_grad, trl_grad)
