"""One meaning of step: validation, the loggers' x-axis and the fit summary count optimizer steps,
for GRPO and for DAPO, whose dynamic sampling draws several generation batches per update; every
update of a batch makes the same optimizer steps, however many of its groups are left, and a fit
makes ``max_steps`` of them exactly."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grpo_lightning.training.callbacks import FitSummary
from grpo_lightning.variants import DAPO, GRPO
from tests.helpers import make_trainer, module, small_data


def odd_answers_informative(prompts, completions, answer, **columns):
    """Rewards that differ within a group (of 2) only where the answer is odd: DAPO keeps about half
    of each generation batch's groups, so it draws several batches for most updates."""
    return [float(i % 2) if int(a) % 2 else 0.0 for i, a in enumerate(answer)]


class ValidationSteps(L.Callback):
    """The optimizer steps at which the fit validated."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_validation_end(self, trainer, pl_module) -> None:
        self.steps.append(trainer.global_step)


def two_digit_answers_informative(prompts, completions, answer, **columns):
    """Rewards that differ within a group (of 2) only where the answer is below 100: in the data's
    order, DAPO with ``max_gen_batches=2`` makes several partial updates (one group, one minibatch)."""
    return [float(i % 2) if int(a) < 100 else 0.0 for i, a in enumerate(answer)]


def fit(tmp_path, model_dir: str, cls, max_steps: int, val_check_interval: int, reward=odd_answers_informative,
        callbacks=(), **settings):  # fmt: skip
    """A fit of two optimizer steps per rollout (2 prompts x 2 completions, minibatches of 2)."""
    record = ValidationSteps()
    trainer = make_trainer(
        tmp_path, max_steps=max_steps, val_check_interval=val_check_interval, callbacks=[record, *callbacks]
    )
    policy = module(
        model_dir,
        cls,
        **settings,
        optim={"minibatch_size": 2, "micro_batch_size": 2},
        rewards={"funcs": [reward]},
        evaluation={"accuracy_func": reward}
    )
    trainer.fit(policy, small_data())
    return trainer, policy, record.steps


def test_grpo_and_dapo_validate_at_the_same_optimizer_steps_and_at_the_end(tiny_model_dir, tmp_path, one_torch_thread):
    grpo, _, grpo_steps = fit(tmp_path / "grpo", tiny_model_dir, GRPO, 10, 4)
    dapo, _, dapo_steps = fit(tmp_path / "dapo", tiny_model_dir, DAPO, 10, 4, max_gen_batches=20, on_exhausted="error")
    batches = [trainer.fit_loop.epoch_loop.total_batch_idx + 1 for trainer in (grpo, dapo)]
    assert batches[1] > batches[0] == 5  # DAPO drew extra generation batches for its updates
    assert grpo_steps == dapo_steps == [4, 8, 10]  # every 4 optimizer steps, and at the end


@pytest.fixture(scope="module")
def partial_updates(tiny_model_dir, tmp_path_factory):
    """GRPO and DAPO fits of 12 optimizer steps, validating every 4, where DAPO's dynamic sampling
    drops groups and trains on partial batches: ``{name: (trainer, validation steps, fit summary)}``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    fits = {}
    for cls, settings in ((GRPO, {}), (DAPO, {"max_gen_batches": 2, "on_exhausted": "partial"})):
        root, summary = tmp_path_factory.mktemp(cls.__name__), FitSummary()
        last = L.pytorch.callbacks.ModelCheckpoint(root / "ckpt", save_last=True, save_top_k=0)
        trainer, _, steps = fit(root, tiny_model_dir, cls, 12, 4, two_digit_answers_informative, [summary, last],
                                **settings)  # fmt: skip
        fits[cls.__name__] = trainer, steps, summary.text
    torch.set_num_threads(threads)
    return fits


def logged_steps(trainer, name: str) -> list[int]:
    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    return [e.step for e in events.Scalars(name)]


def test_dapo_with_partial_updates_ends_at_exactly_max_steps(partial_updates):
    trainer, _, summary = partial_updates["DAPO"]
    assert trainer.fit_loop.epoch_loop.total_batch_idx + 1 > 6  # dynamic sampling drew extra generation batches
    assert logged_steps(trainer, "dynamic_sampling/frac_groups_kept") and trainer.global_step == 12
    assert "fit finished: 12 / 12 optimizer steps" in summary


def test_dapo_with_partial_updates_logs_at_the_optimizer_steps_grpo_logs_at(partial_updates):
    grpo, dapo = partial_updates["GRPO"][0], partial_updates["DAPO"][0]
    assert logged_steps(dapo, "reward") == logged_steps(grpo, "reward") == [2, 4, 6, 8, 10, 12]


def test_dapo_with_partial_updates_validates_at_the_optimizer_steps_grpo_validates_at(partial_updates):
    assert partial_updates["DAPO"][1] == partial_updates["GRPO"][1] == [4, 8, 12]


