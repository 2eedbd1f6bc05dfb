"""TRL's ``GRPOConfig`` names and what sets the same thing here: an unknown option named as TRL names
it is answered with ours, and ``docs/configuration.md`` prints this table (:func:`markdown_table`)."""

from __future__ import annotations

#: TRL's name -> (the option here, what to know when moving a setting across). Where TRL picks an
#: algorithm by a value (``loss_type``, ``importance_sampling_level``) the variant says it.
TRL_NAMES: dict[str, tuple[str, str]] = {
    "num_generations": ("--model.sampling.group_size", ""),
    "max_completion_length": ("--model.sampling.max_new_tokens", ""),
    "max_prompt_length": ("--data.long_prompts", "no length of its own: a prompt longer than the context leaves "
                          "room for is an error, or with truncate or skip cut or dropped"),
    "temperature": ("--model.sampling.temperature", ""),
    "top_p": ("--model.sampling.top_p", ""),
    "top_k": ("--model.sampling.top_k", ""),
    "beta": ("--model.kl.beta", "TRL's default is 0.0, ours 0.04 (DeepSeekMath)"),
    "epsilon": ("--model.loss.clip_eps_low", "and --model.loss.clip_eps_high, which TRL's epsilon also sets"),
    "epsilon_high": ("--model.loss.clip_eps_high", "DAPO's 0.28 is --model dapo"),
    "delta": ("--model.loss.delta", ""),
    "loss_type": ("--model", "grpo: --model grpo; dr_grpo: --model dr_grpo (its aggregation alone: --model.aggregation "
                  "seq_mean_token_sum_norm); dapo: --model dapo (--model.aggregation token_mean); cispo: --model "
                  "cispo; sapo: --model sapo; bnpo: --model.aggregation token_mean"),
    "importance_sampling_level": ("--model.loss.surrogate", "sequence: --model gspo (or --model.loss.surrogate "
                                  "gspo); token: the default ppo_clip"),
    "scale_rewards": ("--model.rewards.scale", "group, batch or none"),
    "multi_objective_aggregation": ("--model.rewards.aggregation", ""),
    "reward_weights": ("--model.rewards.weights", ""),
    "num_iterations": ("--model.optim.ppo_epochs", ""),
    "learning_rate": ("--model.optim.learning_rate", ""),
    "weight_decay": ("--model.optim.weight_decay", ""),
    "warmup_steps": ("--model.optim.warmup_steps", ""),
    "max_grad_norm": ("--model.optim.max_grad_norm", ""),
    "per_device_train_batch_size": ("--data.batch_size", "counts prompts here (TRL's counts completions); each "
                                    "step trains on batch_size x group_size completions"),
    "gradient_accumulation_steps": ("--model.optim.micro_batch_size", "one optimizer step per rollout, in "
                                    "micro-batches of this many completions (memory only); more steps per "
                                    "rollout: --model.optim.minibatch_size"),
    "steps_per_generation": ("--model.optim.minibatch_size", "completions per optimizer step"),
    "mask_truncated_completions": ("--model.loss.mask_truncated_completions", ""),
    "top_entropy_quantile": ("--model.loss.top_entropy_quantile", ""),
    "off_policy_mask_threshold": ("--model.loss.off_policy_mask_threshold", ""),
    "use_bias_correction_kl": ("--model.kl.unbiased", ""),
    "vllm_importance_sampling_correction": ("--model.sampling.correction", "a mode: token_truncate, ..."),
    "vllm_importance_sampling_cap": ("--model.sampling.correction_cap", ""),
    "disable_dropout": ("--model.policy.disable_dropout", ""),
    "gradient_checkpointing": ("--model.policy.gradient_checkpointing", ""),
    "model_init_kwargs": ("--model.policy.dtype", "and --model.policy.attn_implementation"),
    "max_steps": ("--trainer.max_steps", "counts optimizer steps, as TRL's does: a rollout makes `ppo_epochs` x minibatches of them"),
    "num_train_epochs": ("--trainer.max_epochs", ""),
    "seed": ("--seed_everything", ""),
    "bf16": ("--trainer.precision", "bf16-mixed or bf16-true"),
    "logging_steps": ("--trainer.log_every_n_steps", ""),
    "output_dir": ("--trainer.default_root_dir", ""),
    "log_completions": ("--completions.jsonl", "and --completions.every_n_steps"),
}


def trl_hint(name: str) -> str | None:
    """``"TRL's num_generations is --model.sampling.group_size here"`` for a TRL name, else ``None``."""
    if name not in TRL_NAMES:
        return None
    option, note = TRL_NAMES[name]
    return f"TRL's {name} is {option} here" + (f" ({note})" if note else "")


def markdown_table() -> str:
    """:data:`TRL_NAMES` as the Markdown table of ``docs/configuration.md``."""
    rows = [f"| `{name}` | `{option}` | {note} |" for name, (option, note) in TRL_NAMES.items()]
    return "\n".join(["| TRL `GRPOConfig` | here | note |", "|---|---|---|", *rows])
