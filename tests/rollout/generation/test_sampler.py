"""Sampling a rollout: the keys of keyed sampling, the Rollout built from sampled ids, and the
sampler following its plan."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.generation import EngineTarget, RolloutSampler, build_rollout, generate_group, resolve_engine
from grpo_lightning.rollout.generation import sampling_keys
from grpo_lightning.rollout.types import SamplingParams, end_token_ids
from grpo_lightning.errors import ConfigError
from lightning.pytorch import Callback
from tests.helpers import make_trainer, module, small_data
from grpo_lightning.variants import GRPO


def test_sampling_keys_follow_the_prompt_not_its_place_in_the_batch():
    keys = sampling_keys(7, 0, ["a", "b"], 2).view(2, 2)
    swapped = sampling_keys(7, 0, ["b", "a"], 2).view(2, 2)
    assert torch.equal(keys[0], swapped[1]) and torch.equal(keys[1], swapped[0])
    assert len(set(keys.flatten().tolist())) == 4 and (keys >= 0).all()
    assert not torch.equal(sampling_keys(7, 1, ["a", "b"], 2), keys.flatten())  # the next rollout draws anew
    assert not torch.equal(sampling_keys(8, 0, ["a", "b"], 2), keys.flatten())
    repeated = sampling_keys(7, 0, ["a", "a"], 2).view(2, 2)  # a prompt twice in a batch: two copies
    assert torch.equal(repeated[0], keys[0]) and not torch.equal(repeated[1], keys[0])


def test_build_rollout_masks_after_eos_and_repeats_the_columns(make_module):
    grpo = make_module(GRPO)
    eos, pad = grpo.tokenizer.eos_token_id, grpo.tokenizer.pad_token_id
    ids = torch.tensor([[5, eos, 6], [5, 6, 7]])
    batch = {"prompt": ["1+2="], "answer": ["3"]}
    rollout = build_rollout(grpo.tokenizer, batch, 2, torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2), ids)
    assert rollout.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert rollout.truncated.tolist() == [False, True]
    assert rollout.prompts == ["1+2=", "1+2="] and rollout.columns == {"answer": ["3", "3"]}
    assert rollout.completions[0] == grpo.tokenizer.decode([5], skip_special_tokens=True) and pad is not None


def test_end_token_ids_are_the_tokenizers_eos_then_the_generation_configs_by_hand(make_module):
    grpo = make_module(GRPO)
    tokenizer, policy = grpo.tokenizer, grpo.policy
    eos = tokenizer.eos_token_id
    assert end_token_ids(tokenizer) == (eos,)
    for configured, expected in ((eos, (eos,)), (5, (eos, 5)), ([5, eos, 6], (eos, 5, 6)), (None, (eos,))):
        policy.generation_config.eos_token_id = configured
        assert end_token_ids(tokenizer, policy) == expected


@pytest.mark.parametrize("rollout", ["hf", "static"])
def test_completions_end_at_the_models_end_of_turn_ids_not_only_the_tokenizers_eos(tiny_model_dir, tmp_path, rollout):
    # A checkpoint whose generation config ends a completion at every id (a chat model's <|im_end|> or
    # <|eot_id|> beside its tokenizer's EOS, taken to the limit): each completion is one token and ends.
    import shutil

    from transformers import AutoTokenizer, GenerationConfig

    path = shutil.copytree(tiny_model_dir, tmp_path / "model")
    vocabulary = len(AutoTokenizer.from_pretrained(path))
    config = GenerationConfig.from_pretrained(path) if (path / "generation_config.json").exists() else GenerationConfig()
    config.eos_token_id = list(range(vocabulary))
    config.save_pretrained(path)
    grpo = GRPO(model=str(path), sampling={"group_size": 2, "max_new_tokens": 6}, policy={"dtype": "float32"},
                engine=EngineOptions(rollout=rollout))  # fmt: skip
    grpo.configure_model()
    ends = (grpo.tokenizer.eos_token_id, *[i for i in range(vocabulary) if i != grpo.tokenizer.eos_token_id])
    assert grpo.sampling.stop_token_ids == ends and grpo.val_sampling.stop_token_ids == ends
    for sampling in (grpo.sampling, grpo.val_sampling):
        rollout_ = grpo.generate({"prompt": ["1+2=", "30+4="]}, 2, sampling, with_logprobs=True)
        assert rollout_.lengths.tolist() == [1, 1, 1, 1] and not rollout_.truncated.any()


def test_a_checkpoints_own_sampling_settings_change_nothing_on_the_hf_path(tiny_model_dir, tmp_path):
    """A generation_config.json with a repetition penalty and no_repeat_ngram_size (as chat models ship
    them): ``generate`` fell back on them for what the call left unset, so the HF path sampled another
    distribution than the loss's log-probs and the static engine, and greedy validation answered otherwise."""
    import shutil

    from transformers import GenerationConfig

    path = shutil.copytree(tiny_model_dir, tmp_path / "model")
    config = GenerationConfig.from_pretrained(path) if (path / "generation_config.json").exists() else GenerationConfig()
    config.repetition_penalty, config.no_repeat_ngram_size = 3.0, 2
    config.save_pretrained(path)
    prompts = {"prompt": ["1+2=", "30+4=", "7*8=", "99-9="]}
    modules = {rollout: GRPO(model=str(path), sampling={"group_size": 4, "max_new_tokens": 12}, policy={"dtype": "float32"},
                             engine=EngineOptions(rollout=rollout)) for rollout in ("hf", "static")}  # fmt: skip
    greedy = {}
    for rollout, grpo in modules.items():
        grpo.configure_model()
        assert grpo.policy.generation_config.repetition_penalty == 3.0  # kept on the model, not applied
        greedy[rollout] = grpo.generate(prompts, 1, grpo.val_sampling).completions
    assert greedy["hf"] == greedy["static"]
    grpo = modules["hf"]
    torch.manual_seed(0)
    sampled = grpo.generate(prompts, 4, grpo.sampling, with_logprobs=True)
    assert not sampled.sampling_logp.isnan().any()
    teacher_forced = grpo.compute_logprobs(grpo.policy, sampled) * sampled.completion_mask
    torch.testing.assert_close(sampled.sampling_logp, teacher_forced, atol=1e-4, rtol=0)


