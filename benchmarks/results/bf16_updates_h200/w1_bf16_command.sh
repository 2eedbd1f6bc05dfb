#!/bin/bash
# The W1 side by side of w1_bf16_b802451.txt, as run (from the project root, on a GPU machine with the package importable).
OUT=${OUT:-.}
for arm in plain compensated plain compensated; do
  n=$((n+1)); python3 - $arm <<'PY' > $OUT/w1_bf16_${n}_$arm.log 2>&1; grep -E "^med|^generated|^GPU memory" $OUT/w1_bf16_${n}_$arm.log | sed "s/^/$arm: /"
import runpy, sys, torch
arm = sys.argv[1]
from grpo_lightning.training import module
if arm == "plain":
    module.adamw = lambda p, lr, wd, trained=None: torch.optim.AdamW(p, lr=lr, weight_decay=wd, fused=True)
sys.argv = ["benchmarks/run.py", "--workload", "W1", "--steps", "6", "--first-step", "none", "--dtype", "bfloat16"]
sys.path.insert(0, "benchmarks")
runpy.run_path("benchmarks/run.py", run_name="__main__")
PY
done
