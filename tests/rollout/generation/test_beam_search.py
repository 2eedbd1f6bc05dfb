"""Beam-search groups (``sampling.mode: beam_search``): a prompt's ``G`` completions are the ``G`` best
beams of one beam search, best first, in the rows of its group; only the HF generate path runs it."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.generation import EngineTarget, generate_group, resolve_engine
from grpo_lightning.rollout.generation.sampler import BEAM_SEARCH_CAVEAT
from grpo_lightning.models.logprobs import completion_logprobs
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.rollout.types import SamplingParams, completion_mask_from_ids
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO

PROMPTS = ["12+3=", "7+45=", "1+1="]  # of different lengths: left padding
BEAMS = SamplingParams(max_new_tokens=6, beam_search=True)
CUDA_QWEN2 = EngineTarget(device_type="cuda", model_type="qwen2", attn_implementation="sdpa")


def beam_scores(model, prompt_ids, prompt_mask, completion_ids, eos_token_id) -> tuple[torch.Tensor, torch.Tensor]:
    """Each completion's summed log-probability (a plain teacher-forced pass) and its length up to
    and including EOS: transformers ranks finished beams by ``sum / length ** length_penalty``."""
    mask, _ = completion_mask_from_ids(completion_ids, eos_token_id)
    logp, _ = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, mask, with_entropy=False)
    return logp.sum(dim=1), mask.sum(dim=1)


def test_a_group_is_the_group_size_distinct_beams_of_its_prompt_best_first(make_module, one_torch_thread):
    grpo = make_module(GRPO)
    group_size = 4
    # The random model seldom ends a completion: a token its beams emit stands for EOS here, so that
    # beams finish at different lengths and their ranking by mean log-probability is put to the test.
    tokenizer = copy.deepcopy(grpo.tokenizer)
    *_, completion_ids = generate_group(grpo.policy, tokenizer, PROMPTS[:1], group_size, BEAMS)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(int(completion_ids[-1, -1]))
    prompt_ids, prompt_mask, completion_ids = generate_group(grpo.policy, tokenizer, PROMPTS, group_size, BEAMS)

    assert completion_ids.size(0) == prompt_ids.size(0) == len(PROMPTS) * group_size
    encoded = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    assert torch.equal(prompt_ids, encoded["input_ids"].repeat_interleave(group_size, dim=0))  # rows g*G.. : prompt g
    assert torch.equal(prompt_mask, encoded["attention_mask"].repeat_interleave(group_size, dim=0))

    sums, lengths = beam_scores(grpo.policy, prompt_ids, prompt_mask, completion_ids, tokenizer.eos_token_id)
    assert lengths.unique().numel() > 1, "every beam has the same length: the test needs beams that end"
    normalised = (sums / lengths).view(len(PROMPTS), group_size)  # length_penalty 1.0, set explicitly
    assert BEAMS.generation_config(tokenizer, group_size).length_penalty == 1.0
    for group, scores in enumerate(normalised):
        rows = completion_ids.view(len(PROMPTS), group_size, -1)[group]
        beams = {tuple(row[: int(n)].tolist()) for row, n in zip(rows, lengths.view(len(PROMPTS), -1)[group])}
        assert len(beams) == group_size, f"group {group} repeats a beam"
        assert (scores[1:] <= scores[:-1] + 1e-5).all(), f"group {group} is not best first: {scores.tolist()}"
    assert normalised.std() > 0  # different beams, different scores


def test_beams_are_deterministic_and_carry_no_sampling_logprobs(make_module, one_torch_thread):
    grpo = make_module(GRPO)
    torch.manual_seed(0)
    *first, logp = generate_group(grpo.policy, grpo.tokenizer, PROMPTS[:2], 3, BEAMS, with_logprobs=True)
    torch.manual_seed(1)
    *second, _ = generate_group(grpo.policy, grpo.tokenizer, PROMPTS[:2], 3, BEAMS, with_logprobs=True)
    assert logp is None  # not sampled: no sampling distribution to weigh tokens by
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_the_module_rolls_out_beams_and_validates_with_its_own_sampling(make_module, one_torch_thread):
    grpo = make_module(
        GRPO, sampling={"mode": "beam_search", "group_size": 3}, evaluation={"temperature": 1.0, "samples": 2}
    )
    assert grpo.sampling.beam_search and not grpo.val_sampling.beam_search
    rollout = grpo.generate({"prompt": PROMPTS[:2], "answer": ["15", "52"]}, 3, grpo.sampling, with_logprobs=True)
    assert rollout.prompts == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    assert rollout.columns == {"answer": ["15"] * 3 + ["52"] * 3}
    assert rollout.sampling_logp is None
    assert len(set(rollout.completions[:3])) + len(set(rollout.completions[3:])) >= 5  # texts of distinct beams
    assert grpo.engine_plan.rollout == "hf"


def test_auto_picks_the_hf_path_for_beam_search_even_on_cuda_and_says_why():
    plan = resolve_engine(EngineOptions(), CUDA_QWEN2, beam_search=True)
    assert plan.rollout == "hf" and not plan.compile and not plan.fuse_projections
    assert len(plan.notes) == 1 and "sampling.mode is 'beam_search'" in plan.notes[0]
    assert resolve_engine(EngineOptions(rollout="hf"), CUDA_QWEN2, beam_search=True).rollout == "hf"


@pytest.mark.parametrize(
    ("options", "seed", "field"),
    [
        (EngineOptions(rollout="static"), None, "engine.rollout"),
        (EngineOptions(compile=True), None, "engine.compile"),
        (EngineOptions(decode_attention="math"), None, "engine.decode_attention"),
        (EngineOptions(), 3, "sampling.seed"),
    ],
    ids=["rollout-static", "compile", "decode-attention", "rollout-seed"],
)
def test_a_static_engine_setting_with_beam_search_is_an_error_naming_both(options, seed, field):
    with pytest.raises(ConfigError, match=rf"^{field}: .*sampling.mode is 'beam_search'.*set sampling.mode to 'sample'"):
        resolve_engine(options, CUDA_QWEN2, seed, beam_search=True)


def test_the_module_refuses_beam_search_settings_that_cannot_hold_when_built(make_module):
    with pytest.raises(ConfigError, match="^engine.rollout: .*beam_search"):
        make_module(GRPO, configure=False, engine=EngineOptions(rollout="static"), sampling={"mode": "beam_search"})
    with pytest.raises(ConfigError, match="^sampling.mode: 'beams' is not one of 'sample', 'beam_search'"):
        make_module(GRPO, configure=False, sampling={"mode": "beams"})
    with pytest.raises(ConfigError, match="^sampling.correction: .*beam search samples nothing"):
        make_module(GRPO, configure=False, sampling={"mode": "beam_search", "correction": "token_truncate"})


def test_a_two_step_fit_with_the_shipped_config_warns_once_that_beams_are_not_samples(
    tiny_model_dir, tmp_path, one_torch_thread
):
    configs = config_dir()
    args = [
        "fit", *(a for name in ("trainer/cpu", "data/arithmetic", "variant/grpo", "rollout/beam_search")
                 for a in ("--config", str(configs / f"{name}.yaml"))),
        "--model.model", tiny_model_dir, "--model.sampling.group_size", "3", "--model.sampling.max_new_tokens", "4",
        "--data.batch_size", "2", "--data.num_train", "8", "--data.num_val", "2", "--trainer.max_steps", "2",
        "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
    ]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = GRPOLightningCLI(args=args)
    assert [str(w.message) for w in caught].count(BEAM_SEARCH_CAVEAT) == 1
    assert cli.model.hparams.sampling["mode"] == "beam_search" and cli.trainer.global_step == 2
    rollout = cli.model.last_rollout
    assert rollout.group_size == 3 and len(rollout) == 6
    assert rollout.prompts[:3] == [rollout.prompts[0]] * 3 and rollout.prompts[3:] == [rollout.prompts[3]] * 3
    completions = rollout.completion_ids.view(2, 3, -1)
    for group, mask in zip(completions, rollout.completion_mask.view(2, 3, -1)):
        assert len({tuple(row[mask_row.bool()].tolist()) for row, mask_row in zip(group, mask)}) == 3
    logged = cli.model.last_step_metrics
    assert "reward" in logged and not [name for name in logged if name.startswith("sampling/")]  # nothing sampled
