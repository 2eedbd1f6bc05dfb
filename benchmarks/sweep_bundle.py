"""A sweep's report data as one tarball, to carry it off a machine that ran it and back again.

    python benchmarks/sweep_bundle.py warmstart NAME...           # build each sweep's warm start once; print its folder
    python benchmarks/sweep_bundle.py pack SWEEP_DIR TARBALL      # the sweep's data/ folder, as the report writes it
    python benchmarks/sweep_bundle.py restore TARBALL SWEEP_DIR   # its finished cells back, so the sweep skips them
    python benchmarks/sweep_bundle.py report TARBALL REPORT_DIR   # REPORT_DIR/data, REGENERATE and the report

``pack`` writes the ``data/`` folder of ``grpo_lightning.report.data`` (the one committed beside a
report: cell.json, config.yaml, metrics.json, health.json, DONE, the scalars as gzipped CSV, the
first and last step's completions, provenance.json), unfinished cells included, and refuses a
tarball over ``MAX_BYTES``. ``restore`` copies its finished cells and provenance into a sweep
folder: a second run of the sweep skips them and adds its own provenance record, and its ``pack``
holds both runs' cells. ``report`` unpacks a tarball into ``REPORT_DIR/data`` and builds the
report there with ``grpo-lightning-report`` (the line it writes to ``REGENERATE``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

#: The most a tarball may hold (what one file may carry off the machine).
MAX_BYTES = 16 * 1024 * 1024
DATA = "data"


def warm_starts(names: list[str]) -> list[str]:
    """Build (or reuse) the model of each shipped sweep spec ``names``, as its cells will resolve it."""
    from hydra import compose, initialize_config_dir

    from grpo_lightning.ablation.run import SPEC_DIR
    from grpo_lightning.ablation.spec import SweepSpec
    from grpo_lightning.ablation.sweep import resolve_model

    folders = []
    with initialize_config_dir(config_dir=str(SPEC_DIR), version_base="1.3"):
        for name in names:
            model = resolve_model(SweepSpec.from_dict(compose(name)))
            if model is not None and model not in folders:
                folders.append(model)
    return folders


def pack(sweep_dir: Path, tarball: Path) -> None:
    from grpo_lightning.report.cells import discover_cells
    from grpo_lightning.report.data import export_data

    cells = discover_cells(sweep_dir)
    if not cells:
        raise SystemExit(f"pack: no cells under {sweep_dir}")
    with tempfile.TemporaryDirectory() as staging:
        export_data(sweep_dir, cells, Path(staging) / DATA, sweep_dir.resolve().name, [])
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(Path(staging) / DATA, arcname=DATA)
    size = tarball.stat().st_size
    finished = sum(cell.finished for cell in cells)
    print(f"pack: {tarball} {size / 2**20:.2f} MiB, {finished} of {len(cells)} cells finished")
    if size > MAX_BYTES:
        raise SystemExit(f"pack: {tarball} is {size} bytes, over the {MAX_BYTES} a file may carry")


def _unpack(tarball: Path, target: Path) -> Path:
    with tarfile.open(tarball, "r:gz") as tar:
        tar.extractall(target, filter="data")
    data = target / DATA
    if not (data / "sweep.json").is_file():
        raise SystemExit(f"{tarball}: no {DATA}/sweep.json inside; not a tarball of `pack`")
    return data


def restore(tarball: Path, sweep_dir: Path) -> None:
    from grpo_lightning.ablation.sweep import is_done
    from grpo_lightning.report.sections.provenance import PROVENANCE_FILE

    with tempfile.TemporaryDirectory() as staging:
        data = _unpack(tarball, Path(staging))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        restored = 0
        for cell in sorted(p for p in data.iterdir() if p.is_dir() and is_done(p)):
            if is_done(sweep_dir / cell.name):
                continue
            shutil.rmtree(sweep_dir / cell.name, ignore_errors=True)
            shutil.copytree(cell, sweep_dir / cell.name)
            restored += 1
        if (data / PROVENANCE_FILE).is_file() and not (sweep_dir / PROVENANCE_FILE).is_file():
            shutil.copyfile(data / PROVENANCE_FILE, sweep_dir / PROVENANCE_FILE)
    print(f"restore: {restored} finished cells from {tarball} into {sweep_dir}")


def report(tarball: Path, report_dir: Path) -> None:
    from grpo_lightning.report.cells import discover_cells
    from grpo_lightning.report.data import REGENERATE_FILE, regenerate_line
    from grpo_lightning.report.labels import check_arm_classes

    if report_dir.exists() and any(report_dir.iterdir()):  # an earlier report's files would stay beside the new ones
        raise SystemExit(f"report: {report_dir} is not empty; remove it (git rm -r -q {report_dir}) to build the report from {tarball}")
    report_dir.mkdir(parents=True, exist_ok=True)
    data = _unpack(tarball, report_dir)
    check_arm_classes(discover_cells(data))  # each arm's class from its resolved configs, as from a sweep folder
    (report_dir / REGENERATE_FILE).write_text(regenerate_line(data, 0.95))
    command = [str(Path(sys.executable).parent / "grpo-lightning-report"), str(data), "--output", str(report_dir)]
    subprocess.run(command, check=True)
    print(f"report: {report_dir}; rebuild it with: OUT=DIR sh -c \"$(cat {report_dir / REGENERATE_FILE})\"")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("warmstart").add_argument("names", nargs="+")
    for name, first, second in (("pack", "sweep_dir", "tarball"), ("restore", "tarball", "sweep_dir"),
                                ("report", "tarball", "report_dir")):  # fmt: skip
        sub = commands.add_parser(name)
        sub.add_argument(first, type=Path)
        sub.add_argument(second, type=Path)
    args = parser.parse_args(argv)
    if args.command == "warmstart":
        print("\n".join(warm_starts(args.names)))
    elif args.command == "pack":
        pack(args.sweep_dir, args.tarball)
    elif args.command == "restore":
        restore(args.tarball, args.sweep_dir)
    else:
        report(args.tarball, args.report_dir)


if __name__ == "__main__":
    main()
