# K: CUDA's start-up against the imports (cuda_probe.py), then W1's warm first step at HEAD (three warm children).
. .scratch/common.sh
nvidia-smi --query-gpu=name,persistence_mode --format=csv,noheader
python3 -c "import grpo_lightning.cli.app" >/dev/null 2>&1  # fill the bytecode cache
for r in 1 2; do for m in seq thread seqblas threadblas importonly gil; do taskset -c 0-11 python3 .scratch/cuda_probe.py $m 2>&1 | tail -1; done; done
A="--workload W1 --steps 2 --workdir /tmp/w1"
s=$(date +%s); taskset -c 0-11 timeout 150 python3 benchmarks/run.py $A --first-step both > $OUT/w1.log 2>&1; echo "w1 rc $? $(( $(date +%s)-s )) s"; grep -E "first step from|^ours:" $OUT/w1.log
for i in 1 2 3; do s=$(date +%s.%N); taskset -c 0-11 timeout 60 python3 benchmarks/run.py $A --first-step none --first-step-child > $OUT/child$i.log 2>&1
python3 -c "import json; d=json.loads(open('$OUT/child$i.log').read().strip().splitlines()[-1]); print('warm child $i: first step from launch', round(d['first_step_end_time']-$s,2), 's; the step alone', round(d['step_s'][0],2), 's')"; done
