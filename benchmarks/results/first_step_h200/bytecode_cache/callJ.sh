# J: W1's first step at the current code (the Triton import gone), ours alone: cold and warm, then three more warm children.
. .scratch/common.sh
A="--workload W1 --steps 2 --workdir /tmp/w1"
s=$(date +%s); taskset -c 0-11 timeout 150 python3 benchmarks/run.py $A --first-step both > $OUT/w1.log 2>&1; echo "w1 rc $? $(( $(date +%s)-s )) s"; grep -E "first step from|^ours:" $OUT/w1.log
for i in 1 2 3; do s=$(date +%s.%N); taskset -c 0-11 timeout 60 python3 benchmarks/run.py $A --first-step none --first-step-child > $OUT/child$i.log 2>&1
python3 -c "import json; d=json.loads(open('$OUT/child$i.log').read().strip().splitlines()[-1]); print('warm child $i: first step from launch', round(d['first_step_end_time']-$s,2), 's; the step alone', round(d['step_s'][0],2), 's')"; done
