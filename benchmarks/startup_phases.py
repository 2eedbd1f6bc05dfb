"""Where start-up goes: a real ``grpo-lightning`` command from the start of its process to the end of
"start-up and loading" (the first validation or training loop), phase by phase.

    python benchmarks/startup_phases.py fit --config trainer/gpu --config recipes/smollm2
    python benchmarks/startup_phases.py --profile startup.prof fit --config trainer/cpu --config recipes/calculator

Takes the CLI's arguments as they are. Prints one line per phase (seconds since the process started,
and the phase's own seconds), then a JSON line ``{"startup_s": ..., "phases": {...}}``, and ends the
process there, before any validation or training step. ``--profile FILE`` also writes a cProfile of
the whole span (read it with ``python -m pstats FILE``, ``sort cumulative``); the phases are then
slower than without it. The phases: the interpreter with torch and Lightning imported, the package's
CLI imported, the parser built, the arguments parsed, the Trainer, module and data instantiated,
``setup``, ``configure_model`` (tokenizer and model loaded), the strategy's setup (the model on its
device, the optimizers), and the module's ``on_fit_start`` (the engine plan and the data checks).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def phase_table(marks: Sequence[tuple[str, float]]) -> tuple[list[str], dict[str, float]]:
    """``(lines, phases)`` of ``marks``, ``(name, seconds since the process started)`` in time order:
    each line gives the mark's time and the seconds since the mark before it; ``phases`` maps each
    name to those seconds (a repeated name adds up)."""
    lines, phases, previous = [], {}, 0.0
    for name, at in marks:
        spent = at - previous
        lines.append(f"{at:7.2f} s  (+{spent:5.2f} s)  {name}")
        phases[name] = round(phases.get(name, 0.0) + spent, 3)
        previous = at
    return lines, phases


def _timed(owner: Any, attribute: str, name: str, mark: Callable[[str], None], depth: dict[str, int]) -> None:
    """Replace ``owner.attribute`` by a call that marks the end of what came before it when it is
    called and the end of ``name`` when it returns; a call inside another of the same ``name`` (a
    strategy's ``setup`` calling its parent's) is not marked again."""
    original = getattr(owner, attribute)

    def timed(*args: Any, **kwargs: Any) -> Any:
        depth[name] = depth.get(name, 0) + 1
        if depth[name] == 1:
            mark(f"before {name}")
        try:
            return original(*args, **kwargs)
        finally:
            depth[name] -= 1
            if depth[name] == 0:
                mark(name)

    setattr(owner, attribute, timed)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", help="write a cProfile of the span to this file")
    ours, cli_args = parser.parse_known_args(argv)
    profile = cProfile.Profile() if ours.profile else None
    if profile is not None:
        profile.enable()
    from grpo_lightning.runtime.time_budget import process_start_time  # imports Lightning: inside the profile

    start = process_start_time()
    marks: list[tuple[str, float]] = []

    def mark(name: str) -> None:
        marks.append((name, time.time() - start))

    import lightning.pytorch  # noqa: F401  (the interpreter, torch and Lightning: what every run imports first)

    mark("python, torch and lightning imported")
    from lightning.pytorch import cli as lightning_cli
    from lightning.pytorch.strategies import Strategy

    from grpo_lightning.cli import app as cli
    from grpo_lightning.runtime import time_budget
    from grpo_lightning.training import module

    mark("grpo_lightning.cli.app imported")
    depth: dict[str, int] = {}
    _timed(lightning_cli.LightningCLI, "setup_parser", "parser built", mark, depth)
    _timed(cli.GRPOLightningCLI, "parse_arguments", "arguments parsed", mark, depth)
    _timed(lightning_cli.LightningCLI, "instantiate_classes", "trainer, module and data instantiated", mark, depth)
    _timed(module.GroupPolicyOptimization, "setup", "setup", mark, depth)
    _timed(module.GroupPolicyOptimization, "configure_model", "configure_model", mark, depth)
    for strategy in {Strategy, *_subclasses(Strategy)}:
        if "setup" in vars(strategy):
            _timed(strategy, "setup", "strategy setup", mark, depth)
    _timed(module.GroupPolicyOptimization, "on_fit_start", "on_fit_start", mark, depth)

    def end(*_: Any, **__: Any) -> None:
        mark("before the first loop")
        if profile is not None:
            profile.disable()
            profile.dump_stats(ours.profile)
        lines, phases = phase_table(marks)
        print("\n".join(lines))
        print(json.dumps({"startup_s": round(marks[-1][1], 3), "phases": phases}), flush=True)
        os._exit(0)  # nothing of the run after start-up: no validation, no step, no checkpoint

    time_budget.TimeBudget.on_validation_start = end
    time_budget.TimeBudget.on_train_start = end
    sys.argv = ["grpo-lightning", *cli_args]
    cli.main()


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


if __name__ == "__main__":
    main()
