"""``grpo-lightning-report SWEEP_DIR [--output DIR] [--name NAME]``: the command line of the report."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning import bytecode
from grpo_lightning.errors import ConfigError
from grpo_lightning.report.build import DEFAULT_FOLDER, build_report
from grpo_lightning.report.labels import MislabelledArmError
from grpo_lightning.report.sections.comparisons import EQUIVALENCE_MARGIN, TARGET_MDE


def main(argv: Sequence[str] | None = None) -> None:
    """``grpo-lightning-report``; Python's bytecode goes to the package's cache where it may not write its own
    (:mod:`grpo_lightning.bytecode`)."""
    bytecode.use_own_bytecode_cache()
    parser = argparse.ArgumentParser(
        prog="grpo-lightning-report",
        description="Markdown/HTML report with statistics and learning curves of a grpo-lightning-ablate sweep.",
        allow_abbrev=False,  # options in full: a prefix such as --out is refused, not read as --output
    )
    parser.add_argument("sweep_dir", type=Path,
                        help="the sweep's output_dir (one folder per cell), or the data/ folder beside a report")  # fmt: skip
    parser.add_argument(
        "--output", type=Path, default=None,
        help=f"the folder the report is written to (default: SWEEP_DIR/{DEFAULT_FOLDER}, or the folder holding a "
        "data/ folder); e.g. reports/default to replace a committed report",
    )  # fmt: skip
    parser.add_argument("--name", default=None, help="the report's title (default: the sweep folder's name)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals")
    parser.add_argument(
        "--provenance", action="append", default=[], metavar="LINE",
        help="a line added to the Provenance section (which comes from the sweep's provenance.json); repeatable",
    )  # fmt: skip
    parser.add_argument("--baseline", default=None, metavar="ARM",
                        help="the arm every other is compared with (default: the sweep's baseline, else its first arm)")  # fmt: skip
    parser.add_argument(
        "--equivalence-margin", type=float, default=None, metavar="MARGIN",
        help=f"differences shown within +-MARGIN are called equivalent (default {EQUIVALENCE_MARGIN:g}): in the metric's "
        "units on accuracies and shares, a share of the baseline's mean elsewhere; kept in data/sweep.json",
    )  # fmt: skip
    parser.add_argument(
        "--target-mde", type=float, default=None, metavar="MDE",
        help=f"the MDE the Effects section gives the seeds for (default {TARGET_MDE:g}), in the units of "
        "--equivalence-margin; kept in data/sweep.json",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not 0 < args.confidence < 1:
        parser.error("--confidence must be between 0 and 1")
    if args.equivalence_margin is not None and not 0 < args.equivalence_margin < math.inf:
        parser.error("--equivalence-margin must be a positive number, e.g. 0.02")
    if args.target_mde is not None and not 0 < args.target_mde < math.inf:
        parser.error(f"--target-mde must be a positive number, e.g. {TARGET_MDE:g}")
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir} is not a directory")
    try:
        target = build_report(args.sweep_dir, args.output, args.name, args.confidence, args.provenance, args.baseline,
                              args.equivalence_margin, args.target_mde)  # fmt: skip
    except (MislabelledArmError, ConfigError) as error:
        parser.exit(2, f"error: {error}\n")
    print(f"report: {target / 'report.md'}")
    print(f"html:   {target / 'report.html'}")


if __name__ == "__main__":
    main()
