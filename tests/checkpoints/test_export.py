"""``grpo-lightning export`` writes a directory that serves as the run trained: its
generation_config.eos_token_id is the ids the run's completions ended at, and a run that sent its
plain-text prompts without the chat template exports a tokenizer without one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer, GenerationConfig

from grpo_lightning.checkpoints.export import main as export_main
from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"


@pytest.fixture(scope="module")
def chat_model_dir(tiny_model_dir, tmp_path_factory) -> tuple[Path, int]:
    """The tiny model with a chat template, and an end of turn of its own in generation_config.eos_token_id
    (a token other than the tokenizer's EOS, as a chat model's ``<|im_end|>``); returns it and that id."""
    directory = tmp_path_factory.mktemp("chat_model") / "model"
    shutil.copytree(tiny_model_dir, directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    end_of_turn = tokenizer.convert_tokens_to_ids("</answer>")
    assert end_of_turn not in (tokenizer.eos_token_id, tokenizer.unk_token_id, None)
    generation = GenerationConfig.from_pretrained(directory)
    generation.eos_token_id = end_of_turn
    generation.save_pretrained(directory)
    return directory, end_of_turn


def fit(model_dir: Path, root: Path, use_chat_template: bool) -> tuple[Path, tuple[int, ...], GRPOLightningCLI]:
    """A one-step CLI fit; its last.ckpt, the ids its completions ended at, and the CLI."""
    cli = GRPOLightningCLI(args=[
        "fit", "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
        "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", str(model_dir),
        "--model.policy.use_chat_template", str(use_chat_template).lower(),
        "--model.sampling.group_size", "2", "--model.sampling.max_new_tokens", "4", "--model.evaluation.max_new_tokens", "4",
        "--data.batch_size", "2", "--data.num_train", "4", "--data.num_val", "2", "--data.val_batch_size", "2",
        "--trainer.max_steps", "1", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.default_root_dir", str(root), "--trainer.logger.init_args.save_dir", str(root),
        "--validate_before_fit", "false",
    ])  # fmt: skip
    return root / "grpo" / "version_0" / "checkpoints" / "last.ckpt", cli.model.sampling.stop_token_ids, cli


@pytest.mark.parametrize("use_chat_template", [False, True], ids=["plain-prompts", "chat-template"])
def test_the_export_has_the_runs_stop_ids_and_prompt_format(use_chat_template, chat_model_dir, tmp_path, one_torch_thread, capsys):
    model_dir, end_of_turn = chat_model_dir
    checkpoint, stop_ids, cli = fit(model_dir, tmp_path / "run", use_chat_template)
    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    assert stop_ids == (eos, end_of_turn)  # the tokenizer's EOS and the model's end of turn
    capsys.readouterr()
    export_main(["--ckpt_path", str(checkpoint), "--output_dir", str(tmp_path / "exported")])
    printed = capsys.readouterr().out
    assert "generation_config.eos_token_id: '</s>' (1), '</answer>'" in printed
    assert ("tokenizer: without its chat template" in printed) is not use_chat_template
    cli.model.save_pretrained(str(tmp_path / "saved"))  # the fitted module's own writer: the same directory
    assert cli.model.tokenizer.chat_template == TEMPLATE  # the run's tokenizer is left as it is

    for written in (tmp_path / "exported", tmp_path / "saved"):
        tokenizer = AutoTokenizer.from_pretrained(written)
        assert GenerationConfig.from_pretrained(written).eos_token_id == list(stop_ids)
        if use_chat_template:
            assert tokenizer.chat_template == TEMPLATE
        else:  # served as it was trained: the prompt as it is
            assert not tokenizer.chat_template
            with pytest.raises(ValueError):
                tokenizer.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=False)


def test_keep_chat_template_keeps_it(chat_model_dir, tmp_path, one_torch_thread, capsys):
    checkpoint, _, _ = fit(chat_model_dir[0], tmp_path / "run", use_chat_template=False)
    export_main(["--ckpt_path", str(checkpoint), "--output_dir", str(tmp_path / "exported"), "--keep_chat_template"])
    assert AutoTokenizer.from_pretrained(tmp_path / "exported").chat_template == TEMPLATE
    assert "tokenizer: with its chat template (--keep_chat_template)" in capsys.readouterr().out
