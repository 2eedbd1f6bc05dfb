"""FLOP-proportional compute (grpo_lightning.runtime.compute): N counted by hand from the configuration,
token passes from the rollout's own masks, and ``perf/flops`` of a real one-step fit."""

import lightning as L
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_lightning.runtime.compute import ComputeMeter, matmul_parameters
from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.variants import GRPO

V, H, I, LAYERS, HEADS, KV = 50, 16, 24, 2, 4, 2


def tiny(tied: bool) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV, tie_word_embeddings=tied)  # fmt: skip
    return Qwen2ForCausalLM(config)


def by_hand() -> int:
    """Per layer: q (H x H + H bias), k and v (H x KV*d + bias each), o (H x H), gate/up/down
    (3 x H x I), two RMS norms (2H); then the final norm (H) and the output projection (V x H)."""
    d = H // HEADS
    attention = (H * H + H) + 2 * (H * KV * d + KV * d) + H * H
    layer = attention + 3 * H * I + 2 * H
    return LAYERS * layer + H + V * H


@pytest.mark.parametrize("tied", [True, False])
def test_matmul_parameters_leave_out_the_input_embeddings_and_keep_the_output_projection(tied):
    assert matmul_parameters(tiny(tied)) == by_hand()


def test_a_backward_counts_twice_a_forward_and_flops_are_2n_per_token_pass():
    meter = ComputeMeter()
    meter.add_forward(torch.tensor([[0, 1, 1]]), torch.tensor([[1, 1, 0, 0]]))  # 4 real tokens, forward
    meter.add_forward(torch.tensor([[1, 1]]), backward=True)  # 2 tokens, forward and backward: 6
    assert meter.total() == 10.0
    assert meter.flops(1000) == 20_000.0
    restored = ComputeMeter()
    restored.load_state_dict(meter.state_dict())
    assert restored.total() == 10.0


def test_a_fit_logs_the_flops_of_sampling_and_one_forward_and_backward(tiny_model_dir, tmp_path):
    """On-policy, one minibatch, no KL: one sampling pass and one forward and backward over every
    real token of the rollout (prompt, completion), and no log-prob pass: 2N x 4 x tokens."""
    module = GRPO(model=tiny_model_dir, sampling={"group_size": 2, "max_new_tokens": 6}, optim={"micro_batch_size": 4},
                  kl={"beta": 0.0})  # fmt: skip
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                        default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, ArithmeticDataModule(num_train=8, num_val=2, batch_size=2))

    rollout = module.last_rollout
    tokens = float(rollout.prompt_mask.sum() + rollout.completion_mask.sum())
    n = matmul_parameters(module.policy)
    assert module.last_step_metrics["perf/flops"] == pytest.approx(2 * n * 4 * tokens)


def test_report_curves_can_be_drawn_against_training_flops():
    """A point at TensorBoard step s sits at the FLOPs logged up to and including s."""
    import numpy as np

    from grpo_lightning.ablation.runs import FLOPS_TAG, Run, Series

    def series(steps, values):
        return Series(np.array(steps), np.array(values, dtype=float), np.zeros(len(steps)))

    run = Run("run", {FLOPS_TAG: series([1, 2, 3, 4], [10, 20, 30, 40]), "val/accuracy": series([2, 4], [0.5, 0.7])},
              initial={"val/accuracy": 0.25})  # fmt: skip
    x, y = run.axis("val/accuracy", "flops")
    assert x.tolist() == [0.0, 20.0, 40.0] and y.tolist() == [0.25, 0.5, 0.7]


def test_a_report_says_which_runs_its_flops_column_leaves_out(tmp_path):
    """Runs recorded before ``perf/flops`` existed are absent from that column: the report says so."""
    import numpy as np

    from grpo_lightning.report.arms import Arm
    from grpo_lightning.report.sections.curves import curves_section
    from grpo_lightning.report.render.document import Doc, plain_text
    from grpo_lightning.ablation.runs import FLOPS_TAG, Run, Series

    def run(name, flops):
        scalars = {"val/accuracy": Series(np.array([1, 2]), np.array([0.2, 0.3]), np.array([1.0, 2.0]))}
        if flops:
            scalars[FLOPS_TAG] = Series(np.array([1, 2]), np.array([10.0, 20.0]), np.array([1.0, 2.0]))
        return Run(tmp_path / name, scalars)

    doc = Doc()
    curves_section(doc, [Arm("grpo", [], [run("grpo-seed0", True), run("grpo-seed1", False)])], tmp_path)
    (note,) = [block[1] for block in doc.blocks if block[0] == "p" and "leaves out" in block[1]]
    assert "leaves out 1 run(s) that did not log `perf/flops`" in note and plain_text(note).endswith("grpo-seed1.")
