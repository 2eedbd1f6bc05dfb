# L: W1's first step with its phases; CLI fits on the GPU in each user setup (the teardown skip, last.ckpt); CUDA tests.
. .scratch/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
( GRPO_LIGHTNING_CACHE=/tmp/ws_cache taskset -c 12-15 python3 -c "from grpo_lightning.quickstart.warmstart import warm_start; print(warm_start())" > $OUT/warmstart.log 2>&1 ) &
A="--workload W1 --steps 2 --workdir /tmp/w1"
s=$(date +%s); taskset -c 0-11 timeout 150 python3 benchmarks/run.py $A --first-step both > $OUT/w1.log 2>&1; echo "w1 rc $? $(( $(date +%s)-s )) s"; grep -E "first step from|^ours:" $OUT/w1.log
for i in 1 2 3; do s=$(date +%s.%N); taskset -c 0-11 timeout 60 python3 benchmarks/run.py $A --first-step none --first-step-child > $OUT/child$i.log 2>&1
python3 -c "
import json, sys; sys.path.insert(0, 'benchmarks'); from first_step import first_step_phases
d=json.loads(open('$OUT/child$i.log').read().strip().splitlines()[-1]); print('warm child $i:', round(d['first_step_end_time']-$s,2), 's', first_step_phases(d, $s))"; done
wait; WS=$(tail -1 $OUT/warmstart.log); echo "warm start: $WS"
export GRPO_LIGHTNING_CACHE=/tmp/ws_cache
B="--config configs/variant/grpo.yaml --config configs/trainer/gpu.yaml --config configs/data/arithmetic.yaml --config configs/model/tiny.yaml --model.model $WS --trainer.max_steps 5"
for setup in "bf16|--model.policy.dtype bfloat16" "fp32_bf16rollout|--model.policy.dtype float32 --model.sampling.dtype bfloat16" "lora|--config configs/lora/lora.yaml --model.policy.dtype bfloat16"; do
  name=${setup%%|*}; d=/tmp/fit_$name; s=$(date +%s.%N)
  taskset -c 0-11 timeout 120 grpo-lightning fit $B ${setup#*|} --trainer.default_root_dir $d --trainer.logger.init_args.save_dir $d > $OUT/fit_$name.log 2>&1; rc=$?
  echo "fit $name rc $rc wall $(python3 -c "import time;print(round(time.time()-$s,1))") s; leaked: $(grep -c -i leaked $OUT/fit_$name.log)"
  python3 -c "
import glob, torch; c=sorted(glob.glob('$d/**/last.ckpt', recursive=True)); print('  last.ckpt:', c)
ck=torch.load(c[-1], map_location='cpu', weights_only=False); st=ck['optimizer_states'][0]['state']
print('  global_step', ck['global_step'], 'optimizer tensors', len(st), 'finite', all(torch.isfinite(t).all().item() for s in st.values() for t in s.values() if torch.is_tensor(t) and t.is_floating_point()))"
  grep -E "engine|compile|val/" $OUT/fit_$name.log | head -3 | cut -c1-250
done
s=$(date +%s); taskset -c 0-13 timeout 260 python3 -m pytest -n 12 -q -p no:cacheprovider -p no:randomly tests/training/optimization tests/rollout/engine tests/models/test_logprobs.py tests/rollout/test_stale_rollouts.py tests/training/test_metrics.py tests/checkpoints/test_final_checkpoint.py > $OUT/cuda_tests.log 2>&1
echo "cuda tests rc $? in $(( $(date +%s)-s )) s"; tail -3 $OUT/cuda_tests.log; grep -E "FAILED|ERROR" $OUT/cuda_tests.log | head -20
