"""Sampling groups of completions: the rollout type, the static-cache engine, the HF path, stale rollouts."""
