#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1
run() {  # name, cache dir, args...
  name=$1; cache=$2; shift 2
  export TORCHINDUCTOR_CACHE_DIR=$cache/inductor TRITON_CACHE_DIR=$cache/triton
  start=$(date +%s.%N)
  TORCH_LOGS=recompiles python3 benchmarks/run.py --workload W1 --workdir /tmp/w1 "$@" > $OUT/$name.log 2>&1
  end=$(date +%s.%N)
  echo "$name process_s $(python3 -c "print(round($end - $start, 1))")" | tee -a $OUT/summary.txt
  grep -E "^ *[0-9]+ |^med|^step|^engine" $OUT/$name.log | head -9 | tee -a $OUT/summary.txt
  grep -c "Recompiling" $OUT/$name.log | sed "s/^/$name recompiles /" | tee -a $OUT/summary.txt
}
run regional_cold /tmp/c1 --steps 4
run regional_warm /tmp/c1 --steps 4
timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_fused_decode.py tests/test_logprobs.py -k "compiled_fused_step or one_compiled or compiled_model" 2>&1 | tail -5
timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_generator.py -k "compiled_decode_step_matches" 2>&1 | tail -5
