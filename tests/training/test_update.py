"""The update loop: what each micro-batch's hooks receive."""

from __future__ import annotations

import torch

from grpo_lightning.variants import GRPO


class RowsSeen(GRPO):
    """GRPO that keeps the micro-batches its ``token_loss`` received, and marks each minibatch's rows
    in a tensor of its own (``minibatch_derived``)."""

    def minibatch_derived(self, rollout, advantages, rows):
        marked = torch.full((len(rollout),), -1)
        marked[rows] = rows
        return {"minibatch_row": marked}

    def token_loss(self, logp, old_logp, advantages, mask, micro=None):
        self.seen.append(micro)
        return super().token_loss(logp, old_logp, advantages, mask, micro)


def test_each_micro_batch_receives_its_own_rows_of_the_rollout_and_the_minibatch(
    make_module, make_rollout, monkeypatch, one_torch_thread
):
    module = make_module(RowsSeen, optim={"micro_batch_size": 2}, kl={"beta": 0.0})
    module.seen = []
    rollout = make_rollout(module, ["1+1=", "2+3="])  # 8 rows
    rollout.derived["row"] = torch.arange(len(rollout))
    advantages = torch.arange(len(rollout), dtype=torch.float32)
    monkeypatch.setattr(module, "manual_backward", lambda loss: loss.backward())
    rows = torch.tensor([5, 2, 7, 0, 3])  # a shuffled minibatch of 5: micro-batches of 2, 2 and 1
    module.accumulate_gradients(rollout, advantages, rows)

    assert [micro.rows.tolist() for micro in module.seen] == [[5, 2], [7, 0], [3]]
    for micro in module.seen:
        assert torch.equal(micro.derived["row"], micro.rows) and torch.equal(micro.derived["minibatch_row"], micro.rows)
        assert torch.equal(micro.advantages, micro.rows.float())
        assert torch.equal(micro.mask, rollout.completion_mask[micro.rows])
        assert micro.num_sequences == 5 and float(micro.num_tokens) == float(rollout.completion_mask[rows].sum())
