"""Multi-turn rollouts: the trainer scores the sampled tokens, and environment tokens carry no loss."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo_lightning.agents import EnvironmentOptions, environment_reward
from grpo_lightning.errors import ConfigError
from grpo_lightning.models.logprobs import completion_logprobs
from grpo_lightning import variants
from grpo_lightning.variants import DAPO, GRPO, PPO

REPLY = "(12)"


class ScriptedEnvironment:
    """Replies ``REPLY`` to every turn; the episode ends after ``turns`` turns with reward ``turns``."""

    def __init__(self, turns: int = 3) -> None:
        self.turns, self.seen = turns, 0

    def reset(self, row):
        self.seen = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, message):
        self.seen += 1
        done = self.seen >= self.turns
        return ([] if done else [{"role": "user", "content": REPLY}]), (float(self.seen) if done else None), done


SCRIPTED = {"name": f"{__name__}.ScriptedEnvironment", "max_turns": 3, "max_tokens": 40}


def ending_turns(module, bias: float = 2.5):
    """The policy's head favours EOS (about one token in four), so that turns end and replies follow.
    A real tiny Qwen2 whose LM head gets a bias: generation and the training pass both use it."""
    head = module.policy.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight * 0.1)
        biased.bias.zero_()
        biased.bias[module.tokenizer.eos_token_id] = bias
    module.policy.set_output_embeddings(biased)
    return module


ENGINES = ["hf", "static"]


@pytest.fixture(params=ENGINES)
def episodes(request, make_module, one_torch_thread):
    """A GRPO module (token mean, no KL) on the tiny model with the scripted environment, and a rollout
    of it, on each engine (the HF generate path, the static engine)."""
    module = ending_turns(make_module(GRPO, environment=SCRIPTED, aggregation="token_mean", rewards={"funcs": [environment_reward]},
                                      kl={"beta": 0.0}, sampling={"max_new_tokens": 6}, engine={"rollout": request.param}))  # fmt: skip
    assert module.engine_plan.rollout == request.param
    batch = {"prompt": ["12+34=", "5+6="], "answer": ["46", "11"]}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        rollout = module.generate(batch, module.settings.group_size, module.sampling, with_logprobs=True)
    module.score(rollout)
    return module, rollout


def segments(rollout, row: int) -> list[tuple[bool, list[int]]]:
    """``(from the model, ids)`` of each run of one source in the row's completion."""
    found: list[tuple[bool, list[int]]] = []
    model, environment = rollout.completion_mask[row].bool(), rollout.environment_mask[row].bool()
    for token, is_model, is_environment in zip(rollout.completion_ids[row].tolist(), model, environment):
        if not (is_model or is_environment):
            break
        if found and found[-1][0] == bool(is_model):
            found[-1][1].append(token)
        else:
            found.append((bool(is_model), [token]))
    return found


def test_the_trainer_scores_exactly_the_sampled_tokens_across_turns(episodes):
    module, rollout = episodes
    eos, tokenizer = module.tokenizer.eos_token_id, module.tokenizer
    reply = tokenizer(REPLY, add_special_tokens=False)["input_ids"]
    model_turns = []
    for row in range(len(rollout)):
        parts = segments(rollout, row)
        turns = [ids for is_model, ids in parts if is_model]
        assert [ids for is_model, ids in parts if not is_model] == [reply] * (len(turns) - 1)
        assert all(ids[-1] == eos for ids in turns[:-1])  # a reply follows a turn that ended
        assert rollout.columns["turns"][row] == len(turns)
        model_turns += turns
    assert max(rollout.columns["turns"]) > 1  # several turns were sampled
    # The precondition that makes this a test: decoding and encoding a turn again changes its ids
    # (the character tokenizer drops special tokens such as <pad> sampled inside a turn).
    again = [tokenizer(tokenizer.decode(t, skip_special_tokens=True), add_special_tokens=False)["input_ids"] for t in model_turns]
    assert any(a != t for a, t in zip(again, model_turns))
    # The training pass's log-probs of the rollout's ids are those the sampler recorded for the ids it drew.
    scored = module.compute_logprobs(module.policy, rollout)
    mask = rollout.completion_mask.bool()
    assert torch.allclose(scored[mask], rollout.sampling_logp[mask], atol=1e-4)


