# One H200 under MPS, 2026-12-04, commit e403d12 (the tree clean), one call, 14 cells, 8 at once, 471 s:
# the spec as it stood at e403d12: 32 prompts x 8 a rollout, minibatch 256 rows, one optimizer step a rollout.
SWEEP=runs/ablation/sv_s01 MPS=1 bash benchmarks/smollm2_variants.sh sweep 'seeds=[0,1]'
# Final greedy accuracy on the 500 held-out problems, seeds 0 and 1 (from each cell's outcomes/val-step000040.csv.gz),
# beside the same seeds at 64 prompts a rollout (reports/smollm2_variants):
#   arm      32 prompts, 1 step a rollout   64 prompts, 2 steps a rollout
#   grpo     0.686 0.602                    0.686 0.694
#   dr_grpo  0.572 0.636                    0.620 0.634
#   dapo     0.688 0.704                    0.640 0.702
#   rloo     0.472 0.586                    0.590 0.626
#   gspo     0.682 0.260                    0.660 0.684
#   cispo    0.574 0.680                    0.556 0.646
#   dppo     0.574 0.680                    0.658 0.634
# At one step a rollout CISPO and DPPO trained identically again (every logged value equal); at two they differ.
