"""The help says what each option means and which names it takes; no parser takes an abbreviation."""

from __future__ import annotations

import contextlib
import io

import pytest

from grpo_lightning.algorithms import ADVANTAGES, AGGREGATIONS, KL_PLACEMENTS, SURROGATES
from grpo_lightning.cli.app import main


@pytest.fixture(scope="module")
def grpo_help() -> str:
    """``grpo-lightning fit --model.help GRPO`` after its usage lines, its words joined by single spaces."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["fit", "--model.help", "GRPO"])
    text = " ".join(out.getvalue().split())
    return text[text.index("Help for --model.help") :]


@pytest.mark.parametrize(
    ("option", "registry"),
    [("--model.advantage", ADVANTAGES), ("--model.aggregation", AGGREGATIONS),
     ("--model.loss.surrogate", SURROGATES), ("--model.kl.placement", KL_PLACEMENTS)],  # fmt: skip
    ids=["advantage", "aggregation", "surrogate", "kl_placement"],
)
def test_model_help_lists_the_registered_names_an_option_takes(option, registry, grpo_help):
    entry = grpo_help[grpo_help.index(f"{option} {option.rpartition('.')[2].upper()}") :][:900]
    assert f"(choices: {', '.join(registry)})" in entry, entry


@pytest.mark.parametrize(
    ("option", "doc"),
    [("--model.sampling.group_size", "Completions sampled per prompt"),
     ("--model.optim.learning_rate", "AdamW's, after a linear warm-up"),
     ("--model.kl.beta", "KL coefficient; 0 loads no reference model")],  # fmt: skip
)
def test_model_help_shows_each_fields_docstring(option, doc, grpo_help):
    entry = grpo_help[grpo_help.index(f"{option} ") :][:300]
    assert doc in entry, entry


def test_export_takes_no_abbreviation(capsys):
    with pytest.raises(SystemExit) as done:
        main(["export", "--ckpt", "run.ckpt", "--output_dir", "out"])
    assert done.value.code == 2 and "required: --ckpt_path" in capsys.readouterr().err  # --ckpt is not --ckpt_path
