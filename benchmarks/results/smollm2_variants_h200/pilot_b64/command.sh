# One H200 under MPS, 2026-12-04, commit 916608b (the GGUF brought over as in ../shared/gpu/README.md; bulky result
# folders left out of the copied tree, so the sweep's provenance calls the checkout dirty), one call, 8 cells at once:
SWEEP=runs/ablation/pilot_b64 DEADLINE_S=330 bash benchmarks/smollm2_variants.sh sweep 'variants=[grpo,cispo]' \
  'seeds=[0,1,2,3]' args.data.init_args.batch_size=64
# 64 prompts x 8 a rollout, minibatch 256 rows: two optimizer steps a rollout; 40 optimizer steps = 20 rollouts.
