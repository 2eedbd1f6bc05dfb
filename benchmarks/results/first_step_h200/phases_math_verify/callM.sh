# M: where a tiny model's CLI fit on the GPU stalls: per-step phases (perf/*) of a bf16 fit, twice, and of an fp32 one.
. .scratch/common.sh
export GRPO_LIGHTNING_CACHE=/tmp/ws_cache
WS=$(taskset -c 0-11 python3 -c "from grpo_lightning.quickstart.warmstart import warm_start; print(warm_start())" 2>$OUT/warmstart.err | tail -1); echo "warm start: $WS"
B="--config configs/variant/grpo.yaml --config configs/trainer/gpu.yaml --config configs/data/arithmetic.yaml --config configs/model/tiny.yaml --model.model $WS --trainer.max_steps 12 --trainer.val_check_interval 1000"
for run in "bf16a|--model.policy.dtype bfloat16" "bf16b|--model.policy.dtype bfloat16" "fp32|--model.policy.dtype float32"; do
  name=${run%%|*}; d=/tmp/fit_$name; s=$(date +%s.%N)
  taskset -c 0-11 timeout 150 grpo-lightning fit $B ${run#*|} --trainer.default_root_dir $d --trainer.logger.init_args.save_dir $d > $OUT/fit_$name.log 2>&1; rc=$?
  echo "fit $name rc $rc wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"; grep -E "^  time:" $OUT/fit_$name.log
  mkdir -p $OUT/tb_$name; cp $d/grpo/version_0/events.* $OUT/tb_$name/ 2>/dev/null
  python3 - <<PY
import glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(glob.glob("$d/grpo/version_0/events.*")[0], size_guidance={"scalars": 0}); ea.Reload()
tags = [t for t in ea.Tags()["scalars"] if t.startswith("perf/") or t in ("train/completions/mean_length", "completions/mean_length")]
for t in sorted(tags):
    print("  ", t, [round(e.value, 3) for e in ea.Scalars(t)])
PY
done