def test_groups_are_episodes_of_one_task_with_the_environment_reward(episodes):
    module, rollout = episodes
    assert rollout.prompts == ["12+34="] * 4 + ["5+6="] * 4
    assert rollout.columns["answer"] == ["46"] * 4 + ["11"] * 4
    finished = ~rollout.truncated
    assert finished.any()
    # The scripted environment rewards a finished episode with its turn count, 3.
    assert rollout.rewards[finished].tolist() == [3.0] * int(finished.sum())
    assert rollout.rewards[~finished].tolist() == [0.0] * int((~finished).sum())


def test_environment_tokens_carry_no_gradient_and_count_in_no_denominator(episodes):
    module, rollout = episodes
    model, environment = rollout.completion_mask.bool(), rollout.environment_mask.bool()
    assert environment.any() and not (model & environment).any()
    rows = torch.arange(len(rollout))
    advantages = torch.linspace(-1, 1, len(rollout))
    num_tokens = module.loss_mask(rollout, rows).sum()
    assert num_tokens == rollout.completion_mask.sum()  # the model's tokens only

    def gradient(loss):
        module.policy.zero_grad(set_to_none=True)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in module.policy.parameters() if p.grad is not None])

    trained = gradient(module.micro_batch_loss(rollout, advantages, rows, num_sequences=len(rollout), num_tokens=num_tokens))
    # GRPO at ratio 1 with no KL, token mean: -sum(A * logp over the model's tokens) / their count.
    logp, _ = completion_logprobs(module.policy, *rollout.model_inputs(rows), temperature=module.sampling.temperature)

    def expected(mask):
        return gradient(-(advantages[:, None] * logp * mask).sum() / mask.sum())

    assert torch.allclose(trained, expected(rollout.completion_mask), atol=1e-6)
    logp, _ = completion_logprobs(module.policy, *rollout.model_inputs(rows), temperature=module.sampling.temperature)
    with_environment = expected(rollout.completion_mask + rollout.environment_mask)
    assert not torch.allclose(trained, with_environment, atol=1e-6)


def test_the_step_logs_episode_metrics(episodes):
    from grpo_lightning.runtime.metrics import StepMetrics
    from grpo_lightning.training.rollout_metrics import record_rollout

    module, rollout = episodes
    metrics = StepMetrics()
    record_rollout(metrics, rollout)
    values = metrics.compute_and_reset()
    assert values["agent/turns"] == pytest.approx(sum(rollout.columns["turns"]) / len(rollout))
    assert values["agent/environment_tokens"] == pytest.approx(float(rollout.environment_mask.sum()) / len(rollout))
    assert values["agent/model_tokens"] == pytest.approx(float(rollout.completion_mask.sum()) / len(rollout))
    assert values["agent/tool_errors/timeout"] == 0.0


def test_completion_records_and_tables_show_each_turn_with_its_source(episodes):
    from grpo_lightning.evaluation.completions import completion_records, completion_table

    module, rollout = episodes
    records = completion_records(rollout, torch.zeros(len(rollout)), ["environment_reward"], step=0)
    for record, turns in zip(records, rollout.columns["turns"]):
        assert [turn["role"] for turn in record["conversation"]] == ["assistant", "user"] * (turns - 1) + ["assistant"]
        assert all(turn["content"] == REPLY for turn in record["conversation"] if turn["role"] == "user")
    table = completion_table(records, ["environment_reward"], 500, len(rollout), rollout.group_size)
    assert "\\[assistant\\]" in table and "\\[user\\] (12)" in table


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"sampling": {"seed": 0}}, "sampling.seed: keyed sampling .* multi-turn"),
        ({"sampling": {"mode": "beam_search"}}, "sampling.mode: multi-turn rollouts"),
        ({"environment": {"name": "no.such.Environment"}}, "environment.name: 'no.such.Environment' does not import"),
        ({"environment": {**SCRIPTED, "args": {"rounds": 2}}}, "environment.args: .* refuses them"),
        ({"environment": {"name": "grpo_lightning.agents.GuessNumberEnvironment", "args": {"low": 9, "high": 1}}},
         "environment.args: .* refuses them .*need low <= high"),
        ({"environment": {**SCRIPTED, "max_turns": 0}}, "environment.max_turns"),
    ],
)
def test_settings_multi_turn_cannot_run_are_refused_naming_the_option(make_module, settings, message):
    settings = {"environment": SCRIPTED, **settings}
    with pytest.raises(ConfigError, match=message):
        make_module(GRPO, configure=False, **settings)


