"""One-step-stale rollouts: rollout k samples from the weights the policy had when update k-1
began (as when it is generated while update k-1 runs), the staleness is logged and corrected by
the sampling log-probs, and validation samples from the current policy."""

from __future__ import annotations

import lightning as L
import torch
from test_checkpoint import fit, make_module

from grpo_lightning.stale_rollouts import StaleRollouts


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
    module = make_module(tiny_model_dir, dtype="float32", rollout_correction="token_truncate")
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
    module = make_module(tiny_model_dir, dtype="float32")
    L.seed_everything(0)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, val_check_interval=1,
                        limit_val_batches=1, num_sanity_val_steps=0, callbacks=[watch, StaleRollouts()],
                        default_root_dir=tmp_path)  # fmt: skip
    from test_checkpoint import make_data

    trainer.fit(module, datamodule=make_data())
    assert watch.validation_stale and not any(watch.validation_stale)
    assert len(watch.sampled) == 2 and torch.equal(watch.sampled[1], watch.update_start[0])
