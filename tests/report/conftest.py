"""A synthetic sweep for the report's tests: cell folders with TensorBoard events, as
grpo-lightning-ablate leaves them, written without running a fit."""

import json

import pytest
import yaml

INITIAL_ACCURACY = 0.1
STEPS = 6
T0 = 1_000_000.0  # wall time of the first event


def _reward(variant: str, seed: int, step: int) -> float:
    return (0.1 if variant == "grpo" else 0.05) * step + 0.01 * seed


def write_cell(root, variant: str, seed: int, final_accuracy: float, finished: bool = True, stem: str = "", stale=(),
               clip=(0.01, 0.02), final_val=None, config_changes=None, diverged_from=None, token_scale=1.0,
               flops_per_token=None):  # fmt: skip
    """A cell folder as grpo-lightning-ablate leaves it; ``stale``: TensorBoard steps without an
    update, where the previous training values are logged again (as Lightning does); ``clip``:
    clip_ratio/low and /high of every step (clip_ratio/region is their sum); ``final_val``: more
    val/* scalars of the last validation; ``config_changes``: model init_args of config.yaml;
    ``diverged_from``: the step from which the training scalars are NaN (a run that diverged);
    ``token_scale``: generated tokens per step, times the default (100, 110, 120, ...);
    ``flops_per_token``: logs perf/flops as this many per generated token (none: not logged)."""
    from torch.utils.tensorboard import SummaryWriter

    name = f"{variant}-seed{seed}{stem}"
    directory = root / name
    directory.mkdir(parents=True)
    record = {"name": name, "arm": variant + stem, "variant": variant, "seed": seed, "overrides": {}, "command": []}
    (directory / "cell.json").write_text(json.dumps(record))
    config = {
        "seed_everything": seed,
        "trainer": {"max_steps": STEPS, "logger": {"init_args": {"save_dir": str(directory)}}},
        "model": {
            "class_path": f"grpo_lightning.variants.{variant.upper()}",
            "init_args": {"sampling": {"group_size": 4}, "loss": {"clip_eps_high": 0.28 if variant == "dapo" else 0.2},
                          **(config_changes or {})},
        },
        "data": {"init_args": {"num_train": 32}},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    writer = SummaryWriter(log_dir=str(directory))
    wall = T0
    writer.add_scalar("val/accuracy", INITIAL_ACCURACY, 0, walltime=wall)
    tokens = 0
    previous = {}
    for step in range(STEPS + len(stale)):
        if step in stale:
            wall += 0.5
            for tag, value in previous.items():
                writer.add_scalar(tag, value, step, walltime=wall)
            continue
        wall += 2.0 if variant == "grpo" else 1.0
        tokens += (100 + 10 * step) * token_scale
        scalars = {
            "reward": _reward(variant, seed, step),
            "kl": 0.01 * step,
            "entropy": 1.0 - 0.05 * step,
            "completions/mean_length": 10.0 + step,
            "clip_ratio/low": clip[0],
            "clip_ratio/high": clip[1],
            "clip_ratio/region": clip[0] + clip[1],
            "frac_reward_zero_std": 0.5,
            "perf/step_s": 2.0 if variant == "grpo" else 1.0,
            "perf/generated_tokens": float(tokens),
        }
        if flops_per_token is not None:
            scalars["perf/flops"] = float(tokens * flops_per_token)
        if diverged_from is not None and step >= diverged_from:
            scalars = {tag: (value if tag.startswith("perf/") else float("nan")) for tag, value in scalars.items()}
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step, walltime=wall)
        previous = scalars
        if step in (2, STEPS + len(stale) - 1):
            accuracy = final_accuracy if step == STEPS + len(stale) - 1 else (INITIAL_ACCURACY + final_accuracy) / 2
            writer.add_scalar("val/accuracy", accuracy, step, walltime=wall + 0.5)
            for tag, value in (final_val or {}).items() if step == STEPS + len(stale) - 1 else ():
                writer.add_scalar(tag, value, step, walltime=wall + 0.5)
    writer.close()
    if finished:
        (directory / "DONE").write_text("")
    return directory


@pytest.fixture(scope="session")
def cell_writer():
    """``write_cell`` for the tests of this folder."""
    return write_cell
