# Sourced by each call: the wheels (once per machine), the CLI's console scripts, the suite's runner.
if [ ! -d /tmp/site/jsonargparse ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 REPO=$PWD
mkdir -p /tmp/bin
for cmd in "grpo-lightning|grpo_lightning.cli" "grpo-lightning-ablate|grpo_lightning.ablation.run" "grpo-lightning-report|grpo_lightning.report.cli" "grpo-lightning-quickstart|grpo_lightning.quickstart"; do
  printf '#!/bin/sh\nexec python3 -m %s "$@"\n' "${cmd#*|}" > /tmp/bin/${cmd%%|*}; chmod +x /tmp/bin/${cmd%%|*}
done
export PATH=/tmp/bin:$PATH
suite() {  # suite HALF SECONDS WORKERS: the node ids in .scratch/ids_HALF.txt
  local half=$1 lim=$2 workers=${3:-15}; mapfile -t ids < .scratch/ids_$half.txt; local s=$(date +%s)
  TORCHINDUCTOR_CACHE_DIR=/tmp/s$half/inductor TRITON_CACHE_DIR=/tmp/s$half/triton GRPO_LIGHTNING_CACHE=/tmp/s$half/grpo \
    timeout $lim python3 -m pytest -n $workers -v -p no:cacheprovider -p no:randomly -rs "${ids[@]}" > $OUT/suite_$half.log 2>&1
  echo "suite $half rc $? in $(( $(date +%s) - s )) s, ${#ids[@]} ids"; tail -1 $OUT/suite_$half.log
  grep -E "(PASSED|FAILED|ERROR|SKIPPED)" $OUT/suite_$half.log | grep -E "FAILED|ERROR" | head -30
}
