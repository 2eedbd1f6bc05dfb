"""``python -m grpo_lightning.cli``: the same as ``grpo-lightning``."""

from grpo_lightning.cli import console_main

console_main()
