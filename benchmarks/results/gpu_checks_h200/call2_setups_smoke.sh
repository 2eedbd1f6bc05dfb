#!/bin/bash
# Call 2 (2 x H200, at fc34453): card 1: one W1 fit per user setup, then the CUDA tests the step context touches;
# card 0: the smoke sweep on the GPU (its wall-clock against its cells' training time).
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 START=$(date +%s)
mkdir -p /tmp/gg /tmp/bin
for cmd in "grpo-lightning|grpo_lightning.cli" "grpo-lightning-ablate|grpo_lightning.ablation.run" "grpo-lightning-report|grpo_lightning.report.cli" "grpo-lightning-quickstart|grpo_lightning.quickstart"; do
  printf '#!/bin/sh\nexec python3 -m %s "$@"\n' "${cmd#*|}" > /tmp/bin/${cmd%%|*}; chmod +x /tmp/bin/${cmd%%|*}
done
export PATH=/tmp/bin:$PATH
git log --oneline -1 2>/dev/null
(
  export CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_CACHE_DIR=/tmp/c2/inductor TRITON_CACHE_DIR=/tmp/c2/triton
  for setup in "bf16|--dtype bfloat16" "fp32_bf16_rollout|--dtype float32 --rollout-dtype bfloat16" "lora|--lora-rank 16"; do
    name=${setup%%|*}; args=${setup#*|}; s=$(date +%s)
    echo "=== $name: $args" >> $OUT/setups.log
    taskset -c 16-31 timeout 150 python3 benchmarks/run.py --workload W1 --steps 4 --first-step none --workdir /tmp/w1b $args >> $OUT/setups.log 2>&1
    echo "setup $name rc $? $(( $(date +%s) - s )) s"
  done
  taskset -c 16-31 timeout $(( 560 - $(date +%s) + START )) python3 -m pytest -n 12 -q -rfE -p no:cacheprovider tests/test_update.py tests/test_ppo.py \
    tests/test_online_dpo_grpo.py tests/test_covariance_variants.py tests/test_process_grpo.py tests/test_variant_golden.py tests/test_stale_rollouts.py \
    tests/agents/test_multi_turn.py tests/test_logprobs.py tests/test_module.py tests/test_lora.py tests/test_nonfinite.py tests/test_strategies.py \
    tests/engine tests/generation tests/test_gguf_copies.py tests/test_architecture.py > $OUT/cuda_tests.log 2>&1
  echo "cuda tests rc $?"; tail -1 $OUT/cuda_tests.log
) &
(
  export CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/c0/inductor TRITON_CACHE_DIR=/tmp/c0/triton
  s=$(date +%s)
  taskset -c 0-15 timeout 400 grpo-lightning-ablate --config-name smoke 'base_configs=[configs/trainer/gpu.yaml,configs/data/arithmetic.yaml,configs/model/tiny.yaml]' output_dir=/tmp/smoke > $OUT/smoke.log 2>&1
  echo "smoke rc $? wall $(( $(date +%s) - s )) s" | tee -a $OUT/smoke.log
  python3 -c "import json,glob;m=[json.load(open(f)) for f in glob.glob('/tmp/smoke/**/metrics.json',recursive=True)];print('smoke cells',len(m),'train_s',round(sum(x.get('train_time_s') or 0 for x in m),1),'cell_wall_s',round(sum(x.get('wall_time_s') or 0 for x in m),1))" | tee -a $OUT/smoke.log
  cp -r /tmp/smoke $OUT/smoke_sweep 2>/dev/null; find $OUT/smoke_sweep -name "*.ckpt" -delete -o -name "events.out*" -delete 2>/dev/null
) &
wait
grep -E "^ *[0-9]+ |^med|first_step|^engine|Error|error|step" $OUT/setups.log | head -40
grep -E "FAILED|ERROR" $OUT/cuda_tests.log | head -20
