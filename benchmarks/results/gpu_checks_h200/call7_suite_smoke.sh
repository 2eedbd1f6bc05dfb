#!/bin/bash
# Final call (2 x H200): the whole suite, one half per card; beside it on card 0, the smoke sweep with forked cells.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 START=$(date +%s)
mkdir -p /tmp/gg /tmp/bin
for cmd in "grpo-lightning|grpo_lightning.cli" "grpo-lightning-ablate|grpo_lightning.ablation.run" "grpo-lightning-report|grpo_lightning.report.cli" "grpo-lightning-quickstart|grpo_lightning.quickstart"; do
  printf '#!/bin/sh\nexec python3 -m %s "$@"\n' "${cmd#*|}" > /tmp/bin/${cmd%%|*}; chmod +x /tmp/bin/${cmd%%|*}
done
export PATH=/tmp/bin:$PATH
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
ls tests/*.py tests/*/ -d | grep -v conftest > /tmp/all.txt
awk 'NR%2==1' /tmp/all.txt > /tmp/a.txt; awk 'NR%2==0' /tmp/all.txt > /tmp/b.txt
for half in a b; do
  card=$([ $half = a ] && echo 0 || echo 1); cores=$([ $half = a ] && echo 0-11 || echo 16-31); workers=$([ $half = a ] && echo 10 || echo 14)
  ( CUDA_VISIBLE_DEVICES=$card TORCHINDUCTOR_CACHE_DIR=/tmp/s$half/inductor TRITON_CACHE_DIR=/tmp/s$half/triton GRPO_LIGHTNING_CACHE=/tmp/s$half/grpo \
    taskset -c $cores timeout $(( ${SUITE_S:-555} - $(date +%s) + START )) python3 -m pytest -n $workers -v -p no:cacheprovider -p no:randomly \
      ${DESELECT} $(cat /tmp/$half.txt) > $OUT/suite_$half.log 2>&1
    echo "suite $half rc $? $(( $(date +%s) - START )) s" ) &
done
(
  export CUDA_VISIBLE_DEVICES=0 GRPO_LIGHTNING_CACHE=/tmp/smoke_cache
  s=$(date +%s)
  taskset -c 12-15 timeout 420 python3 -m grpo_lightning.ablation.run --config-name smoke 'base_configs=[configs/trainer/gpu.yaml,configs/data/arithmetic.yaml,configs/model/tiny.yaml]' output_dir=/tmp/smoke > $OUT/smoke.log 2>&1
  echo "smoke rc $? wall $(( $(date +%s) - s )) s" | tee -a $OUT/smoke.log
  python3 -c "import json,glob;m=[json.load(open(f)) for f in glob.glob('/tmp/smoke/**/metrics.json',recursive=True)];print('smoke cells',len(m),'train_s',round(sum(x.get('train_time_s') or 0 for x in m),1),'cell_wall_s',round(sum(x.get('wall_time_s') or 0 for x in m),1), [round(x.get('wall_time_s') or 0,1) for x in m])" | tee -a $OUT/smoke.log
  grep -h "Resolving\|warm\|cell .*done\|WARNING\|subprocess" $OUT/smoke.log | head -12
) &
wait
for half in a b; do tail -1 $OUT/suite_$half.log; grep -E "^(FAILED|ERROR)|\] (FAILED|ERROR)" $OUT/suite_$half.log | head -20; done
