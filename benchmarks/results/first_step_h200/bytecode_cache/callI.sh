# I: CUDA tests of this change; W1's first step beside TRL; the three user setups; Lightning's teardown copy and the optimizer step timed.
. .scratch/common.sh
git log --oneline -1
s=$(date +%s); timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/training/optimization tests/rollout/engine/test_attention.py tests/cli/test_cli.py > $OUT/cuda_tests.log 2>&1; echo "cuda tests rc $? $(( $(date +%s)-s )) s"; tail -3 $OUT/cuda_tests.log; grep -E "FAILED|ERROR" $OUT/cuda_tests.log | head
s=$(date +%s); taskset -c 0-11 timeout 260 python3 benchmarks/run.py --workload W1 --steps 4 --first-step both --compare trl > $OUT/w1_first_step.log 2>&1
echo "w1 rc $? $(( $(date +%s)-s )) s"; grep -E "first step from|^ours:|^med|^TRL" $OUT/w1_first_step.log | cut -c1-250
for setup in "--dtype bfloat16" "--dtype float32 --rollout-dtype bfloat16" "--lora-rank 16"; do
  taskset -c 0-11 timeout 100 python3 benchmarks/run.py --workload W1 --steps 4 --first-step none --workdir /tmp/w1 $setup > $OUT/setup.log 2>&1; echo "setup [$setup] rc $?"
  grep -E "^ours:|^med|optimizer:" $OUT/setup.log | cut -c1-200; cat $OUT/setup.log >> $OUT/setups.log; done
timeout 100 python3 - <<'PY'
import statistics, time, torch, grpo_lightning
from transformers import AutoModelForCausalLM
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from grpo_lightning.training.optimization.compensated import adamw
m = AutoModelForCausalLM.from_pretrained("/tmp/w1/model", dtype=torch.bfloat16).cuda()
ref = AutoModelForCausalLM.from_pretrained("/tmp/w1/model", dtype=torch.bfloat16).cuda()
opt = adamw(list(m.parameters()), 1e-6, 0.0)
for p in m.parameters(): p.grad = torch.randn_like(p)
times = []
for _ in range(23):
    torch.cuda.synchronize(); t = time.perf_counter(); opt.step(); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
print(f"CompensatedAdamW step over {sum(p.numel() for p in m.parameters())/1e6:.0f}M bf16 weights in {len(list(m.parameters()))} tensors: median {1e3*statistics.median(times[3:]):.1f} ms")
torch.cuda.synchronize(); t = time.perf_counter(); _optimizers_to_device([opt], torch.device("cpu")); torch.cuda.synchronize(); a = time.perf_counter() - t
t = time.perf_counter(); m.cpu(); ref.cpu(); b = time.perf_counter() - t
print(f"Lightning's teardown copy: optimizer state {a:.2f} s, policy and reference {b:.2f} s")
PY
