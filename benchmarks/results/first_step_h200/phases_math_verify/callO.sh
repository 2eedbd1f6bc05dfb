# O: the early end (4780a3d) on the GPU image: a tiny CLI fit's exit after its last line, and the smoke sweep's cells.
. .scratch/common.sh
export GRPO_LIGHTNING_CACHE=/tmp/ws_cache
WS=$(taskset -c 0-11 python3 -c "from grpo_lightning.quickstart.warmstart import warm_start; print(warm_start())" 2>$OUT/warmstart.err | tail -1); echo "warm start: $WS"
cat > /tmp/exit_probe.py <<'PY'
import subprocess, sys, time
t0 = time.time()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
last = None
for line in p.stdout:
    last = (time.time() - t0, line.rstrip()[:80])
p.wait()
end = time.time() - t0
print(f"rc {p.returncode}; last line at {last[0]:.2f} s {last[1]!r}; exit at {end:.2f} s (+{end - last[0]:.2f} s)")
PY
B="fit --config configs/variant/grpo.yaml --config configs/trainer/gpu.yaml --config configs/data/arithmetic.yaml --config configs/model/tiny.yaml --model.model $WS --trainer.max_steps 4 --model.policy.dtype bfloat16 --trainer.default_root_dir /tmp/fx --trainer.logger.init_args.save_dir /tmp/fx"
for i in 1 2 3; do taskset -c 0-11 python3 /tmp/exit_probe.py python3 -m grpo_lightning.cli $B; done
for i in 1 2; do taskset -c 0-11 python3 /tmp/exit_probe.py python3 -c "import sys; sys.argv[0] = 'grpo-lightning'; from grpo_lightning.cli import main; main()" $B; done
for n in 1 2; do s=$(date +%s.%N)
taskset -c 0-11 timeout 100 python3 -m grpo_lightning.ablation.run --config-name smoke 'base_configs=[configs/trainer/gpu.yaml,configs/data/arithmetic.yaml,configs/model/tiny.yaml]' output_dir=/tmp/smoke$n > $OUT/smoke$n.log 2>&1
echo "smoke$n rc $? wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
python3 -c "import json,glob;m=[json.load(open(f)) for f in sorted(glob.glob('/tmp/smoke$n/*/metrics.json'))];print('cells',len(m),'train_s',round(sum(x.get('train_time_s') or 0 for x in m),1),'cell_wall_s',round(sum(x.get('wall_time_s') or 0 for x in m),1), [(round(x.get('wall_time_s') or 0,1), round(x.get('train_time_s') or 0,1)) for x in m])"
done
grep -h "done in" $OUT/smoke2.log | cut -c1-200