def test_variants_that_need_one_completion_refuse_an_environment(make_module):
    with pytest.raises(ConfigError, match="environment: does not apply to PPO"):
        make_module(PPO, configure=False, environment=SCRIPTED)
    with pytest.raises(ConfigError, match="overlong_penalty: .*multi-turn"):
        make_module(DAPO, configure=False, environment=SCRIPTED)
    make_module(DAPO, configure=False, environment=SCRIPTED, overlong_penalty=0.0)


def test_environment_options_come_back_from_the_hyperparameters(make_module):
    module = make_module(GRPO, configure=False, environment=SCRIPTED)
    assert module.hparams["environment"] == {**SCRIPTED, "args": {}, "max_error_fraction": 0.1}
    assert EnvironmentOptions.of(module.hparams["environment"]) == module.environment


REFUSING = {"OnPolicyDistillation", "PPO", "ProcessGRPO"}


@pytest.mark.parametrize("name", sorted(variants.__all__))
def test_every_variant_ignores_what_it_is_given_at_environment_tokens_or_refuses(name, make_module, one_torch_thread):
    """Log-probs, the reference's and the sampler's, changed at the environment's tokens only, change
    no variant's loss: its ratios, KL, reward shaping and aggregation all read the model's tokens."""
    cls = getattr(variants, name)
    settings = {"environment": SCRIPTED, "rewards": {"funcs": [environment_reward]}, "sampling": {"max_new_tokens": 6},
                "kl": {"beta": 0.04}, **({"overlong_penalty": 0.0} if cls is DAPO else {})}  # fmt: skip
    if "sampling.correction" not in cls.inapplicable_options:  # VESPO refuses it
        settings["sampling"]["correction"] = "token_truncate"
    if name in REFUSING:
        with pytest.raises(ConfigError, match=f"environment: does not apply to {name}"):
            make_module(cls, configure=False, **settings)
        return
    module = ending_turns(make_module(cls, **settings))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        rollout = module.generate({"prompt": ["12+34=", "5+6="]}, module.settings.group_size, module.sampling, with_logprobs=True)
    module.score(rollout)
    rollout.old_logp = module.compute_logprobs(module.policy, rollout) - 0.01
    rollout.ref_logp = rollout.old_logp + 0.02
    environment = rollout.environment_mask.bool()
    assert environment.any()

    def loss(rollout):
        advantages = module.advantages(module.shape_rewards(rollout.rewards, rollout).view(-1, rollout.group_size))
        rows = torch.arange(len(rollout))
        num_tokens = module.loss_mask(rollout, rows).sum()
        torch.manual_seed(0)
        return module.micro_batch_loss(rollout, advantages.flatten(0, 1), rows, len(rollout), num_tokens)

    changed = dataclasses.replace(rollout, **{
        name: getattr(rollout, name).masked_fill(environment, value) for name, value in
        (("old_logp", -7.0), ("ref_logp", 3.0), ("sampling_logp", -9.0))
    })  # fmt: skip
    reference = loss(rollout)
    assert torch.isfinite(reference)
    assert torch.equal(loss(changed), reference)


