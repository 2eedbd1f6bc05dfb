"""GRPO with process supervision: step ends, group-normalised step rewards and per-token advantages
by hand, the rule-based step scorer, a process reward model saved and loaded, and fits."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoTokenizer

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.rewards.process_supervision import (
    delimited_step_ends,
    step_advantages,
    step_rewards,
    token_at,
)
from grpo_lightning.quickstart.tiny import build_char_tokenizer, tiny_config
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.rewards import ProcessRewardModel, answer_prefix_steps
from grpo_lightning.errors import ConfigError
from variants import ProcessGRPO

CONFIGS = config_dir()


def test_delimited_steps_end_after_their_delimiter():
    assert delimited_step_ends("a\n\nbb\n\nc", "\n\n") == [3, 7, 8]
    assert delimited_step_ends("a\n\n", "\n\n") == [3]
    assert delimited_step_ends("one step", "\n\n") == [8]
    assert delimited_step_ends("", "\n\n") == []


def test_token_at_finds_the_token_that_ends_a_character():
    ends = [2, 5, 6, 9]  # token texts end at these offsets
    assert [token_at(ends, c) for c in (1, 2, 3, 6, 9, 20)] == [0, 0, 1, 2, 3, 3]


def test_step_advantages_by_hand():
    # One group of 2: completion 0 has steps ending at tokens 1 and 3 (scores 1, 0), 5 tokens;
    # completion 1 one step at token 2 (score 1), 3 tokens. R = [1, 0, 1]: mean 2/3, unbiased std
    # sqrt(1/3), so r~ = [a, -2a, a] with a = (1/3) / (sqrt(1/3) + 1e-4).
    a = (1 / 3) / (math.sqrt(1 / 3) + 1e-4)
    pairs = [[(1, 1.0), (3, 0.0)], [(2, 1.0)]]
    got = step_advantages(pairs, group_size=2, lengths=torch.tensor([5, 3]), width=5)
    # the last step of completion 0 reaches its last token (4); a token's advantage sums the steps
    # ending at or after it
    expected = torch.tensor([[a - 2 * a, a - 2 * a, -2 * a, -2 * a, -2 * a], [a, a, a, 0.0, 0.0]])
    assert_close(got, expected.float())


def test_a_group_of_equal_step_rewards_has_no_advantage():
    got = step_advantages([[(0, 1.0)], [(1, 1.0)], [(0, 0.0)], [(0, 1.0)]], 2, torch.tensor([2, 2, 1, 1]), 2)
    assert (got[:2] == 0).all() and (got[2:] != 0).any()


def test_scores_per_delimited_step_map_to_tokens_and_are_checked():
    completions = ["ab\n\ncd", "xyz"]
    char_ends = [[1, 2, 3, 4, 5, 6], [1, 2, 3]]

    def two_then_one(prompts, completions, **columns):
        return [[0.5, 1.0], [0.0]]

    pairs = step_rewards(two_then_one, "f", ["p", "q"], completions, {}, char_ends, "\n\n")
    assert pairs == [[(3, 0.5), (5, 1.0)], [(2, 0.0)]]
    with pytest.raises(ValueError, match="gave 1 scores for completion 0, which has 2 steps"):
        step_rewards(lambda p, c: [[1.0], [0.0]], "f", ["p", "q"], completions, {}, char_ends, "\n\n")
    with pytest.raises(ValueError, match="returned 1 results for 2 completions"):
        step_rewards(lambda p, c: [[1.0]], "f", ["p", "q"], completions, {}, char_ends, "\n\n")
    with pytest.raises(ValueError, match="end_token_index 9 of completion 1 is outside its 3 tokens"):
        step_rewards(lambda p, c: [[(0, 1.0)], [(9, 1.0)]], "f", ["p", "q"], completions, {}, char_ends, "\n\n")
    with pytest.raises(ValueError, match="return finite numbers"):
        step_rewards(lambda p, c: [[(0, math.nan)], []], "f", ["p", "q"], completions, {}, char_ends, "\n\n")


def test_answer_prefix_steps_by_hand():
    # One character per token, so token t ends at character t + 1.
    completions = ["<answer>82</answer>", "<answer>85</answer>", "82"]
    token_ends = [list(range(1, len(c) + 1)) for c in completions]
    got = answer_prefix_steps(["37+45="] * 3, completions, answer=["82"] * 3, token_ends=token_ends)
    # "<answer>" is 8 characters: the digits end at characters 9 and 10 (tokens 8 and 9)
    assert got[0] == [(8, 1.0), (9, 1.0), (18, 1.0)]
    assert got[1] == [(8, 1.0), (9, 0.0), (18, 0.0)]
    assert got[2] == [(1, 0.0)]  # no answer tag: one step, 0


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 token classifier with two labels and its tokenizer, saved as a user's would be."""
    from transformers import Qwen2ForTokenClassification

    tokenizer = build_char_tokenizer()
    config = tiny_config(tokenizer, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         max_position_embeddings=128)  # fmt: skip
    config.num_labels = 2
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("prm")
    Qwen2ForTokenClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    AutoTokenizer.from_pretrained(path)  # round trip: what the reward model loads
    return str(path)


