"""A local GGUF file is read once, into a dense copy in the project's cache: later loads read the
copy, and give the same weights, tokenizer and chat template as transformers' GGUF reader. The GGUF
file is a real one, written here with the ``gguf`` package (a 2-layer Llama, byte-level tokenizer)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

from grpo_lightning.models import sources as model_sources
from grpo_lightning.models.policy import load_causal_lm
from grpo_lightning.models.sources import ModelSource, dense_copy, load_tokenizer
from grpo_lightning.runtime.cache import CACHE_ENV_VAR

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 64, 4, 2, 2, 128
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_symbols() -> list[str]:
    """The byte-level BPE alphabet (GPT-2's): byte ``b`` is the ``b``-th symbol."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    symbols = dict(zip(printable + shifted, [chr(b) for b in printable] + [chr(256 + i) for i in range(len(shifted))]))
    return [symbols[b] for b in range(256)]


def write_tiny_gguf(path) -> None:
    tokens = [*byte_symbols(), "<|im_start|>", "<|im_end|>", "is", "th"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(["i s", "t h"])  # two: transformers 5.17's reader reads a one-element array as its element
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([1] * 256 + [3, 3, 1, 1])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)
    kv = KV_HEADS * HIDDEN // HEADS
    shapes = {"token_embd.weight": (len(tokens), HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
            f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN), f"blk.{i}.attn_k.weight": (kv, HIDDEN),
            f"blk.{i}.attn_v.weight": (kv, HIDDEN), f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN),
            f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN), f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
            f"blk.{i}.ffn_down.weight": (HIDDEN, FFN),
        })  # fmt: skip
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "cache"))
    path = tmp_path / "weights" / "tiny.gguf"
    path.parent.mkdir()
    write_tiny_gguf(path)
    return path


def read_by_transformers(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = ModelSource(str(path.parent), path.name)
    model = AutoModelForCausalLM.from_pretrained(source.location, **source.from_pretrained_kwargs(dense=True))
    return model, AutoTokenizer.from_pretrained(source.location, gguf_file=path.name)


def test_the_copy_loads_what_the_gguf_reader_reads_and_later_loads_skip_the_reader(gguf_file, monkeypatch):
    expected_model, expected_tokenizer = read_by_transformers(gguf_file)
    parsed = []
    monkeypatch.setattr(gguf, "GGUFReader", lambda *args, reader=gguf.GGUFReader, **kwargs: parsed.append(args) or reader(*args, **kwargs))
    model, tokenizer = load_causal_lm(str(gguf_file), "float32", None), load_tokenizer(str(gguf_file))
    assert len(parsed) == 1  # config, tokenizer and weights from one parse of the file

    (copy,) = (gguf_file.parents[1] / "cache" / "gguf").iterdir()
    assert copy.name.startswith("tiny-") and (copy / model_sources.COPY_DONE).is_file()
    expected = expected_model.state_dict()
    assert model.state_dict().keys() == expected.keys()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in model.state_dict().items())
    text = "Which is larger, 27 or 82?"
    assert tokenizer(text).input_ids == expected_tokenizer(text).input_ids
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert tokenizer.chat_template == expected_tokenizer.chat_template == CHAT_TEMPLATE
    # The copy's EOS is the file's, <|im_end|>, in every release (transformers 5.17 reads it as <|im_start|>,
    # 5.24 as the file says). Without a pad token in the file, the EOS pads.
    assert tokenizer.eos_token == "<|im_end|>" and expected_tokenizer.eos_token in ("<|im_end|>", "<|im_start|>")
    assert tokenizer.pad_token == "<|im_end|>"

    def no_gguf_reading(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(model_sources, "_write_dense_copy", no_gguf_reading)
    again = load_causal_lm(str(gguf_file), "bfloat16", None)
    assert again.dtype == torch.bfloat16
    assert torch.equal(again.model.embed_tokens.weight, expected["model.embed_tokens.weight"].to(torch.bfloat16))
    assert load_tokenizer(str(gguf_file))(text).input_ids == expected_tokenizer(text).input_ids


def test_an_edited_gguf_file_gets_a_new_copy_and_other_sources_none(gguf_file, tmp_path):
    first = dense_copy(ModelSource(str(gguf_file.parent), gguf_file.name))
    stat = os.stat(gguf_file)
    os.utime(gguf_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = dense_copy(ModelSource(str(gguf_file.parent), gguf_file.name))
    assert first.gguf_file is second.gguf_file is None and first.location != second.location

    directory = ModelSource(str(tmp_path / "weights"))
    assert dense_copy(directory) is directory
    hub_file = ModelSource("org/repo", "model.Q4.gguf")
    assert dense_copy(hub_file) is hub_file


def test_a_cache_that_cannot_be_written_leaves_the_gguf_file_read_directly(gguf_file, tmp_path, monkeypatch):
    blocked = tmp_path / "not_a_folder"
    blocked.write_text("")
    monkeypatch.setenv(CACHE_ENV_VAR, str(blocked))
    source = ModelSource(str(gguf_file.parent), gguf_file.name)
    with pytest.warns(UserWarning, match="no dense copy of .*tiny.gguf.*reading the GGUF file each time"):
        assert dense_copy(source) is source
    assert load_causal_lm(str(gguf_file), "float32", None).config.num_hidden_layers == LAYERS


def test_the_files_special_tokens_replace_ones_transformers_misread(gguf_file):
    assert model_sources.gguf_special_token_ids(str(gguf_file)) == {"eos_token": 257}  # no padding id in this file
    tokenizer = load_tokenizer(str(gguf_file))
    tokenizer.eos_token = "<|im_start|>"  # as transformers 5.17 reads SmolLM2's GGUF file
    with pytest.warns(UserWarning, match=r"eos_token as id 256, the file says '<\|im_end\|>' \(257\); using the file's"):
        model_sources.use_file_special_tokens(tokenizer, {"eos_token": 257}, str(gguf_file))
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 257)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the tokens the file gives: nothing to say
        model_sources.use_file_special_tokens(tokenizer, {"eos_token": 257}, str(gguf_file))