@pytest.mark.parametrize("engine", ENGINES)
def test_episodes_through_a_chat_template_append_its_replies_to_the_sampled_ids(engine, tmp_path, one_torch_thread):
    from grpo_lightning.agents.chat_tokens import ChatTokens
    from grpo_lightning.quickstart.tiny import save_tiny_model, tiny_config
    from tests.helpers import CHATML, byte_tokenizer

    tokenizer = byte_tokenizer(CHATML)
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    directory = save_tiny_model(tmp_path / "chatml", tokenizer, config)
    module = GRPO(model=str(directory), environment=SCRIPTED, rewards={"funcs": [environment_reward]}, kl={"beta": 0.0},
                  sampling={"group_size": 2, "max_new_tokens": 6}, engine={"rollout": engine})  # fmt: skip
    module.configure_model()
    ending_turns(module, bias=6.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        rollout = module.generate({"prompt": ["What is 12+34?"]}, 2, module.sampling, with_logprobs=True)
    chat = ChatTokens(module.tokenizer)
    assert module.tokenizer.decode(rollout.prompt_ids[0][rollout.prompt_mask[0].bool()]) == (
        "<|im_start|>user\nWhat is 12+34?<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    reply = chat.reply_ids([{"role": "user", "content": REPLY}])
    assert module.tokenizer.decode(reply) == f"\n<|im_start|>user\n{REPLY}<|im_end|>\n<|im_start|>assistant\n"
    replies = [ids for row in range(len(rollout)) for is_model, ids in segments(rollout, row) if not is_model]
    assert replies and all(ids == reply for ids in replies)
    scored = module.compute_logprobs(module.policy, rollout)
    mask = rollout.completion_mask.bool()
    assert torch.allclose(scored[mask], rollout.sampling_logp[mask], atol=1e-4)


class PromptLengthEnvironment(ScriptedEnvironment):
    """Episodes of 1 to 3 turns, by the prompt's length: they leave the batch at different turns."""

    def reset(self, row):
        self.turns = 1 + len(row["prompt"]) % 3
        return super().reset(row)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_turns_continued_from_the_cache_sample_what_feeding_the_whole_history_again_samples(
    temperature, make_module, one_torch_thread
):
    from grpo_lightning.agents.multi_turn import sample_episodes

    environment = {**SCRIPTED, "name": f"{__name__}.PromptLengthEnvironment"}
    module = ending_turns(
        make_module(
            GRPO, environment=environment, rewards={"funcs": [environment_reward]}, sampling={"max_new_tokens": 6}
        )
    )
    batch = {"prompt": ["12+34=", "5+6=", "(1+2)*3=", "1+1="]}
    sampling = dataclasses.replace(module.sampling, temperature=temperature)
    fed = []
    count = lambda _, args, kwargs: fed.append(kwargs["input_ids"].numel())  # noqa: E731
    hook = module.policy.register_forward_pre_hook(count, with_kwargs=True)

    def episodes(reuse_cache: bool):
        fed.clear()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            rollout = sample_episodes(module.policy, module.tokenizer, batch, 4, sampling, module.environment,
                                      with_logprobs=True, reuse_cache=reuse_cache)  # fmt: skip
        return rollout, sum(fed)

    (cached, fed_cached), (again, fed_again) = episodes(True), episodes(False)
    hook.remove()
    assert len(set(again.columns["turns"])) > 1  # some episodes end early, and leave the cache
    assert torch.equal(cached.completion_ids, again.completion_ids)
    assert torch.equal(cached.completion_mask, again.completion_mask)
    assert torch.equal(cached.environment_mask, again.environment_mask)
    torch.testing.assert_close(cached.sampling_logp, again.sampling_logp, atol=1e-5, rtol=0)
    assert fed_cached < fed_again  # the cache saved feeding the history again


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_static_engine_samples_the_episodes_the_hf_path_samples(temperature, make_module, one_torch_thread, monkeypatch):
    """Greedy: the same conversations, token for token. Sampled (the engines draw differently): the
    scored log-probs are the sampled ones on both. The static engine prefills the prompts once; every
    later turn appends to its cache."""
    from grpo_lightning.rollout.engine import StaticCacheGenerator

    prefills = []
    prefill = StaticCacheGenerator._prefill
    monkeypatch.setattr(StaticCacheGenerator, "_prefill", lambda self, *a: prefills.append(a[0].shape) or prefill(self, *a))
    environment = {**SCRIPTED, "name": f"{__name__}.PromptLengthEnvironment"}
    batch = {"prompt": ["12+34=", "5+6=", "(1+2)*3=", "1+1="]}
    rollouts = {}
    for engine in ENGINES:
        module = ending_turns(make_module(GRPO, environment=environment, rewards={"funcs": [environment_reward]},
                                          sampling={"max_new_tokens": 6}, engine={"rollout": engine}))  # fmt: skip
        sampling = dataclasses.replace(module.sampling, temperature=temperature)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            rollouts[engine] = module.generate(batch, module.settings.group_size, sampling, with_logprobs=True)
        scored = module.compute_logprobs(module.policy, rollouts[engine])
        mask = rollouts[engine].completion_mask.bool()
        torch.testing.assert_close(scored[mask], rollouts[engine].sampling_logp[mask], atol=1e-4, rtol=0)
    hf, static = rollouts["hf"], rollouts["static"]
    assert len(set(static.columns["turns"])) > 1 and max(static.columns["turns"]) == 3  # episodes leave at different turns
    assert len(prefills) == 1  # the prompts, once: every later turn appended to the cache
    if temperature == 0.0:
        assert static.columns["conversation"] == hf.columns["conversation"]
        assert torch.equal(static.completion_ids, hf.completion_ids)
        assert torch.equal(static.completion_mask, hf.completion_mask)
        assert torch.equal(static.environment_mask, hf.environment_mask)
        torch.testing.assert_close(static.sampling_logp, hf.sampling_logp, atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("engine", [{"rollout": "static", "compile": False}, {}], ids=["graphs", "auto"])
def test_static_engine_episodes_on_cuda_score_exactly_the_sampled_tokens(engine, make_module):
    """On CUDA (CUDA graphs; ``auto``: also the compiled step, fused projections and Triton kernels),
    the trainer scores the ids the static engine sampled across turns, with their log-probs."""
    module = ending_turns(make_module(GRPO, environment=SCRIPTED, rewards={"funcs": [environment_reward]}, sampling={"max_new_tokens": 6},
                                      engine=engine)).to("cuda")  # fmt: skip
    assert module.engine_plan.rollout == "static"
    torch.manual_seed(0)
    rollout = module.generate({"prompt": ["12+34=", "5+6="]}, module.settings.group_size, module.sampling, with_logprobs=True)
    reply = module.tokenizer(REPLY, add_special_tokens=False)["input_ids"]
    for row in range(len(rollout)):
        parts = segments(rollout, row)
        turns = [ids for is_model, ids in parts if is_model]
        assert [ids for is_model, ids in parts if not is_model] == [reply] * (len(turns) - 1)
        assert all(ids[-1] == module.tokenizer.eos_token_id for ids in turns[:-1])
        assert rollout.columns["turns"][row] == len(turns)
    assert max(rollout.columns["turns"]) > 1
    assert module.sampler.engine._graphs  # the decode steps ran as CUDA graphs
    scored = module.compute_logprobs(module.policy, rollout)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(scored[mask], rollout.sampling_logp[mask], atol=1e-3, rtol=0)


def scripted(model, tokens: list[int]):
    """Makes a real tiny model write ``tokens``, one per forward call across its turns: a forward hook
    overwrites its last logits. Scripted because a random tiny model does not write degenerate output
    on demand; everything after the logits (sampling, decoding, the environment, the rollout) is real."""
    calls = iter(tokens)

    def hook(module, args, output):
        token = next(calls)
        output.logits[:, -1, :] = float("-inf")
        output.logits[:, -1, token] = 0.0

    return model.register_forward_hook(hook)


def test_a_turn_of_five_thousand_nested_brackets_is_a_counted_bad_call_and_the_episode_goes_on(tmp_path, one_torch_thread):
    from grpo_lightning.quickstart.tiny import save_tiny_model, tiny_config
    from grpo_lightning.runtime.metrics import StepMetrics
    from grpo_lightning.training.rollout_metrics import record_rollout
    from tests.helpers import CHATML, byte_tokenizer

    tokenizer = byte_tokenizer(CHATML)
    tokenizer.add_tokens(["<tool_call>", "[" * 100])  # one token each, so that the turn is 52 tokens
    call, brackets = tokenizer.convert_tokens_to_ids(["<tool_call>", "[" * 100])
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         max_position_embeddings=2048)  # fmt: skip
    directory = save_tiny_model(tmp_path / "chatml", tokenizer, config)
    environment = {"name": "grpo_lightning.agents.CalculatorEnvironment", "max_turns": 2, "max_tokens": 400}
    module = GRPO(model=str(directory), environment=environment, rewards={"funcs": [environment_reward]}, kl={"beta": 0.0},
                  sampling={"group_size": 2, "max_new_tokens": 60}, engine={"rollout": "hf"})  # fmt: skip
    module.configure_model()
    eos = module.tokenizer.eos_token_id
    answer = module.tokenizer("42", add_special_tokens=False)["input_ids"]
    hook = scripted(module.policy, [call] + [brackets] * 50 + [eos] + answer + [eos])
    rollout = module.generate({"prompt": ["What is 2 + 40?"], "answer": ["42"]}, 2, module.sampling)
    hook.remove()
    module.score(rollout)
    for conversation in rollout.columns["conversation"]:
        assert conversation[0]["content"] == "<tool_call>" + "[" * 5000
        assert conversation[1]["content"] == "Error: the tool call nests JSON deeper than 64 levels."
        assert conversation[2]["content"] == "42"
    assert rollout.columns["tool_errors"] == [{"bad_call": 1}] * 2
    assert rollout.rewards.tolist() == [1.0, 1.0]  # the answer after the bad call was scored
    metrics = StepMetrics()
    record_rollout(metrics, rollout)
    assert metrics.compute_and_reset()["agent/tool_errors/bad_call"] == 1.0


class FailingEnvironment(ScriptedEnvironment):
    """The scripted environment, raising in ``reset`` or ``step`` (``raise_in``) on the prompt ``5+6=``."""

    def __init__(self, raise_in: str = "step") -> None:
        super().__init__()
        self.raise_in, self.failing = raise_in, False

    def reset(self, row):
        self.failing = row["prompt"] == "5+6="
        if self.failing and self.raise_in == "reset":
            raise KeyError("no such task")
        return super().reset(row)

    def step(self, message):
        if self.failing and self.raise_in == "step":
            raise ConnectionError("the game server\nis down")
        return super().step(message)


def failing_episodes(make_module, raise_in: str, max_error_fraction: float | None = None):
    """Episodes of ``12+34=`` and ``5+6=`` (4 each), whose environment raises on ``5+6=``."""
    from grpo_lightning.agents.multi_turn import sample_episodes

    environment = {**SCRIPTED, "name": f"{__name__}.FailingEnvironment", "args": {"raise_in": raise_in}}
    if max_error_fraction is not None:
        environment["max_error_fraction"] = max_error_fraction
    module = ending_turns(make_module(GRPO, environment=environment, rewards={"funcs": [environment_reward]},
                                      sampling={"max_new_tokens": 6}))  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return sample_episodes(module.policy, module.tokenizer, {"prompt": ["12+34=", "5+6="]}, 4, module.sampling,
                               module.environment)  # fmt: skip


@pytest.mark.parametrize(("raise_in", "error"), [("reset", "KeyError: 'no such task'"), ("step", "ConnectionError: the game server is down")])
def test_an_environment_that_raises_ends_that_episode_only_with_reward_zero_and_is_counted(
    raise_in, error, make_module, one_torch_thread
):
    from grpo_lightning.runtime.metrics import StepMetrics
    from grpo_lightning.training.rollout_metrics import record_rollout

    rollout = failing_episodes(make_module, raise_in, max_error_fraction=0.5)
    errors = rollout.columns["environment_error"]
    failed = [row for row, e in enumerate(errors) if e is not None]
    assert failed and set(failed) <= {4, 5, 6, 7}  # only episodes of 5+6=
    assert all(errors[row] == f"{raise_in} raised {error}" for row in failed)
    assert all(rollout.columns["environment_reward"][row] == 0.0 for row in failed)
    assert all(rollout.columns["turns"][row] == (0 if raise_in == "reset" else 1) for row in failed)
    others = rollout.columns["environment_reward"][:4]
    assert 3.0 in others and set(others) <= {0.0, 3.0}  # the other task's episodes ran as scripted
    metrics = StepMetrics()
    record_rollout(metrics, rollout)
    assert metrics.compute_and_reset()["agent/environment_errors"] == len(failed) / 8


def test_more_failed_episodes_than_max_error_fraction_stop_the_rollout_naming_the_environment_and_the_error(
    make_module, one_torch_thread
):
    from grpo_lightning.agents.environment import EnvironmentFailureError

    with pytest.raises(EnvironmentFailureError) as raised:
        failing_episodes(make_module, "reset")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"environment: {__name__}.FailingEnvironment raised in 4 of 8 episodes of a step")
    assert "environment.max_error_fraction (0.1)" in message and "reset raised KeyError: 'no such task'" in message
