"""A supervised warm start that teaches the tiny model the calculator recipe's call format.

The transcripts are episodes of :class:`~grpo_lightning.agents.CalculatorEnvironment` on the
recipe's 3-digit products, tokenised exactly as a rollout tokenises them: the prompt, a call
``<think>a*b</think>`` and EOS, the tool's reply, then ``<answer>product</answer>`` and EOS. Each
problem is also written answered at once, which a model this small cannot do for 3-digit products.
Two things are learned apart: a batch draws the call transcript at least half the time, so the call
format and the copying of the tool's reply are learned well; but the loss on a call's opening token
is kept just often enough that the model is taught to open with a call ``call_fraction`` of the time.
Greedy decoding calls where that probability passes one half: 0.3 keeps it far below (at 0.45 a
platform's rounding flipped it), so the model knows the format but answers in its head, and
reinforcement learning has to teach it when to call. The model's tokens carry the loss; the prompt
and the tool's reply do not. Results are cached under a hash of the settings, like the quickstart's
warm start.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from grpo_lightning.agents.calculator import CalculatorEnvironment, think_expression_calls
from grpo_lightning.agents.chat_tokens import ChatTokens
from grpo_lightning.agents.tool_environment import ToolEnvironment
from grpo_lightning.data.arithmetic import format_target, make_arithmetic_dataset
from grpo_lightning.errors import ConfigError
from grpo_lightning.quickstart.supervised import SupervisedSettings, mean_losses, padded_rows, train_steps
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_model_and_tokenizer
from grpo_lightning.quickstart.cached_build import MARKER_FILE, build_once, default_cache_dir, environment, records_key

_FORMAT_VERSION = 3
_CALL_TRANSCRIPT_SHARE = 0.5  # of a batch at least, whatever ``call_fraction``: enough to learn copying the reply


@dataclass(frozen=True)
class CalculatorWarmStartSettings(SupervisedSettings):
    """Everything that determines the model; its hash names the cache folder. The data settings are
    the calculator recipe's, so its validation split stays unseen."""

    digits: int = 3
    num_train: int = 2000
    num_val: int = 200
    data_seed: int = 0
    call_fraction: float = 0.3
    steps: int = 600

    def cache_key(self) -> str:
        """A hash of the settings and of the tokenizer's vocabulary (a new alphabet trains again)."""
        vocabulary = json.dumps(build_char_tokenizer().get_vocab(), sort_keys=True)
        payload = json.dumps({"version": _FORMAT_VERSION, "vocabulary": vocabulary, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def episode_transcript(
    chat: ChatTokens, environment: ToolEnvironment, row: dict, turns: list[str]
) -> tuple[list[int], list[int]]:
    """One episode's token ids, as a rollout builds them, and its labels (``-100`` off the model's
    turns): the prompt of ``row``, then each model turn of ``turns`` with its EOS, followed, but for
    the last, by the environment's reply to it (``turns[:-1]`` must be tool calls)."""
    tokenizer = chat.tokenizer
    ids = chat.prompt_ids(environment.reset(row))
    labels = [-100] * len(ids)
    for number, text in enumerate(turns):
        turn = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        ids.extend(turn)
        labels.extend(turn)
        if number < len(turns) - 1:
            replies, _, done = environment.step({"role": "assistant", "content": text})
            if done or not replies:
                raise ValueError(f"the environment read no tool call in {text!r}")
            reply = chat.reply_ids(replies)
            ids.extend(reply)
            labels.extend([-100] * len(reply))
    return ids, labels


def calculator_transcript(
    tokenizer: PreTrainedTokenizerBase, prompt: str, answer: str, call: bool
) -> tuple[list[int], list[int]]:
    """The tiny model's episode on ``prompt`` (``"123*456="``): a call ``<think>123*456</think>``
    then ``<answer>product</answer>``, or (``call`` false) the answer at once."""
    env = CalculatorEnvironment(tool_call_format=think_expression_calls)
    chat = ChatTokens(tokenizer, env.tools, use_chat_template=False)
    turns = [f"<think>{prompt.rstrip('=')}</think>"] if call else []
    return episode_transcript(chat, env, {"prompt": prompt, "answer": answer}, [*turns, format_target(answer)])


@torch.no_grad()
def call_probability(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[str], chat: ChatTokens | None = None,
    opening: str = "<think>",
) -> torch.Tensor:
    """Per prompt, the probability that the model's first token is the first of ``opening`` (the
    text a call starts with): how far its greedy choice is from flipping. ``chat``: how prompts are
    rendered (the tiny model's plain text by default)."""
    env = CalculatorEnvironment()
    chat = chat or ChatTokens(tokenizer, env.tools, use_chat_template=False)
    rows = [chat.prompt_ids(env.reset({"prompt": prompt, "answer": ""})) for prompt in prompts]
    width = max(len(ids) for ids in rows)
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids in rows], device=device)
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in rows], device=device)
    logits = model(input_ids=input_ids, attention_mask=mask).logits  # right padding: earlier positions unchanged
    last = logits[torch.arange(len(rows)), torch.tensor([len(ids) - 1 for ids in rows])].float()
    return last.softmax(-1)[:, tokenizer.encode(opening, add_special_tokens=False)[0]]


