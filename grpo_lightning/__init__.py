"""GRPO-family RL fine-tuning of language models on PyTorch Lightning."""
