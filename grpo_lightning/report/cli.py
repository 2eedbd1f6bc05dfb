"""``grpo-lightning-report SWEEP_DIR [--name NAME] [--out DIR]``: the command line of the report."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning.report.build import build_report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="grpo-lightning-report",
        description="Markdown/HTML report with statistics and learning curves of a grpo-lightning-ablate sweep.",
    )
    parser.add_argument("sweep_dir", type=Path, help="the sweep's output_dir (one folder per cell)")
    parser.add_argument("--name", default=None, help="report name (default: the sweep folder's name)")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="parent folder of the report (default: reports/)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals")
    parser.add_argument(
        "--provenance", action="append", default=[], metavar="LINE",
        help="a line for the Provenance section (command, commit, machine); repeatable",
    )
    args = parser.parse_args(argv)
    if not 0 < args.confidence < 1:
        parser.error("--confidence must be between 0 and 1")
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir} is not a directory")
    target = build_report(args.sweep_dir, args.out, args.name, args.confidence, args.provenance)
    print(f"report: {target / 'report.md'}")
    print(f"html:   {target / 'report.html'}")


if __name__ == "__main__":
    main()
