#!/usr/bin/env bash
# The field, dapo_parts and stale_rollouts sweeps side by side on one many-core CPU machine, in one
# time-limited call, each packed into "$OUT/<name>.tar.gz" (its report's data/ folder) with the
# warm start they share ("$OUT/warmstart.tar.gz") and a log ("$OUT/sweeps.log").
#
#   OUT=/some/folder bash benchmarks/many_core_sweeps.sh [FOLDER_OF_EARLIER_TARBALLS]
#
# Run from the repository root. The warm start is built once, before any cell starts; each sweep
# runs NAME:CELLS cells at once (hydra/launcher=joblib), each cell on one CPU thread. At DEADLINE_S
# seconds from the start the sweeps are interrupted (SIGINT: each records its provenance), and
# every sweep is packed: finished cells, and unfinished ones that the report leaves out. A signal
# to this script (a limit of the call) packs too. Given the tarballs of an earlier call, their
# finished cells and warm start are restored first: the sweeps skip those cells and run the rest.
# Settings (environment):
#   SWEEPS      "field:20 dapo_parts:6 stale_rollouts:4"  sweeps (shipped spec names) and cells at once
#   DEADLINE_S  460                                        seconds from the start until the sweeps stop
#   RUNS        runs/ablation                              where the sweep folders go
#   EXTRA       ""                                         more Hydra overrides of every sweep (a smoke run:
#               "seeds=[0] args.trainer.max_steps=2 args.trainer.val_check_interval=2")
set -uo pipefail
set -f  # EXTRA holds Hydra lists (seeds=[0]), not file patterns
: "${OUT:?set OUT to the folder the tarballs go to}"
EARLIER=${1:-}
SWEEPS=${SWEEPS:-"field:20 dapo_parts:6 stale_rollouts:4"}
DEADLINE_S=${DEADLINE_S:-460}
RUNS=${RUNS:-runs/ablation}
EXTRA=${EXTRA:-}
PYTHON=${PYTHON:-python}
# Nothing is downloaded and no GPU is used: the model is the local warm start, the task built in.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUDA_VISIBLE_DEVICES=
export GRPO_LIGHTNING_CACHE=${GRPO_LIGHTNING_CACHE:-$PWD/runs/cache}
mkdir -p "$OUT" "$RUNS" "$GRPO_LIGHTNING_CACHE"
NAMES=$(for s in $SWEEPS; do echo "${s%%:*}"; done)
log() { echo "[$(date -u +%H:%M:%S) +$SECONDS s] $*" | tee -a "$OUT/sweeps.log"; }
log "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); sweeps: $SWEEPS; deadline ${DEADLINE_S}s; commit $(git rev-parse --short HEAD 2>/dev/null)"

PIDS=()
STARTED=()
stop_sweeps() {
  for pid in "${PIDS[@]}"; do kill -INT "$pid" 2>/dev/null; done
  wait "${PIDS[@]}" 2>/dev/null
  PIDS=()
}
PACKED=
pack_all() {
  [ -n "$PACKED" ] && return
  PACKED=1
  for name in $NAMES; do  # side by side: reading the event files takes a while
    [ -d "$RUNS/$name" ] && "$PYTHON" benchmarks/sweep_bundle.py pack "$RUNS/$name" "$OUT/$name.tar.gz" >> "$OUT/sweeps.log" 2>&1 &
  done
  wait
  for name in $NAMES; do
    [ -f "$RUNS/$name.log" ] && grep -E "done in|failed|FAILED|error|sweep $name:" "$RUNS/$name.log" | tail -n 200 >> "$OUT/sweeps.log"
  done
  if [ -n "${WARM:-}" ] && [ -d "$WARM" ]; then
    tar -czf "$OUT/warmstart.tar.gz" -C "$(dirname "$WARM")" "$(basename "$WARM")"
  fi
  log "packed: $(cd "$OUT" && ls -l | tail -n +2 | awk '{print $9 " " $5}' | tr '\n' ' ')"
}
trap 'log "signal: stopping the sweeps and packing"; stop_sweeps; pack_all; exit 143' TERM INT HUP

if [ -n "$EARLIER" ]; then
  [ -f "$EARLIER/warmstart.tar.gz" ] && tar -xzf "$EARLIER/warmstart.tar.gz" -C "$GRPO_LIGHTNING_CACHE"
  for name in $NAMES; do
    [ -f "$EARLIER/$name.tar.gz" ] && "$PYTHON" benchmarks/sweep_bundle.py restore "$EARLIER/$name.tar.gz" "$RUNS/$name" | tee -a "$OUT/sweeps.log"
  done
fi

# One warm start for every cell (the sweeps' `model: warmstart`), built here before any cell starts.
WARM=$("$PYTHON" benchmarks/sweep_bundle.py warmstart $NAMES 2>>"$OUT/sweeps.log" | tail -n 1)
log "warm start: ${WARM:-none}"

for spec in $SWEEPS; do
  name=${spec%%:*}
  cells=${spec##*:}
  left=$((DEADLINE_S - SECONDS))
  [ "$left" -lt 10 ] && break
  # timeout's SIGINT reaches the sweep's whole process group (launcher workers, fits): the sweep
  # records its provenance and exits; -k kills what is left 30 s later.
  timeout -s INT -k 30 "$left" grpo-lightning-ablate --config-name "$name" hydra/launcher=joblib parallel="$cells" \
    threads=1 output_dir="$RUNS/$name" $EXTRA > "$RUNS/$name.log" 2>&1 &
  PIDS+=($!)
  STARTED+=("$name")
  log "started $name: $cells cells at once"
done
for i in "${!PIDS[@]}"; do
  wait "${PIDS[$i]}"
  log "sweep ${STARTED[$i]} ended with status $?"
done
PIDS=()
pack_all
