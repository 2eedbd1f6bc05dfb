"""Stale rollouts. One step: rollout k samples from the weights the policy had when update k-1
began (as when it is generated while update k-1 runs), the staleness is logged and corrected by
the sampling log-probs, and validation samples from the current policy. Up to k steps: each update
trains on the rollout sampled k batches before, and a fit resumes from a checkpoint exactly (at one step
too: the snapshot is saved); with another k, or without the callback, a resume says what it drops."""

from __future__ import annotations

import types

import lightning as L
import pytest
import torch

from grpo_lightning.checkpoints.export import read_checkpoint
from grpo_lightning.errors import ConfigError
from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.partial import continue_rollouts
from grpo_lightning.rollout.stale import SNAPSHOT_KEY, StaleQueue, StaleRollouts
from grpo_lightning.rollout.types import Rollout
from grpo_lightning.variants import GRPO
from tests.helpers import StepRecorder, assert_same_steps, fit, fit_stopped_and_resumed, make_data, make_module


class Watch(L.Callback):
    """Per training step: the weights rollouts sampled from, and the policy's at the start of its update."""

    def __init__(self) -> None:
        self.sampled, self.update_start, self.validation_stale = [], [], []
        self._due = False

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._due = True

    def on_before_optimizer_step(self, trainer, module, optimizer):
        if self._due:
            self.update_start.append(first_weight(module.policy))
            with module.rollout_model() as model:  # what this step's rollout sampled from
                self.sampled.append(first_weight(model))
            self._due = False

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self.validation_stale.append(module.rollout_weights.stale)


def first_weight(model) -> torch.Tensor:
    return model.get_parameter("model.layers.0.self_attn.q_proj.weight").detach().clone()


def test_rollout_k_samples_from_the_weights_update_k_minus_1_started_from(tiny_model_dir, tmp_path):
    watch = Watch()
    module = make_module(tiny_model_dir, policy={"dtype": "float32"}, sampling={"correction": "token_truncate"})
    # StaleRollouts' snapshot comes after Watch's look: Watch sees the weights the rollout used.
    steps, _ = fit(module, 4, tmp_path, callbacks=[watch, StaleRollouts()])
    assert len(watch.sampled) == 4
    assert torch.equal(watch.sampled[0], watch.update_start[0])  # the first two from the start weights
    for k in range(1, 4):
        assert torch.equal(watch.sampled[k], watch.update_start[k - 1]), k
        assert not torch.equal(watch.sampled[k], watch.update_start[k]), k  # one update behind
    assert [steps[k]["rollout/staleness"] for k in (2, 3, 4)] == [1.0, 1.0, 1.0]
    assert steps[3]["sampling/importance_sampling_ratio/min"] < 1  # the stale sampling log-probs reach the update
    assert not module.rollout_weights.stale  # off after the fit


def test_validation_samples_from_the_current_policy(tiny_model_dir, tmp_path):
    watch = Watch()
    module = make_module(tiny_model_dir, policy={"dtype": "float32"})
    L.seed_everything(0)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, val_check_interval=1,
                        limit_val_batches=1, num_sanity_val_steps=0, callbacks=[watch, StaleRollouts()],
                        default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, datamodule=make_data())
    assert watch.validation_stale and not any(watch.validation_stale)
    assert len(watch.sampled) == 2 and torch.equal(watch.sampled[1], watch.update_start[0])


class TrainingStepOrder(L.Callback):
    """The prompts of every training batch, in the order the fit trained on them."""

    def __init__(self) -> None:
        self.prompts = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.prompts.append(list(batch["prompt"]))