def test_dapo_with_partial_updates_saves_its_last_checkpoint_at_max_steps(partial_updates):
    trainer = partial_updates["DAPO"][0]
    last = torch.load(trainer.checkpoint_callback.last_model_path, map_location="cpu", weights_only=False)
    assert last["global_step"] == 12


def test_an_update_of_several_steps_stops_at_max_steps(tiny_model_dir, tmp_path, one_torch_thread):
    summary = FitSummary()
    trainer, _, steps = fit(tmp_path, tiny_model_dir, GRPO, 5, 4, callbacks=[summary])  # rollouts of 2 steps
    assert trainer.global_step == 5 and steps == [4, 5]
    assert "fit finished: 5 / 5 optimizer steps" in summary.text


def test_a_dapo_update_without_informative_groups_counts_the_steps_of_an_update(tiny_model_dir, tmp_path,
                                                                                  one_torch_thread):  # fmt: skip
    """No group is ever informative: each update of 2 steps is made of steps without a gradient."""
    never_informative = lambda prompts, completions, **columns: [0.0] * len(completions)  # noqa: E731
    trainer, policy, _ = fit(tmp_path, tiny_model_dir, DAPO, 4, 4, never_informative, max_gen_batches=1)
    assert logged_steps(trainer, "dynamic_sampling/skipped_updates") == [2, 4]
    assert policy.last_step_metrics["dynamic_sampling/skipped_updates"] == 1.0


def fails_on_three_digit_answers(prompts, completions, answer, **columns):
    """``odd_answers_informative``'s rewards where the answer is below 100, NaN (a failure) elsewhere."""
    return [float(i % 2) if int(a) < 100 else math.nan for i, a in enumerate(answer)]


def test_groups_left_out_by_skip_group_leave_the_update_its_steps(tiny_model_dir, tmp_path, one_torch_thread):
    """``skip_group`` drops the groups a reward failed on: the update of what is left, or of nothing
    (the first batch), still makes the batch's two optimizer steps."""
    trainer = make_trainer(tmp_path, max_steps=6, limit_val_batches=0)
    rewards = {"funcs": [fails_on_three_digit_answers], "execution": {"on_error": "skip_group"}}
    policy = module(tiny_model_dir, GRPO, optim={"minibatch_size": 2, "micro_batch_size": 2}, rewards=rewards)
    trainer.fit(policy, small_data())
    assert logged_steps(trainer, "rewards/frac_groups_skipped") == [2, 4, 6]


def never_informative_and_failing_on_odd_answers(prompts, completions, answer, **columns):
    """0 for every completion where the answer is even, NaN (a failure) where it is odd: no group is
    ever informative, and ``skip_group`` drops one group of some batches."""
    return [0.0 if int(a) % 2 == 0 else math.nan for a in answer]


def test_dapo_with_groups_left_out_by_skip_group_still_counts_the_batchs_steps(tiny_model_dir, tmp_path,
                                                                               one_torch_thread):  # fmt: skip
    """Dynamic sampling fills, and a skipped update counts, the batch's groups, not those skip_group
    left: each batch of 2 groups makes 2 optimizer steps (1 where one group had failed)."""
    trainer = make_trainer(tmp_path, max_steps=8, limit_val_batches=0)
    rewards = {"funcs": [never_informative_and_failing_on_odd_answers], "execution": {"on_error": "skip_group"}}
    policy = module(tiny_model_dir, DAPO, optim={"minibatch_size": 2, "micro_batch_size": 2}, rewards=rewards,
                    max_gen_batches=1)  # fmt: skip
    trainer.fit(policy, small_data())
    assert logged_steps(trainer, "rewards/frac_groups_skipped") == [2, 4, 6, 8]
    assert trainer.fit_loop.epoch_loop.total_batch_idx + 1 == 4


def fails_on_odd_answers(prompts, completions, answer, **columns):
    """``odd_answers_informative``'s pattern where the answer is even, NaN (a failure) where it is odd."""
    return [float(i % 2) if int(a) % 2 == 0 else math.nan for i, a in enumerate(answer)]


class RecordsOldLogprobs(GRPO):
    """GRPO that records, for each update, its rollout's rows and whether old log-probs were computed."""

    def update(self, rollout, advantages, num_groups=None):
        self.updates = [*getattr(self, "updates", []), (len(rollout), rollout.old_logp is not None)]
        super().update(rollout, advantages, num_groups)


def test_a_rollout_that_lost_groups_gets_its_old_log_probs_for_the_batchs_steps(tiny_model_dir, tmp_path,
                                                                                 one_torch_thread):  # fmt: skip
    """A batch of 2 groups in minibatches of one group makes 2 optimizer steps even with one group
    left: the second step's ratio needs the old policy's log-probs (it was 1, the clip never acting)."""
    trainer = make_trainer(tmp_path, max_steps=8, limit_val_batches=0)
    rewards = {"funcs": [fails_on_odd_answers], "execution": {"on_error": "skip_group"}}
    policy = module(tiny_model_dir, RecordsOldLogprobs, optim={"minibatch_size": 2, "micro_batch_size": 2},
                    rewards=rewards)  # fmt: skip
    trainer.fit(policy, small_data())
    assert (2, True) in policy.updates  # a rollout of one group, with old log-probs
    assert all(old for _, old in policy.updates)