def test_a_process_reward_model_scores_each_step(prm_dir):
    model = ProcessRewardModel(prm_dir, step_delimiter="\n\n")
    scores = model(["1+1=", "2+2="], ["a\n\nb\n\nc", "4"])
    assert [len(s) for s in scores] == [3, 1]
    assert all(0.0 < score < 1.0 for steps in scores for score in steps)
    assert model(["1+1="], ["a\n\nb\n\nc"]) == scores[:1]  # deterministic
    with pytest.raises(ValueError, match="positive_label=5"):
        ProcessRewardModel(prm_dir, positive_label=5)(["1"], ["2"])


def test_bad_settings_name_the_field(tiny_model_dir):
    with pytest.raises(ConfigError, match="step_delimiter"):
        ProcessGRPO(tiny_model_dir, step_delimiter="")
    with pytest.raises(ConfigError, match="rewards.scale: does not apply to ProcessGRPO"):
        ProcessGRPO(tiny_model_dir, rewards={"scale": "none"})


@pytest.mark.parametrize("step_reward", ["rule", "model"])
def test_a_fit_through_the_cli(tiny_model_dir, prm_dir, tmp_path, step_reward, one_torch_thread):
    args = [
        "fit",
        "--config",
        str(CONFIGS / "trainer/cpu.yaml"),
        "--config",
        str(CONFIGS / "data/arithmetic.yaml"),
        "--config",
        str(CONFIGS / "variant/process_grpo.yaml"),
        "--config",
        str(CONFIGS / "model/tiny.yaml"),
        "--model.model",
        tiny_model_dir,
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
        "--trainer.max_steps",
        "2",
        "--data.batch_size",
        "2",
        "--model.sampling.group_size",
        "3",
        "--model.sampling.max_new_tokens",
        "8",
        "--data.max_val_samples",
        "4",
        "--validate_before_fit",
        "false",
        "--trainer.limit_val_batches",
        "0",
        "--completions.jsonl",
        "true",
    ]
    if step_reward == "model":
        spec = {"class_path": "grpo_lightning.rewards.ProcessRewardModel", "init_args": {"path": prm_dir}}
        args += ["--model.step_reward_func", json.dumps(spec)]
    cli = GRPOLightningCLI(args=args)
    metrics = cli.model.last_step_metrics
    assert cli.trainer.global_step == 2 and math.isfinite(metrics["loss"]) and metrics["process/steps_per_completion"] > 0
    assert cli.model.last_advantages.dim() == 2  # per token
    lines = (tmp_path / "process_grpo" / "version_0" / "completions.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2 * 3 and all(math.isfinite(json.loads(line)["advantage"]) for line in lines)
