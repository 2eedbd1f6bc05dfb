"""Evaluation: pass@k and maj@n against hand counts, their intervals, several validation sets,
and ``grpo-lightning validate`` on a checkpoint and on an exported model (real CLI, real Trainer)."""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler, SequentialSampler

from grpo_lightning.training.callbacks import last_checkpoint
from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.evaluation.validation import unpadded, vote
from grpo_lightning.evaluation.outcomes import outcomes_path, prompt_hash, read_outcomes
from grpo_lightning.checkpoints.export import export_checkpoint
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.evaluation.sample_metrics import (
    bootstrap_interval,
    majority_correct,
    pass_at_k,
    pass_k_values,
    prompt_metrics,
    summarize,
)
from grpo_lightning.errors import ConfigError

CONFIGS = config_dir()
ROOT = Path(__file__).resolve().parents[2]


def counted_pass_at_k(outcomes: list[int], k: int) -> float:
    """pass@k by enumeration: the share of the k-subsets of the samples holding a correct one."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("outcomes", [[0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 0, 1, 0], [1, 1, 1, 0, 1], [1] * 5])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_pass_at_k_equals_the_count_over_all_subsets(outcomes, k):
    estimate = pass_at_k(len(outcomes), torch.tensor([sum(outcomes)]), k)
    assert estimate.item() == pytest.approx(counted_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_hand_values():
    # n = 5: pass@2 = 1 - C(5 - c, 2) / C(5, 2) = 1 - C(5 - c, 2) / 10
    estimate = pass_at_k(5, torch.tensor([0, 1, 2, 4]), 2)
    assert estimate.tolist() == pytest.approx([0.0, 1 - 6 / 10, 1 - 3 / 10, 1.0])
    assert pass_at_k(5, torch.tensor([2]), 1).item() == pytest.approx(0.4)  # c / n
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, torch.tensor([1]), 5)


def test_reported_k_are_powers_of_two_and_n():
    assert pass_k_values(1) == [1]
    assert pass_k_values(4) == [1, 2, 4]
    assert pass_k_values(6) == [1, 2, 4, 6]


def test_majority_vote():
    assert majority_correct([3.0, 4.0, 3.0, None], [1, 0, 1, 0]) == 1.0
    assert majority_correct([4.0, 3.0, 3.0, 4.0], [0, 1, 1, 0]) == 0.0  # a tie goes to the answer seen first
    assert majority_correct([None, 7.0, None, None], [0, 1, 0, 0]) == 1.0  # no answer, no vote
    assert majority_correct([None, None], [0, 0]) == 0.0


def test_votes_agree_on_equal_numbers_and_on_text_up_to_case():
    assert vote("<answer>0.50</answer>") == vote("so it is .5") == 0.5
    assert vote("<answer>Paris</answer>") == vote("<answer> paris </answer>")
    assert vote("no answer here") is None


def test_bootstrap_interval_is_seeded_and_stays_in_the_range_of_the_data():
    values = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    low, high = bootstrap_interval(values)
    assert (low, high) == bootstrap_interval(values)
    assert 0.0 <= low < values.mean().item() < high <= 1.0
    assert bootstrap_interval(torch.full((10,), 0.25)) == pytest.approx((0.25, 0.25))
    assert all(math.isnan(v) for v in bootstrap_interval(torch.tensor([math.nan])))


def test_prompt_metrics_of_a_hand_made_table():
    # 3 prompts x 4 samples; the third prompt has no reference answer (accuracy does not apply).
    correct = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [math.nan] * 4])
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.5] * 4])
    lengths = torch.tensor([[2, 4, 2, 4], [1, 1, 1, 1], [3, 3, 3, 3]])
    votes = [3.0, 5.0, 3.0, 5.0, 6.0, 6.0, 6.0, 7.0, 1.0, 2.0, 3.0, 4.0]
    metrics = prompt_metrics(correct, rewards, lengths, votes)
    assert set(metrics) == {"accuracy", "reward", "mean_length", "pass@1", "pass@2", "pass@4", "maj@4"}
    assert metrics["accuracy"][:2].tolist() == [0.5, 0.25] and math.isnan(metrics["accuracy"][2])
    assert metrics["pass@2"][:2].tolist() == pytest.approx([1 - 1 / 6, 1 - 3 / 6])  # 1 - C(4-c, 2) / C(4, 2)
    assert metrics["pass@4"][:2].tolist() == [1.0, 1.0]
    assert metrics["maj@4"][:2].tolist() == [1.0, 0.0]  # 3 beats 5 (seen first); 6 (wrong) wins
    summary = summarize(metrics)
    assert summary["accuracy"] == pytest.approx(0.375) and summary["mean_length"] == pytest.approx((3 + 1 + 3) / 3)
    assert summary["accuracy_ci_low"] <= summary["accuracy"] <= summary["accuracy_ci_high"]


def test_the_summary_of_a_proportion_has_an_exact_binomial_interval_and_never_zero_width():
    summary = summarize({"accuracy": torch.zeros(100), "pass@4": torch.ones(50), "reward": torch.zeros(100)}, samples=4)
    assert (summary["accuracy_ci_low"], summary["accuracy_ci_high"]) == pytest.approx((0.0, 1 - 0.025 ** (1 / 100)))
    assert (summary["pass@4_ci_low"], summary["pass@4_ci_high"]) == pytest.approx((0.025 ** (1 / 50), 1.0))
    assert summary["reward_ci_low"] == summary["reward_ci_high"] == 0.0  # not a proportion: the bootstrap
    # scores outside [0, 1] under the name accuracy are not a proportion either
    summary = summarize({"accuracy": torch.tensor([2.0, 0.0, 2.0, 2.0])})
    assert 0.0 <= summary["accuracy_ci_low"] < summary["accuracy_ci_high"] <= 2.0


def test_partial_credit_leaves_pass_at_k_and_maj_out_with_a_warning():
    # partial credit (a game's 0.75): pass@k would count only the completions at 1, beside accuracy's mean score
    correct = torch.tensor([[0.75, 0.75, 0.5, 1.0]])
    with pytest.warns(UserWarning, match="evaluation.accuracy_func: scores other than 0 and 1 .e.g. 0.75."):
        metrics = prompt_metrics(correct, correct, torch.ones(1, 4), [1.0, 1.0, 2.0, 3.0])
    assert set(metrics) == {"accuracy", "reward", "mean_length"} and metrics["accuracy"].item() == 0.75


def test_a_completion_left_unscored_beside_scored_ones_counts_as_incorrect_with_a_warning():
    """A hard prompt whose function scored 3 of 4 completions (0) and not the fourth: left out of
    accuracy, it would lift it to 1.0; it counts, its fourth completion as incorrect (4 / 8 here)."""
    correct = torch.tensor([[0.0, 0.0, 0.0, math.nan], [1.0, 1.0, 1.0, 1.0], [math.nan] * 4])
    with pytest.warns(UserWarning, match=r"gave no score \(None or NaN\) to 1 completions of prompts whose other"):
        metrics = prompt_metrics(correct, correct.nan_to_num(), torch.ones(3, 4), [1.0] * 12)
    assert metrics["accuracy"][:2].tolist() == [0.0, 1.0] and math.isnan(metrics["accuracy"][2])  # no reference: out
    assert metrics["pass@4"][:2].tolist() == [0.0, 1.0] and summarize(metrics)["accuracy"] == 0.5


def test_equal_numbers_written_two_ways_vote_together_and_truncation_is_counted():
    # 1/3 twice and 0.3333333 twice (both score 1 against 1/3) against 0.5 three times: 4 votes to 3
    votes = [vote(f"<answer>{answer}</answer>") for answer in ["1/3", "1/3", "0.3333333", "0.3333333", "0.5", "0.5", "0.5"]]
    correct = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]])
    truncated = torch.tensor([[False, True, False, False, False, True, True]])
    metrics = prompt_metrics(correct, correct, torch.ones(1, 7), votes, truncated)
    assert metrics["maj@7"].item() == 1.0
    assert metrics["truncated_share"].item() == pytest.approx(3 / 7)


# ---------------------------------------------------------------- through the CLI


def arguments(model_dir: str, tmp_path, *extra: str) -> list[str]:
    return [
        "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
        "--config", str(CONFIGS / "variant/grpo.yaml"), "--config", str(CONFIGS / "model/tiny.yaml"),
        "--model.model", model_dir, "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
        "--data.max_val_samples", "6", "--data.val_batch_size", "3", "--model.evaluation.max_new_tokens", "4", *extra,
    ]  # fmt: skip


def test_greedy_validation_with_several_samples_is_a_config_error(tiny_model_dir):
    from grpo_lightning.variants import GRPO

    with pytest.raises(ConfigError, match="evaluation.samples.*evaluation.temperature 1.0"):
        GRPO(model=tiny_model_dir, evaluation={"samples": 4})
    with pytest.raises(ConfigError, match="evaluation.samples: must be at least 1"):
        GRPO(model=tiny_model_dir, evaluation={"samples": 0})


def test_validate_a_checkpoint_and_an_exported_model_with_pass_at_k_and_two_sets(tiny_model_dir, tmp_path, one_torch_thread):
    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    fit = GRPOLightningCLI(
        args=[
            "fit",
            *arguments(tiny_model_dir, tmp_path),
            "--trainer.max_steps",
            "1",
            "--model.sampling.max_new_tokens",
            "4",
            "--data.batch_size",
            "2",
            "--model.sampling.group_size",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--validate_before_fit",
            "false",
            "--trainer.val_check_interval",
            "1",
        ]
    )
    checkpoint = last_checkpoint(fit.trainer)
    assert checkpoint, "the fit saved no checkpoint"

    sampled = [
        "--model.evaluation.samples",
        "4",
        "--model.evaluation.temperature",
        "1.0",
        "--data.val_sets",
        json.dumps({"plus_one": str(extra)}),
    ]
    on_checkpoint = GRPOLightningCLI(args=["validate", *arguments(tiny_model_dir, tmp_path, *sampled), "--ckpt_path", checkpoint])
    metrics = on_checkpoint.trainer.callback_metrics
    for prefix in ("val/", "val/plus_one/"):
        for name in ("accuracy", "reward", "mean_length", "pass@1", "pass@2", "pass@4", "maj@4"):
            assert prefix + name in metrics and prefix + name + "_ci_high" in metrics, prefix + name
        for name in ("accuracy", "pass@2", "maj@4"):
            low, value, high = (float(metrics[prefix + name + s]) for s in ("_ci_low", "", "_ci_high"))
            assert 0.0 <= low <= value <= high <= 1.0, (prefix + name, low, value, high)
        assert float(metrics[prefix + "pass@1"]) == pytest.approx(float(metrics[prefix + "accuracy"]))
        assert float(metrics[prefix + "pass@1"]) <= float(metrics[prefix + "pass@2"]) <= float(metrics[prefix + "pass@4"])

    exported = tmp_path / "exported"
    export_checkpoint(checkpoint, exported)
    on_export = GRPOLightningCLI(args=["validate", *arguments(str(exported), tmp_path)])
    assert {"val/accuracy", "val/accuracy_ci_low", "val/mean_length"} <= set(on_export.trainer.callback_metrics)
    assert "val/pass@2" not in on_export.trainer.callback_metrics  # one greedy completion per prompt


def test_evaluation_sampling_overrides_samples_temperature_and_prefix(tiny_model_dir, tmp_path, one_torch_thread):
    cli = GRPOLightningCLI(args=arguments(tiny_model_dir, tmp_path), run=False)
    with cli.model.evaluation_sampling(samples=2, temperature=1.0, prefix="sampled"):
        metrics = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
    assert "sampled/pass@2" in metrics and "val/accuracy" not in metrics
    assert cli.model.val_samples == 1 and cli.model.val_sampling.temperature == 0.0
    with pytest.raises(ValueError, match="temperature > 0"), cli.model.evaluation_sampling(samples=2, temperature=0.0):
        pass


# --- several processes ---------------------------------------------------------------------------


def test_padding_a_distributed_sampler_adds_is_not_counted():
    """5 prompts on 2 processes: ``DistributedSampler`` deals 0, 2, 4 and 1, 3, 0 (a repeat)."""
    dataset = list(range(5))
    dealt = [list(DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=False)) for rank in (0, 1)]
    assert dealt == [[0, 2, 4], [1, 3, 0]]
    own = [unpadded(DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=False), 3) for rank in (0, 1)]
    assert [mask.tolist() for mask in own] == [[True, True, True], [True, True, False]]
    shuffled = [DistributedSampler(dataset, num_replicas=3, rank=rank, shuffle=True, seed=1) for rank in (0, 1, 2)]
    kept = [i for sampler in shuffled for i, keep in zip(sampler, unpadded(sampler, len(sampler))) if keep]
    assert sorted(kept) == dataset  # each prompt once, whatever the order
    assert unpadded(SequentialSampler(dataset), 5).all()


DDP_VALIDATION_REWARDS = """
def answer_is_one(prompts, completions, answer, **columns):
    return [float(a == "1") for a in answer]
