# One H200, 2026-12-03, the tree of c6d3c6a (torch 2.11, transformers 5.17), alone on the card; the call before
# ran out of its own time limit (its files did not come back), so this is the second run of the same command.
OUT=/tmp/k2/w5 DEADLINE_S=250 W5_STEPS=4 PYTHON=python3 bash benchmarks/ecosystem_gpu.sh w5
