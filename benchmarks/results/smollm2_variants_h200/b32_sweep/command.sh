# One H200, 2026-12-03, commit e06f531; two calls on two machines (SmolLM2's GGUF and reasoning-gym brought
# over as in ../shared/gpu/README.md), then the two sweep folders' report data joined into reports/smollm2_variants/data.
DEADLINE_S=540 SWEEP=runs/ablation/smollm2_variants bash benchmarks/smollm2_variants.sh sweep 'seeds=[0,1]' parallel=7
DEADLINE_S=548 SWEEP=runs/ablation/smollm2_variants bash benchmarks/smollm2_variants.sh sweep 'seeds=[2,3]' parallel=7
# The pilot (pilot_a08f10b_final_metrics.csv), the day before at a08f10b, one call:
# DEADLINE_S=430 SWEEP=runs/ablation/smollm2_b32 bash benchmarks/smollm2_variants.sh sweep 'variants=[grpo,dr_grpo]' \
#   'seeds=[0,1,2,3]' args.data.init_args.batch_size=32 args.model.init_args.optim.minibatch_size=256 \
#   args.model.init_args.optim.micro_batch_size=64