"""

DDP_VALIDATE = """
import json, os, sys
import lightning as L
import torch
from grpo_lightning.data import PromptDataModule
from grpo_lightning.variants import GRPO

model_dir, data_dir, out = sys.argv[1:4]
trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=data_dir)
module = GRPO(model=model_dir, rewards={"funcs": ["ddp_validation_rewards.answer_is_one"]},
              sampling={"group_size": 2, "max_new_tokens": 2}, policy={"dtype": "float32"},
              evaluation={"accuracy_func": "ddp_validation_rewards.answer_is_one"})
data = PromptDataModule(path=os.path.join(data_dir, "train.jsonl"), val_path=os.path.join(data_dir, "val.jsonl"),
                        batch_size=1, val_batch_size=2)
(metrics,) = trainer.validate(module, datamodule=data)
if trainer.global_rank == 0:
    with open(out, "w") as f:
        json.dump(metrics, f)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skip the interpreter's teardown, where a thread of the CPU backends at times aborts
"""


def test_validation_on_two_processes_scores_each_prompt_once(tiny_model_dir, tmp_path):
    """A real 2-process gloo DDP validation of 5 prompts, only the first correct: 1/5, where the
    sampler's repeat of prompt 0 made it 2/6; rank 0 writes each prompt's outcome once, by its index."""
    rows = [{"prompt": f"{i}+0=", "answer": "1" if i == 0 else "0"} for i in range(5)]
    for name in ("train.jsonl", "val.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "ddp_validation_rewards.py").write_text(DDP_VALIDATION_REWARDS)
    (tmp_path / "ddp_validate.py").write_text(DDP_VALIDATE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    out = tmp_path / "metrics.json"
    command = [sys.executable, *launcher, str(tmp_path / "ddp_validate.py"), tiny_model_dir, str(tmp_path), str(out)]
    paths = [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads(out.read_text())
    assert metrics["val/accuracy"] == pytest.approx(1 / 5)
    outcomes = read_outcomes(outcomes_path(tmp_path, "val", 0))
    assert outcomes.prompt.tolist() == [0, 1, 2, 3, 4]
    assert outcomes.prompt_hash.tolist() == [prompt_hash(row["prompt"]) for row in rows]
    assert outcomes.correct[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