def test_the_hf_plan_samples_what_generate_group_samples(make_module):
    grpo = make_module(GRPO)
    plan = resolve_engine(EngineOptions(), EngineTarget.of(grpo.policy, "cpu"))
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0)
    got = RolloutSampler(plan).sample(grpo.policy, grpo.tokenizer, ["1+2=", "30+4="], 2, sampling)
    expected = generate_group(grpo.policy, grpo.tokenizer, ["1+2=", "30+4="], 2, sampling)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_the_static_engine_is_kept_between_rollouts_and_grown_for_a_larger_batch(make_module):
    grpo = make_module(GRPO, engine=EngineOptions(rollout="static"), policy={"dtype": "float32"})
    sampler = RolloutSampler(resolve_engine(grpo.engine_options, EngineTarget.of(grpo.policy, "cpu")))
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0)
    sampler.sample(grpo.policy, grpo.tokenizer, ["1+2="], 2, sampling)
    first = sampler.engine
    sampler.sample(grpo.policy, grpo.tokenizer, ["1+2="], 2, sampling)
    assert sampler.engine is first
    sampler.sample(grpo.policy, grpo.tokenizer, ["1+2=", "3+4="], 2, sampling)
    assert sampler.engine is not first and sampler.engine.max_batch_size == 4
    sampler.clear()
    assert sampler.engine is None


