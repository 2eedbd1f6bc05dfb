"""Tiny tokenizers and randomly initialised causal LMs for offline runs and tests.

Every tokenizer built here is a byte-level BPE with the same normalizer,
pre-tokenizer and decoder as the Qwen2 tokenizer. ``AutoTokenizer`` in
transformers 5 may rebuild a saved tokenizer as the model type's own class
(``Qwen2Tokenizer`` for ``model_type="qwen2"``), keeping only the vocabulary,
merges and added tokens from ``tokenizer.json``; matching that pipeline makes
the reloaded tokenizer behave identically whichever class is chosen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

PAD_TOKEN = "<pad>"
EOS_TOKEN = "</s>"
BOS_TOKEN = "<s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)
DEFAULT_ALPHABET = "0123456789+-*=() .,"
#: Printable ASCII (letters, digits, punctuation, space) with newline and tab: any English prompt
#: reaches the model whole. The quickstart's model reads this alphabet.
TEXT_ALPHABET = DEFAULT_ALPHABET + "".join(
    ch for ch in map(chr, range(ord(" "), ord("~") + 1)) if ch not in DEFAULT_ALPHABET
) + "\n\t"
DEFAULT_SPECIAL_WORDS = ("<think>", "</think>", "<answer>", "</answer>")

# Pre-tokenization regex of the Qwen2 tokenizer.
_QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_WORD_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_TOKENIZER_CLASS = "PreTrainedTokenizerFast"

ROUNDTRIP_SAMPLES = (
    "37+45=<answer>82</answer>",
    "<think>3*4=12</think> <answer>12</answer>",
    "(12-5)*3 = 21, 0.5 .",
    "  9  ",
)
TEXT_ROUNDTRIP_SAMPLES = (
    "Which is larger, 27 or 82?",
    "Q: Is 'x' < \"y\"?\n\tA: {yes}; [no] | maybe! @#$%^&_~`",
)


@lru_cache(maxsize=1)
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level mapping from byte values to printable characters."""
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codepoints = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codepoints.append(256 + extra)
            extra += 1
    return {byte: chr(cp) for byte, cp in zip(printable, codepoints)}


def _byte_level(text: str) -> str:
    """Return ``text`` in byte-level (GPT-2) symbols."""
    table = _byte_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


def _qwen2_compatible_fast_tokenizer(
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    special_words: Sequence[str] = (),
) -> PreTrainedTokenizerFast:
    """Wrap a byte-level BPE vocabulary into a ``PreTrainedTokenizerFast``."""
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    if special_words:
        backend.add_tokens([AddedToken(w, special=False, normalized=False) for w in special_words])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.padding_side = "left"
    return tokenizer


def build_char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET,
    special_words: Sequence[str] = DEFAULT_SPECIAL_WORDS,
) -> PreTrainedTokenizerFast:
    """One token per character of ``alphabet``; each of ``special_words`` is one (non-special) token.

    Special tokens: ``<pad>`` (id 0), ``</s>``, ``<s>``, ``<unk>``. Characters outside the
    alphabet are dropped when encoding (as the Qwen2 tokenizer class does), so the
    alphabet must cover every character the task produces. Only ASCII is supported.
    """
    if not alphabet.isascii():
        raise ValueError("alphabet must be ASCII: each character must be a single byte")
    symbols = list(dict.fromkeys(_byte_level(ch) for ch in alphabet))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *symbols])}
    return _qwen2_compatible_fast_tokenizer(vocab, merges=[], special_words=special_words)


def _word_level_entries(count: int) -> list[str]:
    """The first ``count`` strings over a-z in length-then-lexicographic order (prefix closed)."""
    words: list[str] = []
    level = [""]
    while len(words) < count:
        level = [prefix + letter for prefix in level for letter in _WORD_LETTERS]
        words.extend(level[: count - len(words)])
    return words


