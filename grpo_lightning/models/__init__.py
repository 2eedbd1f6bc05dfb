"""The models of a run: loading them, the policy and reference, LoRA adapters, the critic, log-probabilities."""