def fit_with_validation(module, max_steps, root, callbacks, accelerator="cpu"):
    """Epochs of four batches, validating after the third of each."""
    L.seed_everything(0)
    recorder = StepRecorder()
    trainer = L.Trainer(max_steps=max_steps, accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, val_check_interval=3,
                        limit_val_batches=1, num_sanity_val_steps=0, log_every_n_steps=1,
                        callbacks=[recorder, *callbacks], default_root_dir=root)  # fmt: skip
    trainer.fit(module, datamodule=make_data())
    return recorder.steps


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("accelerator", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_overlap_trains_exactly_as_the_stale_run_without_it(tiny_model_dir, tmp_path, accelerator):
    """Sampling the next batch on a worker while the current one trains changes nothing but the
    timing: with keyed sampling every step samples the same completions, across an epoch's end
    (its first batch is sampled in place) and validations (the batch after one is sampled again).
    Only float rounding may differ: CPU BLAS splits a product by the threads it finds free, and the
    engine's sampling log-probs are computed on the worker thread. On CUDA the worker samples on its
    own stream, with CUDA graphs, while the update runs."""
    settings = dict(
        policy={"dtype": "float32"}, sampling={"correction": "token_truncate", "seed": 7}, kl={"beta": 0.04}
    )
    runs = {}
    for overlap in (False, True):
        order = TrainingStepOrder()
        stale = StaleRollouts(overlap=overlap)
        module = make_module(tiny_model_dir, **settings)
        runs[overlap] = fit_with_validation(module, 6, tmp_path / str(overlap), [order, stale], accelerator), order.prompts
        sampler = module._samplers[accelerator]  # after a fit the module is back on the CPU
        assert not sampler.ahead.pending and not module.rollout_weights.stale
        # Sampled in place: the first batch, the one after the validation after step 3, the first of epoch 2.
        assert stale.sampled_in_place == (3 if overlap else 0)
        assert sampler.ahead.taken == (6 if overlap else 0)  # through the worker, in place or ahead
    (plain, plain_order), (overlapped, overlapped_order) = runs[False], runs[True]
    assert overlapped_order == plain_order and len(plain_order) == 6
    assert sorted(plain) == list(range(1, 7))
    assert [plain[k]["rollout/staleness"] for k in range(2, 7)] == [1.0] * 5
    assert sorted(overlapped) == sorted(plain)
    for step in plain:
        for name in ("reward", "reward_std", "completions/mean_length", "perf/generated_tokens"):
            assert overlapped[step][name] == plain[step][name], (step, name)
        torch.testing.assert_close(overlapped[step], plain[step], rtol=1e-4, atol=1e-7, msg=lambda m: f"{step}: {m}")


def test_overlap_steps_aside_for_a_training_step_that_samples_otherwise(tiny_model_dir, tmp_path):
    """A training_step that asks for other samples than the base module's never takes the rollout
    sampled ahead: the callback says so once and trains on, without overlap."""

    class OwnSampling(GRPO):
        def generate(self, batch, group_size, sampling, with_logprobs=False):
            return super().generate(batch, group_size, sampling, with_logprobs=False)

    module = make_module(tiny_model_dir, cls=OwnSampling, policy={"dtype": "float32"})
    stale = StaleRollouts(overlap=True)
    with pytest.warns(UserWarning, match="overlap is off"):
        steps, _ = fit(module, 3, tmp_path, callbacks=[stale])
    assert stale.overlap is False and sorted(steps) == [1, 2, 3]
    assert steps[3]["rollout/staleness"] == 1.0


# ---------------------------------------------------------------- up to k steps


class TrainedPrompts(L.Callback):
    """The prompts each training batch brought, and those each optimizer step trained on."""

    def __init__(self) -> None:
        self.batches, self.trained = [], {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches.append(list(batch["prompt"]))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step not in self.trained and trainer.global_step > 0:
            self.trained[trainer.global_step] = sorted(set(module.last_rollout.prompts))


def test_each_update_trains_on_the_rollout_sampled_k_batches_before(tiny_model_dir, tmp_path):
    k, steps_wanted = 2, 4
    prompts = TrainedPrompts()
    module = make_module(tiny_model_dir, policy={"dtype": "float32"}, sampling={"correction": "token_truncate"})
    steps, trainer = fit(module, steps_wanted, tmp_path, callbacks=[prompts, StaleRollouts(max_staleness=k)])
    assert sorted(steps) == list(range(1, steps_wanted + 1)) and len(prompts.batches) == steps_wanted + k
    for step in steps:  # the first k batches only sample: step j trains the batch before batch j - 1 + k by k
        assert prompts.trained[step] == sorted(set(prompts.batches[step - 1])), step
    # Batch b samples at version b - k (0 while the queue fills): the lag grows 0, 1, then stays at k.
    assert [steps[j]["rollout/staleness"].item() for j in steps] == [0.0, 1.0, 2.0, 2.0]
    assert all(steps[j]["rollout/version_spread"].item() == 0.0 for j in steps)  # one version per rollout
    assert steps[4]["sampling/importance_sampling_ratio/min"] < 1  # sampled by weights 2 steps old
    assert module.stale_queue is None and not module.rollout_weights.stale  # off after the fit


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "partial"])
def test_a_fit_with_stale_rollouts_resumes_exactly_from_its_checkpoint(tiny_model_dir, tmp_path, partial):
    """The queue of rollouts sampled ahead (partial ones too) is saved in the checkpoint, not rebuilt."""
    settings = dict(policy={"dtype": "float32"}, sampling={"correction": "icepop"})
    total, stop = 5, 3  # saved at the second batch of the second epoch

    full, path, resumed, trainer = fit_stopped_and_resumed(
        lambda: make_module(tiny_model_dir, **settings), total, stop, tmp_path,
        lambda: [StaleRollouts(max_staleness=2, partial_rollouts=partial)])  # fmt: skip
    state = read_checkpoint(path)["training_state"][0]
    assert len(state["buffers"]["stale_queue"]["kept"]) == 2 and state["policy_version"] == stop
    assert trainer.global_step == total
    assert_same_steps(resumed, full, stop + 1, total)
    lag = resumed[total]["rollout/staleness"].item()
    assert 1.0 < lag < 2.0 if partial else lag == 2.0  # partial: the second chunk is a version younger


