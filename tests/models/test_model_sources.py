"""Where weights come from: hub ids and directories as before, GGUF files (a path, a hub file, or a
file shipped in a Python package), and the errors that name the setting and the fix."""

from __future__ import annotations

import sys

import pytest

from grpo_lightning.models import sources as model_sources
from grpo_lightning.models.sources import ModelSource, ModelSourceError, load_tokenizer, resolve_model_source
from grpo_lightning.errors import ConfigError


@pytest.fixture
def gguf_readable(monkeypatch):
    """Resolution only: whether gguf/accelerate are installed does not matter here."""
    monkeypatch.setattr(model_sources, "missing_gguf_packages", lambda: [])


@pytest.fixture
def shipped_package(tmp_path, monkeypatch):
    """An installed package ``weights_pkg`` that ships ``tiny.Q4.gguf`` (never imported)."""
    package = tmp_path / "weights_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('resolving must not import the package')\n")
    (package / "tiny.Q4.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    return package


def test_hub_ids_and_directories_are_plain_sources(tmp_path):
    assert resolve_model_source("Qwen/Qwen2.5-0.5B-Instruct") == ModelSource("Qwen/Qwen2.5-0.5B-Instruct")
    assert resolve_model_source(str(tmp_path)) == ModelSource(str(tmp_path))
    assert ModelSource("x").from_pretrained_kwargs(dense=True) == {}


def test_a_local_gguf_file_splits_into_folder_and_file(tmp_path, gguf_readable):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    source = resolve_model_source(str(path))
    assert source == ModelSource(str(tmp_path), "m.gguf")
    assert source.from_pretrained_kwargs() == {"gguf_file": "m.gguf"}


def test_dense_loading_asks_transformers_to_unpack_the_weights(tmp_path):
    kwargs = ModelSource(str(tmp_path), "m.gguf").from_pretrained_kwargs(dense=True)
    transformers = pytest.importorskip("transformers")
    if hasattr(transformers, "GgufConfig"):
        assert kwargs["quantization_config"].dequantize is True
    assert kwargs["gguf_file"] == "m.gguf"


def test_a_hub_gguf_file_names_repository_and_file(gguf_readable):
    assert resolve_model_source("org/repo/model.Q8_0.gguf") == ModelSource("org/repo", "model.Q8_0.gguf")


def test_a_package_file_is_found_without_importing_the_package(shipped_package, gguf_readable):
    source = resolve_model_source("package:weights_pkg/tiny.Q4.gguf")
    assert source == ModelSource(str(shipped_package), "tiny.Q4.gguf")
    assert "weights_pkg" not in sys.modules


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("./missing-dir", "model: no such directory './missing-dir'"),
        ("./missing.gguf", "model: no such file './missing.gguf'"),
        ("org/model.gguf", "'org/repo/FILE.gguf' for a file of a hub repository"),
        ("package:weights_pkg", "should read 'package:NAME/FILE'"),
        ("package:no_such_package_here/x.gguf", "no installed Python package 'no_such_package_here'"),
        ("package:weights_pkg/other.gguf", "package 'weights_pkg' has no file 'other.gguf'; it ships ['tiny.Q4.gguf']"),
    ],
)
def test_bad_sources_name_the_field_and_the_fix(name, message, shipped_package, gguf_readable):
    with pytest.raises(ModelSourceError, match="^model: ") as raised:
        resolve_model_source(name)
    assert message in str(raised.value)
    assert isinstance(raised.value, ConfigError)


def test_gguf_without_its_readers_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setattr(model_sources, "missing_gguf_packages", lambda: ["gguf"])
    with pytest.raises(ModelSourceError, match=r"tokenizer: .* reads with the gguf package; pip install 'grpo-lightning\[gguf\]'"):
        resolve_model_source(str(path), field="tokenizer")


def test_the_module_refuses_a_missing_gguf_before_loading_anything(monkeypatch):
    from grpo_lightning import variants

    with pytest.raises(ConfigError, match="model: no such file './nowhere/model.gguf'"):
        variants.GRPO(model="./nowhere/model.gguf")


def test_a_built_in_warm_start_is_named_at_construction_and_trained_only_to_load(monkeypatch, tmp_path):
    from grpo_lightning.training.settings import check_model_path

    def trains():
        raise AssertionError("trained while only checking the setting")

    fakes = type(sys)("fake_warm_starts")
    fakes.trains, fakes.cached = trains, lambda: tmp_path
    monkeypatch.setitem(sys.modules, "fake_warm_starts", fakes)
    monkeypatch.setitem(model_sources.WARM_STARTS, "calculator", "fake_warm_starts:trains")
    check_model_path("model", "warmstart:calculator")
    monkeypatch.setitem(model_sources.WARM_STARTS, "calculator", "fake_warm_starts:cached")
    assert resolve_model_source("warmstart:calculator") == ModelSource(str(tmp_path))
    with pytest.raises(ModelSourceError, match="model: 'warmstart:calculater' is no built-in warm start; give one of "
                       "warmstart:quickstart, warmstart:calculator, warmstart:calculator:<model>"):  # fmt: skip
        check_model_path("model", "warmstart:calculater")


def test_a_warm_start_of_a_model_is_trained_from_that_model_which_must_exist(monkeypatch, tmp_path):
    from grpo_lightning.training.settings import check_model_path

    started_from = []
    fakes = type(sys)("fake_chat_warm_starts")
    fakes.of_a_model = lambda base: started_from.append(base) or tmp_path / "tuned"
    monkeypatch.setitem(sys.modules, "fake_chat_warm_starts", fakes)
    monkeypatch.setitem(model_sources.WARM_STARTS_OF_A_MODEL, "calculator", "fake_chat_warm_starts:of_a_model")
    base = tmp_path / "base"
    base.mkdir()
    check_model_path("model", f"warmstart:calculator:{base}")
    assert started_from == []  # checked, not trained
    assert resolve_model_source(f"warmstart:calculator:{base}") == ModelSource(str(tmp_path / "tuned"))
    assert started_from == [str(base)]
    with pytest.raises(ModelSourceError, match="model: no such directory"):
        check_model_path("model", f"warmstart:calculator:{tmp_path / 'missing'}")
    with pytest.raises(ModelSourceError, match="warm-starts a warm start; give the model it starts from"):
        check_model_path("model", "warmstart:calculator:warmstart:quickstart")
    with pytest.raises(ModelSourceError, match="'warmstart:quickstart:.*' is no built-in warm start"):
        check_model_path("model", f"warmstart:quickstart:{base}")


def test_a_hub_id_the_hub_cannot_give_is_refused_naming_the_setting(monkeypatch):
    """Offline here, as on this project's machines: transformers' outermost message, not a socket's."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelSourceError) as refused:
        load_tokenizer("someorg/no-such-model", "policy.tokenizer")
    message = str(refused.value)
    assert message.startswith("policy.tokenizer: 'someorg/no-such-model' is not a local directory, and the hub")
    assert "HF_HUB_OFFLINE is set" in message and "Errno" not in message
