"""GRPO-family RL fine-tuning of language models on PyTorch Lightning."""

from grpo_lightning.bytecode import use_own_bytecode_cache

use_own_bytecode_cache()  # before torch is imported: see grpo_lightning.bytecode
