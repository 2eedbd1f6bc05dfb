"""The rollout data type and the buffer of groups kept between generation batches."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.rollout.types import MicroBatch, Rollout, RolloutBuffer


def rollout(groups: int, group_size: int = 2, length: int = 3, tag: str = "") -> Rollout:
    rows = groups * group_size
    return Rollout(
        group_size=group_size,
        prompt_ids=torch.arange(rows * 2).view(rows, 2),
        prompt_mask=torch.ones(rows, 2),
        completion_ids=torch.arange(rows * length).view(rows, length),
        completion_mask=torch.ones(rows, length),
        truncated=torch.zeros(rows, dtype=torch.bool),
        prompts=[f"{tag}{row // group_size}" for row in range(rows)],
        completions=[f"c{row}" for row in range(rows)],
        columns={"answer": [str(row) for row in range(rows)]},
        rewards=torch.arange(rows, dtype=torch.float32),
    )


def test_a_rollout_state_rebuilds_it_with_its_tensors_on_the_cpu():
    original = rollout(2)
    state = original.state_dict()
    assert all(v.device.type == "cpu" for v in state.values() if isinstance(v, torch.Tensor))
    rebuilt = Rollout(**state)
    assert rebuilt.prompts == original.prompts and rebuilt.columns == original.columns
    assert torch.equal(rebuilt.completion_ids, original.completion_ids) and rebuilt.old_logp is None


def test_a_rollout_moves_every_tensor_and_keeps_the_text():
    moved = rollout(2).to("meta")
    assert moved.device.type == "meta" and moved.rewards.device.type == "meta"
    assert moved.completions == rollout(2).completions


def test_derived_tensors_follow_the_selected_rows_and_the_device():
    original = rollout(3)
    original.derived["role"] = torch.arange(6) * 10
    picked = original.select_groups(torch.tensor([2, 0]))
    assert picked.derived["role"].tolist() == [40, 50, 0, 10]
    assert original.derived["role"].tolist() == [0, 10, 20, 30, 40, 50]  # its own, not the selection's
    assert original.to("meta").derived["role"].device.type == "meta"
    assert Rollout(**original.state_dict()).derived["role"].tolist() == [0, 10, 20, 30, 40, 50]


def test_a_micro_batch_holds_its_own_rows_of_every_tensor_it_reads():
    whole = rollout(2)
    whole.old_logp = -torch.arange(12.0).view(4, 3)
    whole.derived["returns"] = torch.arange(4.0)
    rows = torch.tensor([3, 1])
    micro = MicroBatch.of(whole, torch.tensor([0.1, 0.2, 0.3, 0.4]), rows, whole.completion_mask[rows], 4,
                          torch.tensor(12.0), {"chosen": torch.arange(4) * 100})  # fmt: skip
    assert micro.rows.tolist() == [3, 1] and micro.advantages.tolist() == pytest.approx([0.4, 0.2])
    assert torch.equal(micro.old_logp, whole.old_logp[rows]) and micro.ref_logp is None
    assert micro.derived["returns"].tolist() == [3.0, 1.0] and micro.derived["chosen"].tolist() == [300, 100]
    assert micro.num_sequences == 4 and float(micro.num_tokens) == 12.0


def test_the_buffer_keeps_marked_groups_and_takes_them_trimmed_in_order():
    buffer = RolloutBuffer()
    buffer.append(rollout(3, tag="a"), torch.tensor([True, False, True]))
    buffer.append(rollout(3, tag="b"), torch.tensor([False, False, False]))
    buffer.append(rollout(3, tag="c"), torch.tensor([False, True, False]))
    assert (buffer.num_groups, buffer.batches, buffer.groups_seen) == (3, 3, 9)
    batch = buffer.take(2, pad_token_id=0)
    assert batch.prompts == ["a0", "a0", "a2", "a2"]
    assert (buffer.num_groups, buffer.batches, buffer.groups_seen) == (0, 0, 0)  # emptied
    assert buffer.take(2, pad_token_id=0) is None


def test_the_buffer_state_round_trips_and_held_groups_follow_new_rollouts_to_their_device():
    buffer = RolloutBuffer()
    buffer.append(rollout(2, tag="a"), torch.tensor([True, True]))
    restored = RolloutBuffer()
    restored.load_state_dict(buffer.state_dict())  # as from a checkpoint: on the CPU
    assert (restored.num_groups, restored.batches, restored.groups_seen) == (2, 1, 2)
    assert torch.equal(restored.parts[0].completion_ids, buffer.parts[0].completion_ids)
    restored.append(rollout(1, tag="b").to("meta"), torch.tensor([True]))  # the next rollout, on its device
    assert {part.device.type for part in restored.parts} == {"meta"}
    batch = restored.take(3, pad_token_id=0)
    assert batch.prompts == ["a0", "a0", "a1", "a1", "b0", "b0"] and batch.device.type == "meta"
    assert {part.device.type for part in RolloutBuffer().to("meta").parts} == set()
    buffer.to("meta")
    assert buffer.parts[0].device.type == "meta"


def test_concat_pads_prompts_left_and_completions_right():
    short, long = rollout(1, length=2), rollout(1, length=4)
    merged = Rollout.concat([short, long], pad_token_id=-1)
    assert merged.completion_ids.shape == (4, 4)
    assert merged.completion_ids[0].tolist()[-2:] == [-1, -1] and merged.completion_mask[0].tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("groups", [torch.tensor([False, False])])
def test_an_append_of_no_group_counts_the_batch_only(groups):
    buffer = RolloutBuffer()
    buffer.append(rollout(2), groups)
    assert (buffer.num_groups, buffer.batches, buffer.groups_seen, buffer.parts) == (0, 1, 2, [])


def test_model_token_ids_leave_out_padding_and_the_environments_replies():
    ids = torch.tensor([[5, 6, 2, 0, 0], [7, 8, 9, 10, 2]])
    model = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 1, 1]])  # row 1: the environment replied with 8, 9
    replies = torch.tensor([[0, 0, 0, 0, 0], [0, 1, 1, 0, 0]])
    one = Rollout(group_size=2, prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                  completion_ids=ids, completion_mask=model, truncated=torch.zeros(2, dtype=torch.bool),
                  prompts=["p", "p"], completions=["a", "b"], environment_mask=replies)  # fmt: skip
    assert one.model_token_ids() == [[5, 6, 2], [7, 10, 2]]