def test_a_one_step_stale_fit_resumes_exactly_from_its_checkpoint(tiny_model_dir, tmp_path):
    """The weights the next rollout samples from (those the last update started from) are saved in the
    checkpoint: the first rollout after the resume is one step stale, as in the uninterrupted fit."""
    settings = dict(policy={"dtype": "float32"}, sampling={"correction": "token_truncate"})
    total, stop = 4, 2

    full, path, resumed, trainer = fit_stopped_and_resumed(
        lambda: make_module(tiny_model_dir, **settings), total, stop, tmp_path,
        lambda: [StaleRollouts(max_staleness=1, overlap=False)])  # fmt: skip
    snapshot = read_checkpoint(path)[SNAPSHOT_KEY]
    assert snapshot["version"] == stop - 1 and "model.embed_tokens.weight" in snapshot["weights"]
    assert trainer.global_step == total
    assert resumed[stop + 1]["rollout/staleness"] == 1.0
    assert_same_steps(resumed, full, stop + 1, total)


@pytest.mark.parametrize("rollout_engine", ["hf", "static"])
def test_partial_rollouts_continue_each_completion_with_the_next_updates_weights(tiny_model_dir, tmp_path, rollout_engine):
    """k = 2, six tokens: the first three of a completion sampled with its batch's weights, the rest
    with the next batch's. Batch b samples at version max(0, b - 2) and trains at batch b + 2. On the HF
    generate path and in the static-cache engine, which samples every chunk of the fit."""
    module = make_module(tiny_model_dir, policy={"dtype": "float32"}, engine=EngineOptions(rollout=rollout_engine, compile=False))
    steps, _ = fit(module, 4, tmp_path, callbacks=[StaleRollouts(max_staleness=2, partial_rollouts=True)])
    assert sorted(steps) == [1, 2, 3, 4]
    # Steps 1, 2 train batches 0, 1: both chunks at version 0 (no update yet), lags 0 and 1.
    assert [steps[j]["rollout/version_spread"].item() for j in (1, 2)] == [0.0, 0.0]
    assert [steps[j]["rollout/staleness/max"].item() for j in (1, 2)] == [0.0, 1.0]
    # Steps 3, 4 train batches 2, 3: first chunks at versions 0, 1, the rest one version later.
    assert [steps[j]["rollout/version_spread"].item() for j in (3, 4)] == [1.0, 1.0]
    assert [steps[j]["rollout/staleness/max"].item() for j in (3, 4)] == [2.0, 2.0]
    assert all(1.0 < steps[j]["rollout/staleness"].item() < 2.0 for j in (3, 4))  # lags 2 and 1, by token
    assert steps[4]["completions/mean_length"] > 3  # completions did go on past their first chunk
    engine = module.sampler.engine
    assert (engine is None) == (rollout_engine == "hf")


