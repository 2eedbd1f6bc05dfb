"""bf16 on a CPU that emulates it: a fit says so before it loads the model, and runs what it was told."""

from __future__ import annotations

import platform
import warnings

import lightning as L
import pytest
import torch

from grpo_lightning.runtime import cpu_precision
from tests.helpers import make_data, make_module, make_trainer


def trainer(precision: str) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, precision=precision, logger=False, enable_checkpointing=False)


def caught(precision: str) -> list[str]:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        cpu_precision.warn_emulated_bf16(trainer(precision))
    return [str(record.message) for record in records if "native bf16" in str(record.message)]


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_on_a_cpu_that_emulates_it_names_the_fix(monkeypatch, precision):
    monkeypatch.setattr(cpu_precision, "cpu_runs_bf16_natively", lambda: False)
    (message,) = caught(precision)
    assert f"trainer.precision={precision}" in message and "--trainer.precision 32-true" in message


def test_no_warning_in_fp32_on_a_cpu_with_native_bf16_or_where_it_cannot_be_told(monkeypatch):
    monkeypatch.setattr(cpu_precision, "cpu_runs_bf16_natively", lambda: False)
    assert caught("32-true") == []
    for answer in (True, None):
        monkeypatch.setattr(cpu_precision, "cpu_runs_bf16_natively", lambda answer=answer: answer)
        assert caught("bf16-mixed") == []


def test_the_probe_answers_on_x86_and_says_it_cannot_tell_elsewhere(monkeypatch):
    if hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported") and platform.machine().lower() in cpu_precision.X86:
        assert isinstance(cpu_precision.cpu_runs_bf16_natively(), bool)
    monkeypatch.setattr(cpu_precision.platform, "machine", lambda: "aarch64")  # oneDNN's answer is about x86
    assert cpu_precision.cpu_runs_bf16_natively() is None


def test_a_bf16_fit_on_such_a_cpu_warns_before_loading_and_runs_in_bf16(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(cpu_precision, "cpu_runs_bf16_natively", lambda: False)
    module = make_module(tiny_model_dir)
    fit = make_trainer(tmp_path, max_steps=1, precision="bf16-mixed", limit_val_batches=0)
    warned_at_load, load = [], module.configure_model

    def configure_model():
        warned_at_load.append(any("native bf16" in str(record.message) for record in records))
        load()

    module.configure_model = configure_model
    with pytest.warns(UserWarning, match="native bf16") as records:
        fit.fit(module, datamodule=make_data())
    assert warned_at_load == [True]
    assert fit.global_step == 1 and str(fit.precision) == "bf16-mixed"  # warned, not changed
