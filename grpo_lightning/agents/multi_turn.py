"""Multi-turn rollouts: model turns and environment replies, token in, token out.

Every trajectory keeps its token ids as sampled; a model turn continues them from the cache the
last turn left (``model.generate`` on the HF path, or the static engine's
:meth:`~grpo_lightning.rollout.engine.StaticCacheGenerator.sample_turn`; :mod:`~grpo_lightning.agents.turn_cache`),
an environment reply appends
the ids of its rendered text (:class:`~grpo_lightning.agents.chat_tokens.ChatTokens`). Nothing is
decoded and encoded again, so the trainer scores the sampled tokens. The model's tokens are the
rollout's ``completion_mask`` (loss, token counts), the replies' its ``environment_mask`` (attended
to, never trained on).

An environment that raises (in ``reset``, ``step`` or a reply the chat template cannot render) ends
that episode with reward 0, counted; past ``environment.max_error_fraction`` of the episodes the fit
stops (:class:`~grpo_lightning.agents.environment.EnvironmentFailureError`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from grpo_lightning.agents.chat_tokens import ChatTokens
from grpo_lightning.agents.environment import Environment, EnvironmentFailureError, EnvironmentOptions
from grpo_lightning.agents.messages import Message
from grpo_lightning.agents.turn_cache import EngineTurns, HFTurns, left_padded
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.errors import ConfigError
from grpo_lightning.rollout.generation.sampler import RolloutSampler
from grpo_lightning.rollout.types import Rollout, SamplingParams


def multi_turn_engine(options: EngineOptions, rollout_seed: int | None, beam_search: bool) -> EngineOptions:
    """The engine options of multi-turn rollouts, checked: each turn is sampled, without keyed sampling."""
    if beam_search:
        raise ConfigError("sampling.mode: multi-turn rollouts (environment) sample each turn; set sampling.mode to 'sample'.")
    if rollout_seed is not None:
        raise ConfigError(
            "sampling.seed: keyed sampling draws each completion's tokens by their index in it, which multi-turn "
            "rollouts (environment) would repeat at every turn; leave sampling.seed unset, or drop --model.environment."
        )
    return options


@dataclass
class Trajectory:
    """One episode: its environment, token ids after the prompt and, for each, whether the model sampled it."""

    environment: Environment | None  # None: it could not be made or reset
    chat: ChatTokens
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    from_model: list[bool] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    conversation: list[dict] = field(default_factory=list)  # the turns after the prompt, by source
    reward: float = 0.0
    turns: int = 0
    finished: bool = False
    truncated: bool = False
    error: str | None = None  # what the environment raised, which ended the episode

    def append(self, ids: list[int], from_model: bool, logp: list[float] | None = None) -> None:
        self.ids += ids
        self.from_model += [from_model] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)

    def end(self, truncated: bool = False) -> None:
        self.finished, self.truncated = True, truncated

    def fail(self, where: str, error: Exception) -> None:
        """The environment raised ``error`` in ``where``: the episode ends, with reward 0."""
        self.error = f"{where} raised {type(error).__name__}: {' '.join(str(error).split())}"[:300]
        self.reward = 0.0
        self.end()


def start(options: EnvironmentOptions, row: dict, tokenizer: PreTrainedTokenizerBase, use_chat_template: bool) -> Trajectory:
    """A new episode on ``row``. One whose environment cannot be made or reset is over before its
    first turn (failed), the row's prompt its user message."""
    try:
        environment = options.make(row)
        chat = ChatTokens(tokenizer, getattr(environment, "tools", ()), use_chat_template)
        return Trajectory(environment, chat, chat.prompt_ids(environment.reset(row)))
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - an environment's failure ends its episode, counted
        chat = ChatTokens(tokenizer, (), use_chat_template)
        episode = Trajectory(None, chat, chat.prompt_ids([{"role": "user", "content": str(row.get("prompt", ""))}]))
        episode.fail("reset", error)
        return episode


def reply(episode: Trajectory, text: str) -> tuple[list[Message], list[int], bool] | None:
    """The environment's ``(messages, their ids, done)`` after the model's turn ``text`` (its reward
    added to the episode's); ``None`` when the environment raised (the episode failed)."""
    try:
        messages, reward, done = episode.environment.step({"role": "assistant", "content": text})
        episode.reward += 0.0 if reward is None else float(reward)
        return messages, ([] if done else episode.chat.reply_ids(messages)), done
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - an environment's failure ends its episode, counted
        episode.fail("step", error)
        return None


def finish(episode: Trajectory) -> None:
    """Add the environment's ``final_reward()`` (where it has one) to the ended episode's reward;
    one that raises fails the episode."""
    final_reward = getattr(episode.environment, "final_reward", None)
    if final_reward is None or episode.error is not None:
        return
    try:
        value = final_reward()
        episode.reward += 0.0 if value is None else float(value)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - an environment's failure ends its episode, counted
        episode.fail("final_reward", error)


def stop_if_too_many_failed(episodes: list[Trajectory], options: EnvironmentOptions) -> None:
    """An :class:`EnvironmentFailureError` when more than ``options.max_error_fraction`` of the episodes failed."""
    failed = [e.error for e in episodes if e.error is not None]
    if len(failed) > options.max_error_fraction * len(episodes):
        raise EnvironmentFailureError(
            f"environment: {options.name} raised in {len(failed)} of {len(episodes)} episodes of a step, more than "
            f"environment.max_error_fraction ({options.max_error_fraction:g}) allows; the first: {failed[0]}. Fix the "
            "environment, or raise environment.max_error_fraction."
        )


def right_padded(rows: list[list], value, dtype: torch.dtype, device: torch.device) -> Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype, device=device)


