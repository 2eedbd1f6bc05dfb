"""``grpo-lightning-ablate``: sweeps of Lightning fit runs over variants, seeds and settings.

    grpo-lightning-ablate --config-name default
    grpo-lightning-ablate --config-name smoke output_dir=runs/ablation/try parallel=2
    grpo-lightning-ablate -m variant=grpo,dapo seed=0,1,2
    grpo-lightning-ablate ++overrides.model.beta=[0.0,0.04] args.trainer.max_steps=50

A sweep spec (``configs/ablation/*.yaml``) names the shared YAML files and the axes::

    name: default
    output_dir: runs/ablation/${name}
    base_configs: [configs/trainer/cpu.yaml, configs/data/arithmetic.yaml, configs/model/tiny.yaml]
    model: warmstart                  # a path / hub id, "warmstart", or null (from base_configs)
    warmstart: {}                     # keyword arguments of grpo_lightning.quickstart.warmstart.warm_start
    variants: [grpo, dr_grpo, dapo, rloo, gspo]   # names of configs/variant/*.yaml (or YAML paths)
    seeds: [0, 1, 2, 3, 4]            # the default: five
    baseline: grpo                    # the arm the report compares the others with (default: the first)
    overrides:                        # extra axes: dotted CLI key -> list of values
      model.group_size: [4, 8]
    args:                             # fixed CLI overrides of every cell
      trainer.max_steps: 400
    parallel: 1                       # cells run at once
    gpus: auto                        # handed out round-robin (CUDA_VISIBLE_DEVICES); none on CPU
    timeout_s: null                   # stop a cell after this many seconds (then it counts as failed)
    threads: auto                     # torch CPU threads per cell (auto: cores / parallel for CPU cells)
    validate_before_training: true    # val/* of the start model, logged before the first step
    variant: null                     # a single variant / seed (Hydra multirun sets these)
    seed: null

Every cell (variant x seed x override values) is one ``python -m grpo_lightning.cli fit`` in a
subprocess, built from the same YAML files as a hand-run ``grpo-lightning fit``. Paths in
``base_configs`` and ``variants`` are relative to the working directory or name shipped configs
(``configs/trainer/cpu.yaml`` works from a clone and after ``pip install`` alike)::

    python -m grpo_lightning.cli fit --config configs/variant/<v>.yaml --config <base_configs...> \\
        --seed_everything <s> --trainer.logger.init_args.save_dir <cell dir> --model.model <path> \\
        --completions.jsonl true --<args...> --<override key> <value>

A cell directory (e.g. ``grpo-seed0-group_size4``) holds ``cell.json`` (its identity and
command), ``train.log``, the TensorBoard events, the resolved ``config.yaml`` saved by
LightningCLI, ``completions.jsonl`` (every trained completion: ``--completions.jsonl true``),
``metrics.json`` once the fit succeeded, and last a ``DONE`` marker. Running the sweep again
skips cells that have the marker and starts unfinished ones afresh; a finished cell whose
recorded settings (configs, args, overrides, model) differ from the spec's stops the sweep
before anything runs. Each run that starts cells adds a record to ``<output_dir>/provenance.json``
(commit, package versions, machine, load average, cells at once; ``provenance``).
``grpo-lightning-report <output_dir>`` then compares the variants in ``<output_dir>/report``.

This module is the Hydra entry point; ``spec`` validates the spec and lists its cells, ``sweep``
runs them, ``provenance`` records what ran them, ``metrics`` summarises a finished cell and
``callbacks`` holds the callback the cells add.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from grpo_lightning.ablation.spec import SweepSpec
from grpo_lightning.ablation.sweep import CellResult, run_sweep
from grpo_lightning.resources import config_dir

#: The folder of the shipped sweep specs, the ``--config-name`` choices.
SPEC_DIR = config_dir() / "ablation"


def sweep_from_config(cfg: Any) -> list[CellResult]:
    """Run the sweep described by a Hydra/OmegaConf config (or a plain mapping)."""
    results = run_sweep(SweepSpec.from_dict(cfg))
    failed = [r for r in results if r.status == "failed"]
    for result in failed:
        print(f"FAILED {result.cell.name}: {result.message}", file=sys.stderr)
    if failed:
        raise SystemExit(1)
    return results


def main() -> None:
    """Hydra entry point: ``grpo-lightning-ablate [--config-name NAME] [-m] [key=value ...]``.

    ``--config-name`` picks a shipped spec (``configs/ablation/<NAME>.yaml``); ``--config-dir DIR``
    adds a folder of your own specs.
    """
    import hydra

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    app = hydra.main(version_base="1.3", config_path=str(SPEC_DIR), config_name="default")(sweep_from_config)
    app()


if __name__ == "__main__":
    main()
