# sourced on the GPU machine from the repository root: the CUDA tests and a W1 fit in each user setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 START=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
for setup in "bf16|--dtype bfloat16" "fp32_bf16_rollout|--dtype float32 --rollout-dtype bfloat16" "lora|--lora-rank 16"; do
  name=${setup%%|*}; args=${setup#*|}
  ( TORCHINDUCTOR_CACHE_DIR=/tmp/$name/inductor TRITON_CACHE_DIR=/tmp/$name/triton timeout 230 \
      python3 benchmarks/run.py --workload W1 --steps 3 --first-step none --workdir /tmp/w1_$name $args > $OUT/setup_$name.log 2>&1
    echo "setup $name rc $? $(( $(date +%s) - START )) s" ) &
done
( timeout 330 python3 -m pytest -n 8 -q -rfE -p no:cacheprovider tests/training tests/runtime tests/rollout/engine tests/rollout/test_stale_rollouts.py \
    tests/rollout/generation/test_sampler.py tests/models/test_logprobs.py tests/agents/test_multi_turn.py tests/algorithms/test_variant_golden.py > $OUT/cuda_tests.log 2>&1
  echo "cuda tests rc $? $(( $(date +%s) - START )) s"; tail -1 $OUT/cuda_tests.log ) &
wait
for f in $OUT/setup_*.log; do echo "== $f"; grep -iE "s/step|step_s|median|error" $f | tail -3 | cut -c1-300; done
grep -E "FAILED|ERROR" $OUT/cuda_tests.log | head -20
