"""A supervised warm start that teaches a pretrained chat model the calculator's call format, in its own chat template.

GRPO cannot start a model calling a tool it never calls: SmolLM2-135M-Instruct, shown a call in its
prompt, called in under 1% of its episodes and got no three-digit product right, so every group's
rewards were equal. This warm start fine-tunes such a model on episodes of
:class:`~grpo_lightning.agents.CalculatorEnvironment` rendered through the model's chat template exactly
as a rollout renders them (:class:`~grpo_lightning.agents.chat_tokens.ChatTokens`: the tools' schema,
the JSON call ``<tool_call>{"name": "calculator", ...}</tool_call>``, the tool's reply, the number), and
on the same problems answered at once. As for the tiny model (:mod:`~grpo_lightning.quickstart.calculator_warmstart`),
the call format and the copying of the tool's reply are learned from at least half of each batch,
while the loss on a call's opening token is kept so that openings are calls ``call_fraction`` of
the time: the model knows how to call, and reinforcement learning teaches it when to.

``warmstart:calculator:<model>`` (a ``model`` setting) trains it on first use, on a GPU when there is
one (seconds for a 135M model; many minutes on a CPU), and caches it under a hash of the settings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from grpo_lightning.agents.calculator import CalculatorEnvironment
from grpo_lightning.quickstart.calculator_warmstart import episode_transcript, opening_controlled_batches
from grpo_lightning.agents.chat_tokens import ChatTokens
from grpo_lightning.data.arithmetic import make_arithmetic_dataset
from grpo_lightning.quickstart.cached_build import MARKER_FILE, build_once, default_cache_dir, environment, records_key
from grpo_lightning.quickstart.supervised import fit_steps, mean_losses, padded_rows

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1
#: The prompt template of the arithmetic data the warm start is trained on; a recipe must ask the same way.
CHAT_TEMPLATE = "What is {a} {op} {b}?"


@dataclass(frozen=True)
class ChatWarmStartSettings:
    """Everything that determines the model; its hash names the cache folder. The data settings are
    those of the recipe (``configs/recipes/calculator_smollm2.yaml``), so its validation split stays unseen."""

    base: str
    """The model to start from (a hub id, a directory, a GGUF file, ``package:...``)."""
    template: str = CHAT_TEMPLATE
    digits: int = 3
    num_train: int = 2000
    num_val: int = 200
    data_seed: int = 0
    call_fraction: float = 0.3
    steps: int = 300
    batch_size: int = 32
    learning_rate: float = 3e-5
    warmup_steps: int = 30
    weight_decay: float = 0.0
    seed: int = 0

    def cache_key(self) -> str:
        payload = json.dumps({"version": _FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def json_call(expression: str) -> str:
    """A calculator call in the chat template's format (``tool_call_format: json_tags``)."""
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


def chat_transcripts(
    tokenizer: PreTrainedTokenizerBase, settings: ChatWarmStartSettings, split: str = "train"
) -> list[tuple[list[int], list[int]]]:
    """Each problem of ``split`` twice: answered at once (``2 i``) and with a call (``2 i + 1``)."""
    data = [
        make_arithmetic_dataset(settings.num_train, settings.num_val, settings.digits, "*", settings.data_seed, template)[split]
        for template in (settings.template, "{a} {op} {b}")
    ]  # the same problems in the same order: prompts and the expressions to call with
    env = CalculatorEnvironment()
    chat = ChatTokens(tokenizer, env.tools)
    return [
        episode_transcript(chat, env, {"prompt": prompt, "answer": answer}, [json_call(expression), answer][1 - call :])
        for prompt, expression, answer in zip(data[0]["prompt"], data[1]["prompt"], data[0]["answer"])
        for call in (0, 1)
    ]


def chat_calculator_warm_start(base: str, output_dir: str | Path | None = None, **settings) -> Path:
    """Fine-tune (or reuse) ``base`` on calculator transcripts in its chat format; its ``save_pretrained``
    directory. ``settings``: the other fields of :class:`ChatWarmStartSettings`; with ``output_dir=None``
    the directory is ``default_cache_dir() / "calculator-chat-<hash of the settings>"``."""
    chosen = ChatWarmStartSettings(base=base, **settings)
    key = chosen.cache_key()
    output = Path(output_dir) if output_dir is not None else default_cache_dir() / f"calculator-chat-{key}"

    def build(out: Path) -> None:
        started = time.perf_counter()
        model, tokenizer, losses, device = fine_tune_on_transcripts(chosen)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        record = {"key": key, "settings": asdict(chosen), "losses": losses, "device": device,
                  "seconds": time.perf_counter() - started, "environment": environment()}  # fmt: skip
        (out / MARKER_FILE).write_text(json.dumps(record, indent=2) + "\n")

    what = f"{base} fine-tuned on calculator calls"
    return build_once(output, records_key(key), build, what, f"{chosen.steps} training steps: seconds on a GPU, many minutes on a CPU")


def fine_tune_on_transcripts(settings: ChatWarmStartSettings) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, list, str]:
    """``settings.base`` fitted to the transcripts (float32 weights, bf16 autocast on a GPU); the mean
    loss every 50 steps, and the device it ran on."""
    from grpo_lightning.models.sources import load_tokenizer
    from grpo_lightning.models.policy import load_causal_lm

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    tokenizer = load_tokenizer(settings.base, "model")
    input_ids, attention_mask, labels = padded_rows(chat_transcripts(tokenizer, settings), tokenizer.pad_token_id)
    batches = opening_controlled_batches(input_ids, attention_mask, labels, settings.call_fraction, settings.batch_size)
    logger.info("Warm-starting %s on calculator transcripts: %d steps on %s", settings.base, settings.steps, device)
    after_step, losses = mean_losses(settings.steps)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(settings.seed)
        generator = torch.Generator().manual_seed(settings.seed)

        def next_batch() -> dict[str, torch.Tensor]:
            batch = batches(generator)
            width = int(batch["attention_mask"].sum(1).max())  # right padding: the batch's longest
            return {name: tensor[:, :width].to(device) for name, tensor in batch.items()}

        model = load_causal_lm(settings.base, "float32", None).to(device)
        autocast = torch.bfloat16 if device.type == "cuda" else None
        fit_steps(model, settings, settings.steps, next_batch, after_step, autocast_dtype=autocast)
    return model.cpu(), tokenizer, losses, str(device)