def test_tensorboard_steps_are_optimizer_steps(tiny_model_dir, tmp_path, one_torch_thread):
    trainer, _, _ = fit(tmp_path, tiny_model_dir, GRPO, 6, 4)
    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("reward")] == [2, 4, 6]  # each rollout makes two optimizer steps
    assert [e.step for e in events.Scalars("val/accuracy")] == [4, 6]
    assert [e.value for e in events.Scalars("counters/rollouts")] == [1, 2, 3]
    assert [e.value for e in events.Scalars("counters/generation_batches")] == [1, 2, 3]
    tokens = [e.value for e in events.Scalars("perf/generated_tokens")]
    assert tokens == sorted(tokens) and tokens[0] > 0


def test_the_fit_summary_validation_is_that_of_the_last_step(tiny_model_dir, tmp_path, one_torch_thread):
    summary = FitSummary()
    trainer = make_trainer(tmp_path, max_steps=6, val_check_interval=4, callbacks=[summary])
    trainer.fit(module(tiny_model_dir, GRPO, optim={"minibatch_size": 2, "micro_batch_size": 2}), small_data())
    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    last = events.Scalars("val/accuracy")[-1]
    assert last.step == trainer.global_step == 6
    assert float(trainer.callback_metrics["val/accuracy"]) == pytest.approx(last.value)
    assert f"validation (step 6): val/accuracy {last.value:.4g}" in summary.text


class StopBySigterm(L.Callback):
    """Stop the fit after optimizer step ``at`` as Lightning's SIGTERM handler does."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.at:
            raise SIGTERMException()


def test_a_stopped_fit_summary_names_the_step_of_its_last_validation(tiny_model_dir, tmp_path, one_torch_thread):
    summary = FitSummary()
    trainer = make_trainer(tmp_path, max_steps=6, val_check_interval=2, callbacks=[summary, StopBySigterm(3)])
    with pytest.raises(SIGTERMException):
        trainer.fit(module(tiny_model_dir, GRPO), small_data())
    assert summary.text.startswith("fit stopped by SIGTERM: 3 / 6 optimizer steps")
    assert "  validation (step 2): val/accuracy " in summary.text


def test_an_interval_the_updates_step_over_is_named(tiny_model_dir, tmp_path, one_torch_thread):
    with pytest.warns(UserWarning, match="val_check_interval 3 counts optimizer steps.*validated at step 4"):
        _, _, steps = fit(tmp_path, tiny_model_dir, GRPO, 6, 3)
    assert steps == [4, 6]


def test_an_interval_longer_than_an_epoch_counts_steps_across_epochs(tiny_model_dir, tmp_path, one_torch_thread):
    """Lightning refuses an integer interval longer than an epoch unless ``check_val_every_n_epoch``
    is None; counted in optimizer steps over the whole fit, it is fine."""
    record = ValidationSteps()
    trainer = make_trainer(tmp_path, max_steps=8, val_check_interval=6, check_val_every_n_epoch=1, callbacks=[record])
    trainer.fit(
        module(tiny_model_dir, GRPO, optim={"minibatch_size": 2, "micro_batch_size": 2}), small_data(num_train=4)
    )  # 2 rollouts an epoch
    assert record.steps == [6, 8]


def test_checkpoints_are_saved_where_an_update_steps_over_the_interval(tiny_model_dir, tmp_path, one_torch_thread):
    """Two optimizer steps per rollout and every_n_train_steps=3: ModelCheckpoint alone saves at 6
    (the only multiple of 3 the fit stops at); the update from 2 to 4 stepped over 3 and saves too."""
    every = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt", "{step}", every_n_train_steps=3, save_top_k=-1)
    trainer = make_trainer(tmp_path, max_steps=8, val_check_interval=8, callbacks=[every])
    trainer.fit(module(tiny_model_dir, GRPO, optim={"minibatch_size": 2, "micro_batch_size": 2}), small_data())
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.ckpt")) == ["step=4.ckpt", "step=6.ckpt"]


def test_a_trainer_that_runs_again_keeps_its_schedules_without_a_notice(tiny_model_dir, tmp_path, one_torch_thread, capfd):
    """``validate`` after ``fit`` on one Trainer: the schedules are attached once, so Lightning has
    nothing to override and prints no notice about it."""
    from grpo_lightning.training import step_schedule

    trainer, policy = make_trainer(tmp_path, max_steps=1), module(tiny_model_dir)
    data = small_data()
    trainer.fit(policy, data)
    trainer.validate(policy, data)
    kinds = [type(c) for c in trainer.callbacks]
    assert kinds.count(step_schedule.ValidationSchedule) == 1 and kinds.count(step_schedule.CheckpointSchedule) == 1
    assert "will override existing callbacks" not in "".join(capfd.readouterr())
