#!/bin/bash
# GPU0 (cores 0-15): W1 first step and steady state, everything compiled, then the defaults against TRL.
# GPU1 (cores 16-31): one W1 fit per user setup with regional compilation, then the whole suite.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
mkdir -p /tmp/gg && cp .gg/part_aa /tmp/gg/
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; git log --oneline -1 2>/dev/null
export PYTHONUNBUFFERED=1 START=$(date +%s)
(
  export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/c0/inductor TRITON_CACHE_DIR=/tmp/c0/triton
  s=$(date +%s)
  taskset -c 0-15 timeout 300 python3 benchmarks/run.py --workload W1 --steps 4 --workdir /tmp/w1 --compile on --logprob-compile on --model-compile on --out $OUT/w1_compiled.json > $OUT/w1_compiled.log 2>&1
  echo "w1_compiled rc $? $(( $(date +%s) - s )) s"
  s=$(date +%s)
  export TORCHINDUCTOR_CACHE_DIR=/tmp/c1/inductor TRITON_CACHE_DIR=/tmp/c1/triton
  taskset -c 0-15 timeout 270 python3 benchmarks/run.py --workload W1 --steps 4 --workdir /tmp/w1 --compare trl --trl-steps 3 --out $OUT/w1_defaults.json > $OUT/w1_defaults.log 2>&1
  echo "w1_defaults rc $? $(( $(date +%s) - s )) s"
) &
(
  export CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_CACHE_DIR=/tmp/c2/inductor TRITON_CACHE_DIR=/tmp/c2/triton
  for setup in "bf16|--dtype bfloat16" "fp32_bf16_rollout|--dtype float32 --rollout-dtype bfloat16" "lora|--lora-rank 16"; do
    name=${setup%%|*}; args=${setup#*|}; s=$(date +%s)
    echo "=== $name: $args" >> $OUT/setups.log
    taskset -c 16-31 timeout 150 python3 benchmarks/run.py --workload W1 --steps 3 --first-step none --workdir /tmp/w1b $args --compile on --logprob-compile on --model-compile on >> $OUT/setups.log 2>&1
    echo "setup $name rc $? $(( $(date +%s) - s )) s"
  done
  s=$(date +%s)
  taskset -c 16-31 timeout $(( 560 - $(date +%s) + START )) python3 -m pytest -n 14 -v -p no:cacheprovider tests > $OUT/suite.log 2>&1
  echo "suite rc $? $(( $(date +%s) - s )) s"; tail -3 $OUT/suite.log
) &
wait
grep -E "^ *[0-9]+ |^med|first_step|^engine" $OUT/w1_compiled.log $OUT/w1_defaults.log | head -40
grep -E "^ *[0-9]+ |^med|^engine|Error|error" $OUT/setups.log | head -30
grep -c PASSED $OUT/suite.log; grep -E "FAILED|ERROR" $OUT/suite.log | head -20