def calculator_warm_start(output_dir: str | Path | None = None, **settings) -> Path:
    """Train (or reuse) the calculator recipe's start model and return its ``save_pretrained`` directory.

    ``settings`` are fields of :class:`CalculatorWarmStartSettings`. With ``output_dir=None`` the
    directory is ``default_cache_dir() / "calculator-<hash of the settings>"``.
    """
    chosen = CalculatorWarmStartSettings(**settings)
    key = chosen.cache_key()
    if output_dir is None:
        output_dir = default_cache_dir() / f"calculator-{key}"

    def build(out: Path) -> None:
        started = time.perf_counter()
        model, tokenizer, losses = train_calculator_model(chosen)
        save_model_and_tokenizer(model, tokenizer, out)
        record = {"key": key, "settings": asdict(chosen), "losses": losses, "seconds": time.perf_counter() - started}
        (out / MARKER_FILE).write_text(json.dumps({**record, "environment": environment()}, indent=2) + "\n")

    takes = f"{chosen.steps} training steps on one CPU thread; a few minutes for the default {CalculatorWarmStartSettings.steps}"
    return build_once(Path(output_dir), records_key(key), build, "the calculator recipe's tiny model", takes)


def call_opening_rates(call_fraction: float) -> tuple[float, float]:
    """The share of call transcripts in a batch, and the probability that a call transcript keeps
    the loss on its opening token, for the opening tokens trained to be calls ``call_fraction`` of the time."""
    if not 0.0 <= call_fraction <= 1.0:
        raise ConfigError(f"call_fraction={call_fraction}: use a probability in [0, 1]")
    share = max(_CALL_TRANSCRIPT_SHARE, call_fraction)
    if call_fraction == 1.0:
        return share, 1.0
    return share, call_fraction * (1 - share) / (share * (1 - call_fraction))


def train_calculator_model(settings: CalculatorWarmStartSettings) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, list]:
    """Fit a fresh tiny model to the transcripts of the training split; the mean loss every 50 steps."""
    tokenizer = build_char_tokenizer()
    config = settings.model_config(tokenizer)
    train = make_arithmetic_dataset(
        settings.num_train, settings.num_val, settings.digits, "*", settings.data_seed
    )["train"]
    rows = [  # each problem twice: answered at once (2 i), and with a call (2 i + 1)
        calculator_transcript(tokenizer, prompt, answer, call)
        for prompt, answer in zip(train["prompt"], train["answer"])
        for call in (False, True)
    ]
    input_ids, attention_mask, labels = padded_rows(rows, tokenizer.pad_token_id)
    if input_ids.shape[1] > settings.max_position_embeddings:
        raise ValueError(f"transcripts are {input_ids.shape[1]} tokens long but max_position_embeddings={settings.max_position_embeddings}")
    batch = opening_controlled_batches(input_ids, attention_mask, labels, settings.call_fraction, settings.batch_size)
    after_step, losses = mean_losses(settings.steps)
    model, _ = train_steps(settings, config, settings.steps, batch, after_step)
    return model, tokenizer, losses


def opening_controlled_batches(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, call_fraction: float, batch_size: int
) -> Callable[[torch.Generator], dict[str, torch.Tensor]]:
    """Batches of transcripts whose rows alternate a problem answered at once (``2 i``) and with a
    call (``2 i + 1``): call transcripts are drawn often enough to learn the format and the copying
    of the tool's reply, and the loss on a call's opening token kept so that openings are calls
    ``call_fraction`` of the time (:func:`call_opening_rates`)."""
    opening = (labels != -100).long().argmax(1)  # each transcript's first trained token
    call_share, opening_kept = call_opening_rates(call_fraction)
    problems_count = len(input_ids) // 2

    def batch(generator: torch.Generator) -> dict[str, torch.Tensor]:
        problems = torch.randint(problems_count, (batch_size,), generator=generator)
        calls = torch.rand(batch_size, generator=generator) < call_share
        picked = 2 * problems + calls.long()
        batch_labels = labels[picked].clone()
        untaught = calls & (torch.rand(batch_size, generator=generator) >= opening_kept)
        batch_labels[untaught, opening[picked][untaught]] = -100
        return dict(input_ids=input_ids[picked], attention_mask=attention_mask[picked], labels=batch_labels)

    return batch