@torch.no_grad()
def sample_episodes(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    batch: dict[str, list],
    group_size: int,
    sampling: SamplingParams,
    options: EnvironmentOptions,
    use_chat_template: bool = True,
    with_logprobs: bool = False,
    sampler: RolloutSampler | None = None,
    reuse_cache: bool = True,
) -> Rollout:
    """``group_size`` episodes of each row of ``batch``, as one :class:`Rollout` (``N = P * G``
    rows, group-major); each turn samples at most ``sampling.max_new_tokens`` tokens. On the static
    engine where ``sampler``'s plan says so (:class:`EngineTurns`), else on the HF path
    (:class:`HFTurns`); there ``reuse_cache``: each turn continues the last one's KV cache, else
    feeds the whole history again."""
    device = next(model.parameters()).device
    # A turn ends at the tokenizer's EOS alone: the token ChatTokens checks the chat template ends a turn with.
    sampling = replace(sampling, stop_token_ids=())
    rows = [dict(zip(batch, values)) for values in zip(*batch.values())]
    episodes = [start(options, row, tokenizer, use_chat_template) for row in rows for _ in range(group_size)]
    stop_if_too_many_failed(episodes, options)
    budget, eos = options.token_budget(sampling.max_new_tokens), tokenizer.eos_token_id
    engine = None if sampler is None else sampler.turn_engine(model, len(episodes), sampling)
    if engine is not None:
        turns = EngineTurns(engine, tokenizer, len(episodes), max(len(e.prompt_ids) for e in episodes) + budget)
    else:
        turns = HFTurns(model, tokenizer, reuse_cache)
    for turn in range(options.max_turns):
        active = [number for number, e in enumerate(episodes) if not e.finished]
        if not active:
            break
        limits = [min(sampling.max_new_tokens, budget - len(episodes[n].ids)) for n in active]
        turn_sampling = replace(sampling, max_new_tokens=max(limits), min_new_tokens=min(sampling.min_new_tokens, min(limits)))
        histories = [episodes[n].prompt_ids + episodes[n].ids for n in active]
        new_ids, new_logp = turns.sample(active, histories, turn_sampling)
        for row, (number, ids, logp, limit) in enumerate(zip(active, new_ids.tolist(), new_logp.tolist(), limits)):
            episode, ids = episodes[number], ids[:limit]
            length = ids.index(eos) + 1 if eos in ids else len(ids)
            turns.kept(row, length, ids[length - 1])
            episode.append(ids[:length], True, logp[:length])
            episode.turns += 1
            text = tokenizer.decode(ids[:length], skip_special_tokens=True)
            episode.conversation.append({"role": "assistant", "content": text})
            if eos not in ids:
                episode.end(truncated=True)  # the turn was cut: no reply can follow it
                continue
            outcome = reply(episode, text)
            if outcome is None:
                continue
            replies, reply_ids, done = outcome
            if done:
                episode.end()
                continue
            if turn == options.max_turns - 1 or len(episode.ids) + len(reply_ids) >= budget:
                episode.end(truncated=True)
                continue
            episode.append(reply_ids, False)
            turns.replied(row, reply_ids)
            episode.conversation += [{"role": m.get("role", "user"), "content": str(m.get("content", ""))} for m in replies]
        stop_if_too_many_failed(episodes, options)
    for episode in episodes:
        finish(episode)
    stop_if_too_many_failed(episodes, options)
    return episodes_rollout(episodes, tokenizer, batch, group_size, device, with_logprobs)


def episodes_rollout(episodes, tokenizer, batch, group_size, device, with_logprobs) -> Rollout:
    """The :class:`Rollout` of finished episodes, with their counts and turns as columns (``environment_reward``,
    ``turns``, ``tool_calls``, ``tool_errors``, ``environment_error``, ``conversation``; ``environments``,
    the instances, for TRL-style environments)."""
    prompt_ids, prompt_mask = left_padded([e.prompt_ids for e in episodes], tokenizer.pad_token_id, device)
    completion_ids = right_padded([e.ids for e in episodes], tokenizer.pad_token_id, torch.long, device)
    model_mask = right_padded([[float(m) for m in e.from_model] for e in episodes], 0.0, torch.float32, device)
    environment_mask = right_padded([[float(not m) for m in e.from_model] for e in episodes], 0.0, torch.float32, device)

    def repeat(values: list) -> list:
        return [v for v in values for _ in range(group_size)]

    columns = {k: repeat(v) for k, v in batch.items() if k not in ("prompt", "completion", "completions")}
    columns["environment_reward"] = [e.reward for e in episodes]
    columns["turns"] = [e.turns for e in episodes]
    columns["tool_calls"] = [getattr(e.environment, "tool_calls", 0) for e in episodes]
    columns["tool_errors"] = [dict(getattr(e.environment, "tool_errors", Counter())) for e in episodes]
    columns["environment_error"] = [e.error for e in episodes]
    columns["conversation"] = [e.conversation for e in episodes]
    if any(hasattr(e.environment, "trl_environment") for e in episodes):  # TRL-style reward functions read them
        columns["environments"] = [getattr(e.environment, "trl_environment", None) for e in episodes]
    return Rollout(
        group_size=group_size,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=model_mask,
        truncated=torch.tensor([e.truncated for e in episodes], device=device),
        prompts=repeat(list(batch["prompt"])),
        completions=[tokenizer.decode(e.ids, skip_special_tokens=True) for e in episodes],
        columns=columns,
        sampling_logp=right_padded([e.logp for e in episodes], 0.0, torch.float32, device) if with_logprobs else None,
        environment_mask=environment_mask,
    )
