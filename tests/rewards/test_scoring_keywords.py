"""What the scoring passes reward functions beside the dataset's columns, with TRL's names and
meanings: ``completion_ids`` (each completion's token ids, the model's tokens only, unpadded) and
``trainer_state`` (``global_step``, ``epoch``, ``max_steps``, ``num_train_epochs``); to the functions
that take them, as ``group_index``."""

from __future__ import annotations

import pytest

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.data import PromptDataModule
from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards import score_completions
from grpo_lightning.rewards.process_supervision import step_rewards
from grpo_lightning.rewards.scoring import TrainerState

CONFIGS = config_dir()
IDS = [[5, 6, 7], [8]]  # two completions of 3 and 1 tokens
STATE = TrainerState(global_step=3, epoch=1.5, max_steps=10, num_train_epochs=None)


def ids_and_step(prompts, completions, completion_ids, trainer_state, answer):
    """``100 * step + number of tokens + last token``: each argument shows in the score."""
    return [100.0 * trainer_state.global_step + len(ids) + ids[-1] for ids in completion_ids]


def kwargs_spy(prompts, completions, **kwargs):
    """Sum of the token ids plus the epoch, read from ``**kwargs``."""
    return [float(sum(ids)) + kwargs["trainer_state"].epoch for ids in kwargs["completion_ids"]]


def test_a_function_naming_them_gets_each_completions_ids_and_the_state_beside_the_columns():
    scores = score_completions([("f", ids_and_step)], ["p", "q"], ["abc", "d"], {"answer": ["1", "2"]},
                               completion_ids=IDS, trainer_state=STATE)  # fmt: skip
    assert scores[:, 0].tolist() == [300 + 3 + 7, 300 + 1 + 8]


def test_a_function_with_kwargs_gets_them_and_one_without_is_called_as_before():
    seen = []
    plain = lambda prompts, completions, answer: seen.append(answer) or [0.0] * len(completions)  # noqa: E731
    scores = score_completions([("spy", kwargs_spy), ("plain", plain)], ["p", "q"], ["abc", "d"], {"answer": ["1", "2"]},
                               completion_ids=IDS, trainer_state=STATE)  # fmt: skip
    assert scores[:, 0].tolist() == [18 + 1.5, 8 + 1.5] and seen == [["1", "2"]]


@pytest.mark.parametrize("name", ["completion_ids", "trainer_state"])
def test_a_column_of_either_name_is_an_error_naming_it_and_the_fix(name, tmp_path):
    with pytest.raises(ConfigError, match=f"column '{name}' of the data: reward functions get {name} from the "
                                          "scoring .*; rename the column."):  # fmt: skip
        score_completions([("spy", kwargs_spy)], ["p"], ["c"], {name: [1]})
    (tmp_path / "train.jsonl").write_text(f'{{"prompt": "1+1=", "answer": "2", "{name}": 0}}\n')
    data = PromptDataModule(path=str(tmp_path / "train.jsonl"), val_split=None)
    with pytest.raises(ConfigError, match=f"column '{name}' of split 'train' .*rename the column"):
        data.setup("fit")


def test_a_step_reward_function_gets_them_too():
    def per_token(prompts, completions, completion_ids, trainer_state):
        return [[(len(ids) - 1, float(trainer_state.global_step))] for ids in completion_ids]

    pairs = step_rewards(per_token, "f", ["p", "q"], ["abc", "d"], {}, [[1, 2, 3], [1]], "\n\n", IDS, STATE)
    assert pairs == [[(2, 3.0)], [(0, 3.0)]]


def test_the_module_passes_the_unpadded_ids_of_the_models_tokens(make_module, make_rollout):
    from grpo_lightning.variants import GRPO

    seen = {}

    def record(prompts, completions, completion_ids, trainer_state, **columns):
        seen.update(ids=completion_ids, state=trainer_state)
        return [0.0] * len(completions)

    module = make_module(GRPO, rewards={"funcs": [record]}, sampling={"group_size": 3, "max_new_tokens": 6})
    rollout = make_rollout(module, ["1+1=", "22+22="])
    assert seen["ids"] == rollout.model_token_ids()  # rollout/test_rollout.py: padding and replies left out
    assert [module.tokenizer.decode(ids, skip_special_tokens=True) for ids in seen["ids"]] == rollout.completions
    assert seen["state"] == TrainerState(0, 0.0, None, None)  # no trainer: the start


STATES: list[TrainerState] = []


def state_recorder(prompts, completions, trainer_state, **columns):
    STATES.append(trainer_state)
    return [0.0] * len(completions)


def test_a_fit_passes_the_steps_taken_the_epoch_so_far_and_its_limits(tiny_model_dir, tmp_path, one_torch_thread):
    """12 training prompts in batches of 2: 6 batches an epoch, so the second step is 1/6 of one in."""
    STATES.clear()
    GRPOLightningCLI(args=[
        "fit", "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
        "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", tiny_model_dir,
        "--model.rewards.funcs", f"[{__name__}.state_recorder]", "--model.sampling.group_size", "2",
        "--model.sampling.max_new_tokens", "2", "--data.batch_size", "2", "--data.num_train", "12",
        "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
        "--trainer.enable_checkpointing", "false", "--trainer.callbacks=[]",
    ])  # fmt: skip
    assert [(s.global_step, s.epoch, s.max_steps) for s in STATES] == [(0, 0.0, 2), (1, 1 / 6, 2)]