def build_word_level_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A tokenizer with exactly ``vocab_size`` entries, for speed benchmarks with large vocabularies.

    Entries are the special tokens, a space symbol, the letters a-z, then whole words
    " a", " b", ..., " aa", ... each a single token. Decoding any ids and encoding the
    text again gives the same ids back when every id is a word token.
    """
    space = _byte_level(" ")
    base = [*SPECIAL_TOKENS, space, *_WORD_LETTERS]
    min_size = len(base) + len(_WORD_LETTERS)
    if vocab_size < min_size:
        raise ValueError(f"vocab_size must be at least {min_size}, got {vocab_size}")
    words = _word_level_entries(vocab_size - len(base))
    vocab = {token: i for i, token in enumerate(base + [space + w for w in words])}
    merges = [(space + w[:-1], w[-1]) for w in words]
    return _qwen2_compatible_fast_tokenizer(vocab, merges)


def word_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids of the whole-word tokens of a tokenizer from ``build_word_level_tokenizer``."""
    space = _byte_level(" ")
    return sorted(i for t, i in tokenizer.get_vocab().items() if t.startswith(space) and len(t) > 1)


def tiny_config(
    tokenizer: PreTrainedTokenizerBase,
    model_type: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 128,
    tie_word_embeddings: bool = True,
    **overrides: Any,
) -> PretrainedConfig:
    """Config for a small decoder-only model sized to ``tokenizer`` (``qwen2``, ``llama``, ...)."""
    settings: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    settings.update(overrides)
    return AutoConfig.for_model(model_type, **settings)


def save_tiny_model(
    path: str | Path,
    tokenizer: PreTrainedTokenizerFast,
    config: PretrainedConfig,
    seed: int = 0,
) -> Path:
    """Randomly initialise a causal LM from ``config`` and save it with ``tokenizer`` to ``path``."""
    path = Path(path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    save_model_and_tokenizer(model, tokenizer, path)
    return path


def save_model_and_tokenizer(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, path: str | Path
) -> Path:
    """Save both so that ``Auto*.from_pretrained(path)`` restores identical behaviour; verified."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    generation_config = model.generation_config
    generation_config.bos_token_id = tokenizer.bos_token_id
    generation_config.eos_token_id = tokenizer.eos_token_id
    generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: str | Path) -> None:
    """``save_pretrained`` with a portable ``tokenizer_class``, then check the round trip."""
    tokenizer.save_pretrained(path)
    config_file = Path(path) / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config["tokenizer_class"] = _TOKENIZER_CLASS
    tokenizer_config["padding_side"] = tokenizer.padding_side
    tokenizer_config["clean_up_tokenization_spaces"] = False
    config_file.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    check_tokenizer_roundtrip(tokenizer, path)


def _default_samples(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Task-like strings for a character tokenizer, decoded word runs for a word-level one."""
    vocab = tokenizer.get_vocab()
    if all(_byte_level(ch) in vocab for ch in "0123456789+="):
        readable = all(_byte_level(ch) in vocab for ch in TEXT_ALPHABET)
        return list(ROUNDTRIP_SAMPLES) + (list(TEXT_ROUNDTRIP_SAMPLES) if readable else [])
    ids = word_token_ids(tokenizer)
    return [tokenizer.decode(ids[:40]), tokenizer.decode(ids[-40:]), tokenizer.decode(ids[::997])]


def check_tokenizer_roundtrip(
    original: PreTrainedTokenizerBase,
    path: str | Path,
    samples: Iterable[str] | None = None,
) -> PreTrainedTokenizerBase:
    """Load ``path`` with ``AutoTokenizer`` and raise ``ValueError`` unless it matches ``original``.

    Compares special token ids, vocabulary size, and encode/decode of ``samples``.
    Returns the loaded tokenizer.
    """
    loaded = AutoTokenizer.from_pretrained(str(path))
    problems: list[str] = []
    for name in ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id"):
        if getattr(original, name) != getattr(loaded, name):
            problems.append(f"{name}: {getattr(original, name)} != {getattr(loaded, name)}")
    if len(original) != len(loaded):
        problems.append(f"vocabulary size: {len(original)} != {len(loaded)}")
    for text in _default_samples(original) if samples is None else samples:
        ids = original.encode(text, add_special_tokens=False)
        loaded_ids = loaded.encode(text, add_special_tokens=False)
        if ids != loaded_ids:
            problems.append(f"encode({text!r}): {ids} != {loaded_ids}")
        elif original.decode(ids) != loaded.decode(ids):
            problems.append(f"decode of {text!r}: {original.decode(ids)!r} != {loaded.decode(ids)!r}")
    if problems:
        raise ValueError(
            f"AutoTokenizer.from_pretrained({str(path)!r}) gave {type(loaded).__name__}, "
            "which differs from the saved tokenizer:\n  " + "\n  ".join(problems)
        )
    return loaded
