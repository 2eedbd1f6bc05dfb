# G: the bytecode cache on the GPU image: import probes, W1's first step (defaults, then everything compiled), the smoke sweep.
. .scratch/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; env | grep -E "PYTHONDONTWRITE|PYCACHE"
( GRPO_LIGHTNING_CACHE=/tmp/smoke_cache taskset -c 12-15 python3 -c "from grpo_lightning.quickstart.warmstart import warm_start; print(warm_start())" > $OUT/warmstart.log 2>&1 ) &
for i in 1 2 3; do GRPO_LIGHTNING_CACHE=/tmp/probe taskset -c 0-11 python3 -c "import time;t=time.time();import grpo_lightning.cli.app, lightning;print('import cli', round(time.time()-t,2), 's')"; done
GRPO_LIGHTNING_CACHE=/tmp/probe taskset -c 0-11 python3 -X importtime -c "import grpo_lightning.cli.app" 2> $OUT/importtime_warm.txt; sort -t'|' -k2 -n -r $OUT/importtime_warm.txt | head -12
s=$(date +%s); taskset -c 0-11 timeout 300 python3 benchmarks/run.py --workload W1 --steps 4 --first-step both --compare trl > $OUT/w1_defaults.log 2>&1
echo "w1 defaults rc $? $(( $(date +%s)-s )) s"; grep -E "first step from|^ours:|median|auto" $OUT/w1_defaults.log | cut -c1-300 | tail -8
s=$(date +%s); taskset -c 0-11 timeout 200 python3 benchmarks/run.py --workload W1 --steps 6 --first-step both --compile on --logprob-compile on --model-compile on > $OUT/w1_all.log 2>&1
echo "w1 all rc $? $(( $(date +%s)-s )) s"; grep -E "first step from|^ours:" $OUT/w1_all.log | cut -c1-300
wait; tail -1 $OUT/warmstart.log
export GRPO_LIGHTNING_CACHE=/tmp/smoke_cache
for n in 1 2; do s=$(date +%s.%N)
taskset -c 0-11 timeout 100 python3 -m grpo_lightning.ablation.run --config-name smoke 'base_configs=[configs/trainer/gpu.yaml,configs/data/arithmetic.yaml,configs/model/tiny.yaml]' output_dir=/tmp/smoke$n > $OUT/smoke$n.log 2>&1
echo "smoke$n rc $? wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
python3 -c "import json,glob;m=[json.load(open(f)) for f in sorted(glob.glob('/tmp/smoke$n/*/metrics.json'))];print('cells',len(m),'train_s',round(sum(x.get('train_time_s') or 0 for x in m),1),'cell_wall_s',round(sum(x.get('wall_time_s') or 0 for x in m),1), [(round(x.get('wall_time_s') or 0,1), round(x.get('train_time_s') or 0,1)) for x in m])"
done
grep -h "time:" /tmp/smoke2/*/train.log | cut -c1-250
