# One H200, 2026-12-03, the tree of c6d3c6a (GRPO_BENCH_COMMIT), torch 2.11, transformers 5.17, three calls on one held machine.
# speed: arms k1_stale, k1_overlap, k2, k2_partial from the first call (the rest of its arms past the call's limit);
# sync, k4, k8, k4_partial, k8_partial from the third, each run alone on the card (the same loop, by hand):
OUT=$OUT/stale PYTHON=python3 bash benchmarks/staleness_gpu.sh speed
# learn: 21 runs at once beside the CUDA tests and three W1 fits (benchmarks/results/gpu_checks_h200/staleness_c6d3c6a/).
# The card ran out of memory: k4-icepop, k4-m2po, k4-geo_rs (step 1) and k8-none (step 0) died; k4-partial-m2po
# and k8-partial-m2po were cut at the deadline (steps 14 and 5), k8-m2po at 59 of 60.
OUT=/tmp/keep/learn PYTHON=python3 LEARN_DEADLINE_MIN=8.7 bash benchmarks/staleness_gpu.sh learn
