#!/usr/bin/env bash
# Bounded staleness on one GPU: W1's speed at k = 1, 2, 4, 8 with and without partial rollouts against
# synchronous training, and learning on SmolLM2 at k = 1, 4, 8 under each importance correction.
#   OUT=... bash benchmarks/staleness_gpu.sh speed   # W1, one run at a time alone on the card
#   OUT=... bash benchmarks/staleness_gpu.sh learn   # staleness_learning.py, LEARN_MAX_RUNS at once; again to continue
# speed: each run is `benchmarks/run.py --workload W1` with compilation off for all (the same engine for
# every arm: `auto` would choose by run length, which differs by k) and k + SPEED_STEPS steps: the first k
# batches only sample, and the medians are over the trained steps after the first. One-step staleness
# runs both ways: sampled in turn (stale) and beside the update (overlap). WORK/speed/ gets speed_<arm>.json
# and .log and speed.md (s/step, tokens/s and the ratio to synchronous). learn: WORK/learn/
# (staleness_learning.py's --out: results.json, summary.md, the runs' records and checkpoints, which the
# next call resumes from), LEARN_STEPS optimizer steps, LEARN_DEADLINE_MIN, LEARN_MAX_RUNS at once: the
# learn stage alone on the card (beside other fits it ran out of memory). OUT gets three files a stage:
# the table, the driver's log and STAGE.tar.xz (WORK/STAGE without checkpoints or weights).
set -uo pipefail
: "${OUT:?set OUT to the folder results go to}"
PYTHON=${PYTHON:-python}
SPEED_STEPS=${SPEED_STEPS:-5}
WORKLOAD=${WORKLOAD:-W1}  # W0: a tiny model, to try the stage on a CPU
LEARN_STEPS=${LEARN_STEPS:-60}
LEARN_DEADLINE_MIN=${LEARN_DEADLINE_MIN:-9}
LEARN_MAX_RUNS=${LEARN_MAX_RUNS:-16}  # 21 runs of ~7.5 GiB do not fit one H200 (2026-12-03: 4 died out of memory)
WORK=${WORK:-runs/staleness}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK/speed"

speed() {
  local arms=("sync|0|" "k1_stale|1|--stale-rollouts stale" "k1_overlap|1|--stale-rollouts overlap"
              "k2|2|--max-staleness 2" "k4|4|--max-staleness 4" "k8|8|--max-staleness 8"
              "k2_partial|2|--max-staleness 2 --partial-rollouts" "k4_partial|4|--max-staleness 4 --partial-rollouts"
              "k8_partial|8|--max-staleness 8 --partial-rollouts")
  for arm in "${arms[@]}"; do
    IFS='|' read -r name k flags <<< "$arm"
    local queued=$(( k > 1 ? k : 0 ))
    # shellcheck disable=SC2086
    "$PYTHON" benchmarks/run.py --workload "$WORKLOAD" --steps $(( SPEED_STEPS + queued )) --first-step none \
      --compile off --logprob-compile off --model-compile off $flags --out "$WORK/speed/speed_$name.json" \
      > "$WORK/speed/speed_$name.log" 2>&1
    echo "$name rc $?"
  done
  speed_table "$WORK/speed"
}

# speed.md from OUT/speed_<arm>.json, in the arms' order (the stage speed_table rebuilds it alone)
speed_table() {
  "$PYTHON" - "$1" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
order = ["sync", "k1_stale", "k1_overlap", "k2", "k4", "k8", "k2_partial", "k4_partial", "k8_partial"]
results = {name: json.loads(p.read_text()) if (p := out / f"speed_{name}.json").exists() else None for name in order}
sync = (results["sync"] or {}).get("median_step_s")
lines = ["| arm | s/step | tokens/s | / sync | rollout s | log-probs s | update s | commit |",
         "|:---|---:|---:|---:|---:|---:|---:|:---|"]
for name, result in results.items():
    if result is None:  # it failed or did not run: its log says which
        lines.append(f"| {name} | no result (speed_{name}.log) | — | — | — | — | — | — |")
        continue
    step, phases = result["median_step_s"], result["phases"]
    ratio = f"{step / sync:.3f}" if sync else "—"
    lines.append(f"| {name} | {step:.3f} | {result['tokens_per_s']:,.0f} | {ratio} | {phases.get('rollout_s', float('nan')):.3f} | "
                 f"{phases.get('logprob_s', float('nan')):.3f} | {phases.get('update_s', float('nan')):.3f} | {str(result['commit'])[:7]} |")
(out / "speed.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
}

learn() {
  "$PYTHON" benchmarks/staleness_learning.py --steps "$LEARN_STEPS" --deadline-min "$LEARN_DEADLINE_MIN" \
    --max-runs "$LEARN_MAX_RUNS" --out "$WORK/learn"
}

# OUT/STAGE.tar.xz: WORK/STAGE without the runs' checkpoints and weights (one file to copy back from a remote machine)
bundle() {
  tar cJf "$OUT/$1.tar.xz" --exclude=trainer --exclude="*.ckpt" --exclude="*.safetensors" --exclude=start -C "$WORK" "$1"
}

stage=${1:?speed or learn}
case "$stage" in
speed) speed 2>&1 | tee "$OUT/speed_driver.log"; cp "$WORK/speed/speed.md" "$OUT/"; bundle speed ;;
speed_table) speed_table "${2:?speed_table DIR: the folder of speed_<arm>.json}" ;;
learn) learn 2>&1 | tee -a "$OUT/learn_driver.log"; cp "$WORK/learn/summary.md" "$OUT/"; bundle learn ;;
*) echo "unknown stage $stage: speed, speed_table or learn" >&2; exit 2 ;;
esac
