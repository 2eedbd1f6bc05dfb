#!/bin/bash
# Cold/warm first-step breakdown of W1 on one GPU.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
nvidia-smi --query-gpu=name --format=csv
export PYTHONUNBUFFERED=1
run() {  # name, cache dir, args...
  name=$1; cache=$2; shift 2
  export TORCHINDUCTOR_CACHE_DIR=$cache/inductor TRITON_CACHE_DIR=$cache/triton
  start=$(date +%s.%N)
  TORCH_LOGS=recompiles python3 benchmarks/run.py --workload W1 --steps 3 --workdir /tmp/w1 "$@" > $OUT/$name.log 2>&1
  end=$(date +%s.%N)
  echo "$name process_s $(echo "$end - $start" | bc)" | tee -a $OUT/summary.txt
  grep -E "^ *[0-9]+ |^med|step " $OUT/$name.log | head -8 | tee -a $OUT/summary.txt
  grep -c "Recompiling" $OUT/$name.log | sed "s/^/$name recompiles /" | tee -a $OUT/summary.txt
}
run default_cold /tmp/c1
run default_warm /tmp/c1
run nologprobcompile_cold /tmp/c2 --model-compile off --logprob-compile off
run nocompile_cold /tmp/c3 --compile off --model-compile off --logprob-compile off
run decodeonly_nomodel_cold /tmp/c4 --model-compile off
