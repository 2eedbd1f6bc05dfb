"""``python -m grpo_lightning.cli``: the same as ``grpo-lightning``."""

from grpo_lightning.cli import main

main()