def test_two_models_keep_an_engine_each(make_module):
    """Stale rollouts sample from a snapshot and validation from the policy: neither rebuilds the
    other's engine (on CUDA: its captured graphs); a third model replaces the least recent."""
    grpo = make_module(GRPO, engine=EngineOptions(rollout="static"), policy={"dtype": "float32"})
    sampler = RolloutSampler(resolve_engine(grpo.engine_options, EngineTarget.of(grpo.policy, "cpu")))
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0)
    copies = [copy.deepcopy(grpo.policy) for _ in range(2)]
    sampler.sample(grpo.policy, grpo.tokenizer, ["1+2="], 2, sampling)
    policy_engine = sampler.engine
    sampler.sample(copies[0], grpo.tokenizer, ["1+2="], 2, sampling)
    sampler.sample(grpo.policy, grpo.tokenizer, ["1+2="], 2, sampling)
    assert sampler.engine is policy_engine and len(sampler.engines) == 2
    sampler.sample(copies[1], grpo.tokenizer, ["1+2="], 2, sampling)
    assert [engine.model for engine in sampler.engines.values()] == [grpo.policy, copies[1]]


def test_a_rollout_sampled_ahead_is_returned_by_the_same_call_and_a_failure_raises_there(make_module):
    grpo = make_module(GRPO, engine=EngineOptions(rollout="static"), policy={"dtype": "float32"}, sampling={"seed": 3})
    sampler = RolloutSampler(resolve_engine(grpo.engine_options, EngineTarget.of(grpo.policy, "cpu")), seed=3)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0)
    arguments = (grpo.policy, grpo.tokenizer, ["1+2=", "3+4="], 2, sampling, 5, True)
    expected = sampler.sample(*arguments)
    sampler.sample_ahead(*arguments)
    assert sampler.has_ahead(*arguments) and not sampler.has_ahead(*arguments[:5], 6, True)
    got = sampler.sample(*arguments)
    assert sampler.ahead.taken == 1 and not sampler.has_ahead(*arguments)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same tokens; log-probs up to BLAS's threads

    sampler.sample_ahead(grpo.policy, grpo.tokenizer, ["1+2="], 2, dataclasses.replace(sampling, beam_search=True))
    with pytest.raises(ConfigError, match="beam_search"):
        sampler.sample(grpo.policy, grpo.tokenizer, ["1+2="], 2, dataclasses.replace(sampling, beam_search=True))


def test_chat_messages_for_a_tokenizer_without_a_chat_template_are_a_config_error():
    """What the CLI cannot check before loading (a hub dataset, a GGUF tokenizer) is still one line."""
    from grpo_lightning.quickstart.tiny import build_char_tokenizer
    from grpo_lightning.rollout.generation.sampler import format_prompt

    tokenizer = build_char_tokenizer()
    assert not tokenizer.chat_template and format_prompt(tokenizer, "1+1=") == "1+1="
    with pytest.raises(ConfigError, match="chat messages and the tokenizer has no chat template"):
        format_prompt(tokenizer, [{"role": "user", "content": "1+1="}])


class EngineSizes(Callback):
    """The static engines' batch sizes at the start of each training batch."""

    def __init__(self) -> None:
        self.sizes: list[list[int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.sizes.append([e.max_batch_size for s in pl_module._samplers.values() for e in s.engines.values()])


def test_a_validation_batch_larger_than_the_rollout_leaves_no_cache_behind(tiny_model_dir, tmp_path):
    """An engine is sized to the largest batch it served; a validation of 8 rows would keep its cache
    through training rollouts of 4 (on a GPU shared by several runs, enough to run out of memory)."""
    sizes = EngineSizes()
    grpo = module(tiny_model_dir, engine=EngineOptions(rollout="static"), policy={"dtype": "float32"})
    trainer = make_trainer(tmp_path, max_steps=3, val_check_interval=1, callbacks=[sizes])
    trainer.fit(grpo, datamodule=small_data(batch_size=2, val_batch_size=8))
    assert trainer.global_step == 3
    assert sizes.sizes == [[], [], []]  # released after each validation; each rollout sized its own