def test_rollouts_in_flight_continue_together_without_growing_the_static_engine(tiny_model_dir, tmp_path, monkeypatch):
    """k = 3: from the third batch on, the two queued rollouts that are not done continue in one call; the
    static engine stays the size of one rollout (it pads every rollout to its rows, so a bigger one would
    slow them all)."""
    import grpo_lightning.rollout.stale as stale

    together = []

    def recorded(model, tokenizer, rollouts, *args):
        together.append(len(rollouts))
        return continue_rollouts(model, tokenizer, rollouts, *args)

    monkeypatch.setattr(stale, "continue_rollouts", recorded)
    module = make_module(tiny_model_dir, policy={"dtype": "float32"}, engine=EngineOptions(rollout="static", compile=False))
    steps, _ = fit(module, 3, tmp_path, callbacks=[StaleRollouts(max_staleness=3, partial_rollouts=True)])
    assert sorted(steps) == [1, 2, 3]
    assert together[:2] == [1, 2] and set(together[2:]) == {2}  # batch 1 continues batch 0; then two at a time
    assert module.sampler.engine.max_batch_size == len(module.last_rollout.completions)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"partial_rollouts": True}, "^StaleRollouts.partial_rollouts: a completion continues"),
        ({"max_staleness": 17}, "^StaleRollouts.max_staleness: must be an integer from 1 to 16"),
        ({"max_staleness": 0}, "^StaleRollouts.max_staleness: must be an integer from 1 to 16"),
        ({"max_staleness": 2, "overlap": True}, "^StaleRollouts.overlap: only one-step staleness samples ahead"),
    ],
)
def test_bad_staleness_settings_name_the_field_and_the_fix(arguments, message):
    with pytest.raises(ConfigError, match=message):
        StaleRollouts(**arguments)


class Recorder:
    def __init__(self):
        self.values = {}

    def update(self, name, value, weight=1.0, reduce="mean"):
        self.values[name] = (float(value), float(weight), reduce)


def rollout_sampled_at(versions: list, mask: list) -> Rollout:
    rows, width = len(versions), len(versions[0])
    return Rollout(group_size=1, prompt_ids=torch.zeros(rows, 1, dtype=torch.long), prompt_mask=torch.ones(rows, 1),
                   completion_ids=torch.zeros(rows, width, dtype=torch.long), completion_mask=torch.tensor(mask),
                   truncated=torch.zeros(rows, dtype=torch.bool), prompts=[""] * rows, completions=[""] * rows,
                   sampling_version=torch.tensor(versions))  # fmt: skip


