# H: where W1's warm first step goes (a child on warm caches, plain and under cProfile); the optimizer's CUDA tests and timing.
. .scratch/common.sh
git log --oneline -1
A="--workload W1 --steps 2 --first-step none --workdir /tmp/w1"
taskset -c 0-11 python3 benchmarks/run.py $A > $OUT/w1_parent.log 2>&1; echo "parent rc $?"; grep -E "^ours:" $OUT/w1_parent.log
for i in 1 2; do s=$(date +%s.%N); taskset -c 0-11 python3 benchmarks/run.py $A --first-step-child > $OUT/child$i.log 2>&1
python3 -c "import json,sys; d=json.loads(open('$OUT/child$i.log').read().strip().splitlines()[-1]); print('child $i first step from launch', round(d['first_step_end_time']-$s,2), 's; step alone', round(d['step_s'],2))"
grep -E "time:|auto:" $OUT/child$i.log | cut -c1-250; done
s=$(date +%s.%N); taskset -c 0-11 python3 -m cProfile -o $OUT/child.prof benchmarks/run.py $A --first-step-child > $OUT/child_prof.log 2>&1
python3 -c "import json; d=json.loads(open('$OUT/child_prof.log').read().strip().splitlines()[-1]); print('profiled child', round(d['first_step_end_time']-$s,2), 's')"
python3 - <<'PY'
import pstats, os
f = open(os.environ["OUT"] + "/child_prof_top.txt", "w"); p = pstats.Stats(os.environ["OUT"] + "/child.prof", stream=f); p.sort_stats("cumulative").print_stats(150); p.sort_stats("tottime").print_stats(60)
PY
