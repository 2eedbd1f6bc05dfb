"""Before any cell runs, a sweep warns of arms that differ in their clipping where every cell takes
one optimizer step per rollout: the importance ratio stays 1 and no clip bound acts."""

from __future__ import annotations

import logging

import pytest

from grpo_lightning.ablation import sweep as ablate
from grpo_lightning.ablation.spec import SweepSpec

BASE = ["configs/trainer/cpu.yaml", "configs/data/arithmetic.yaml", "configs/model/tiny.yaml"]  # 16 prompts x 8
WARNER = "grpo_lightning.ablation.inert_clipping"


def warnings_of_check(tmp_path, caplog, variants=("cispo", "dppo"), optim=None, **changes) -> list[str]:
    """The inert-clipping warnings the sweep's check logs for a spec of ``variants`` with ``optim`` settings."""
    args = {f"model.optim.{key}": value for key, value in (optim or {}).items()}
    spec = {"output_dir": str(tmp_path / "sweep"), "base_configs": BASE, "variants": list(variants), "seeds": [0, 1],
            "model": "/m", "args": args, **changes}  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=WARNER):
        ablate.check_sweep(SweepSpec.from_dict(spec), SweepSpec.from_dict(spec).cells())
    return [record.getMessage() for record in caplog.records if record.name == WARNER]


def test_arms_that_differ_only_in_their_clipping_at_one_step_per_rollout_are_warned_of(tmp_path, caplog):
    (message,) = warnings_of_check(tmp_path, caplog, optim={"minibatch_size": 128})
    assert message.startswith("arms cispo, dppo differ in their clip settings, but every cell takes one optimizer step "
                              "per rollout (optim.minibatch_size 128 = 16 prompts x 8 completions, ppo_epochs 1)")  # fmt: skip
    assert "set optim.minibatch_size below prompts x group_size" in message and "ppo_epochs > 1" in message
    overrides = {"overrides": {"model.loss.clip_eps_high": [0.2, 0.28]}}  # one class, two clip-higher arms
    (message,) = warnings_of_check(tmp_path, caplog, variants=["grpo"], **overrides)
    assert "arms grpo-clip_eps_high0.2, grpo-clip_eps_high0.28 differ" in message
    assert "(optim.minibatch_size null (the whole rollout: 16 prompts x 8 completions), ppo_epochs 1)" in message


@pytest.mark.parametrize(
    "optim",
    [{"minibatch_size": 64, "micro_batch_size": 32}, {"ppo_epochs": 2}],
    ids=["minibatch below the rollout", "two epochs"],
)
def test_cells_that_step_several_times_per_rollout_are_not_warned_of(optim, tmp_path, caplog):
    assert warnings_of_check(tmp_path, caplog, optim=optim) == []


def test_arms_that_clip_alike_are_not_warned_of(tmp_path, caplog):
    assert warnings_of_check(tmp_path, caplog, variants=["grpo", "dr_grpo"]) == []


def test_old_log_probs_from_the_sampler_let_the_ratio_leave_1(tmp_path, caplog):
    assert warnings_of_check(tmp_path, caplog, args={"model.sampling.old_logprobs": "bypass"}) == []