def test_the_queue_hands_over_the_rollout_k_batches_old_with_its_lag_by_hand():
    queue, metrics = StaleQueue(2), Recorder()
    oldest = rollout_sampled_at([[3, 4, 9], [5, 0, 0]], [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert queue.exchange(oldest, 10, metrics) is None and queue.exchange(rollout_sampled_at([[9]], [[1.0]]), 10, metrics) is None
    assert metrics.values == {}  # nothing trained while the queue fills
    handed = queue.exchange(rollout_sampled_at([[10]], [[1.0]]), 10, metrics)
    assert torch.equal(handed.sampling_version, oldest.sampling_version)  # the first queued, on the new one's device
    # lags 10 - 3, 10 - 4, 10 - 9, 10 - 5 over the four kept tokens; versions 3 to 9
    assert metrics.values["rollout/staleness"] == (4.75, 4.0, "mean")
    assert metrics.values["rollout/staleness/max"] == (7.0, 1.0, "max")
    assert metrics.values["rollout/version_spread"] == (6.0, 1.0, "max")
    assert len(queue.parts) == 2 and queue.exchanges == 3


def test_a_training_step_that_does_not_queue_its_rollouts_is_refused():
    stale, module = StaleRollouts(max_staleness=2), types.SimpleNamespace(stale_queue=StaleQueue(2))
    with pytest.raises(ConfigError, match="^StaleRollouts.max_staleness: this module's training_step does not queue"):
        stale.on_train_batch_end(None, module, None, None, 0)


def queue_of(k: int, batches: int, partial: bool = False) -> StaleQueue:
    """A queue of depth ``k`` after ``batches`` exchanges, batch ``b`` sampled at version ``b``."""
    queue = StaleQueue(k, (lambda rollout: rollout) if partial else None)
    for batch in range(batches):
        queue.exchange(rollout_sampled_at([[batch]], [[1.0]]), batch, Recorder())
    return queue


def test_a_queue_resumed_with_a_smaller_k_drops_its_oldest_rollouts_and_says_so():
    resumed = StaleQueue(2)
    with pytest.warns(UserWarning, match=r"saved with max_staleness=4 and this fit has max_staleness=2: the 2 oldest of its 4"):
        resumed.load_state_dict(queue_of(4, 6).state_dict())  # batches 2, 3, 4, 5 queued
    assert [part.sampling_version.item() for part in resumed.parts] == [4, 5]
    metrics = Recorder()
    for batch in (6, 7):  # each update trains on the rollout 2 batches before, from the first
        assert resumed.exchange(rollout_sampled_at([[batch]], [[1.0]]), batch, metrics).sampling_version.item() == batch - 2
        assert metrics.values["rollout/staleness"][0] == 2.0 and len(resumed.parts) == 2


def test_a_queue_resumed_with_a_larger_k_fills_and_says_so():
    resumed = StaleQueue(3)
    with pytest.warns(UserWarning, match=r"max_staleness=2 and this fit has max_staleness=3: .* the next 1 training batches only sample"):
        resumed.load_state_dict(queue_of(2, 5).state_dict())  # batches 3, 4
    assert resumed.exchange(rollout_sampled_at([[5]], [[1.0]]), 5, Recorder()) is None
    assert resumed.exchange(rollout_sampled_at([[6]], [[1.0]]), 6, Recorder()).sampling_version.item() == 3


def test_a_queue_resumed_with_the_same_settings_loads_silently(recwarn):
    resumed = StaleQueue(2)
    resumed.load_state_dict(queue_of(2, 1).state_dict())  # still filling: one queued
    assert len(resumed.parts) == 1 and not recwarn.list


@pytest.mark.parametrize(("saved", "resumed"), [((4, True), (2, True)), ((2, True), (2, False)), ((2, False), (2, True))])
def test_a_queue_of_partial_rollouts_resumes_only_with_its_own_settings(saved, resumed):
    queue = StaleQueue(resumed[0], (lambda rollout: rollout) if resumed[1] else None)
    with pytest.raises(ConfigError, match=rf"^StaleRollouts: the checkpoint's queue .* max_staleness={saved[0]}, "
                       rf"partial_rollouts={str(saved[1]).lower()} and this fit has max_staleness={resumed[0]}.*; "
                       rf"set max_staleness to {saved[0]}"):  # fmt: skip
        queue.load_state_dict(queue_of(saved[0], 5, partial=saved[1]).state_dict())


@pytest.mark.parametrize("stale_queue", [None, "old checkpoint"])
def test_a_fit_resumed_without_the_queue_says_which_rollouts_it_drops(tiny_model_dir, stale_queue):
    """A checkpoint's queue (k = 3) that the resumed module does not hold (no StaleRollouts, or k = 1)
    is dropped with a warning that names k and the fix; a checkpoint from before k was saved too."""
    saved = make_module(tiny_model_dir)
    saved.stale_queue = queue_of(3, 5)
    state = saved.training_state()
    if stale_queue == "old checkpoint":
        del state["buffers"]["stale_queue"]["max_staleness"]
    resumed = make_module(tiny_model_dir)
    assert resumed.stale_queue is None
    with pytest.warns(UserWarning, match=r"holds 3 rollouts queued by StaleRollouts\(max_staleness=3\).*they are dropped.*"
                      r"resume with StaleRollouts\(max_staleness=3\)"):  # fmt: skip
        resumed.load_training_state(state)
