# N: math-verify's child on the package's bytecode cache (b8730dc): a tiny bf16 CLI fit's per-step phases, twice; the child's start; the smoke sweep.
. .scratch/common.sh
export GRPO_LIGHTNING_CACHE=/tmp/ws_cache
( taskset -c 12-15 python3 -c "from grpo_lightning.quickstart.warmstart import warm_start; print(warm_start())" > $OUT/warmstart.log 2>&1 ) &
for i in 1 2 3; do taskset -c 0-11 python3 -c "
import time, grpo_lightning; from grpo_lightning.rewards import math_verifier
t = time.time(); math_verifier.start_in_background(); math_verifier.equivalent('\\\\sqrt{4}', '2'); print('math-verify child ready and answering: $i', round(time.time() - t, 2), 's')"; done
wait; WS=$(tail -1 $OUT/warmstart.log); echo "warm start: $WS"
B="--config configs/variant/grpo.yaml --config configs/trainer/gpu.yaml --config configs/data/arithmetic.yaml --config configs/model/tiny.yaml --model.model $WS --trainer.max_steps 12 --trainer.val_check_interval 1000 --model.policy.dtype bfloat16"
for name in a b; do d=/tmp/fit_$name; s=$(date +%s.%N)
  taskset -c 0-11 timeout 150 grpo-lightning fit $B --trainer.default_root_dir $d --trainer.logger.init_args.save_dir $d > $OUT/fit_$name.log 2>&1; rc=$?
  echo "fit $name rc $rc wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"; grep -E "^  time:" $OUT/fit_$name.log
  python3 - <<PY
import glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(glob.glob("$d/grpo/version_0/events.*")[0], size_guidance={"scalars": 0}); ea.Reload()
for t in ("perf/score_s", "perf/step_s", "perf/update_s", "perf/logprob_s"):
    print("  ", t, [round(e.value, 3) for e in ea.Scalars(t)])
PY
done
for n in 1 2; do s=$(date +%s.%N)
taskset -c 0-11 timeout 100 python3 -m grpo_lightning.ablation.run --config-name smoke 'base_configs=[configs/trainer/gpu.yaml,configs/data/arithmetic.yaml,configs/model/tiny.yaml]' output_dir=/tmp/smoke$n > $OUT/smoke$n.log 2>&1
echo "smoke$n rc $? wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
python3 -c "import json,glob;m=[json.load(open(f)) for f in sorted(glob.glob('/tmp/smoke$n/*/metrics.json'))];print('cells',len(m),'train_s',round(sum(x.get('train_time_s') or 0 for x in m),1),'cell_wall_s',round(sum(x.get('wall_time_s') or 0 for x in m),1), [(round(x.get('wall_time_s') or 0,1), round(x.get('train_time_s') or 0,1)) for x in m])"
done
grep -h "time:" /tmp/smoke2/*/train.log | cut -c1-250
