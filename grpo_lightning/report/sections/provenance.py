"""The Provenance section, from the ``provenance.json`` that ``grpo-lightning-ablate`` writes
beside the cells (one record per run of the sweep that started cells), and whether the machine's
load makes wall-clock times meaningless."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.render.formatting import fmt, join_words

PROVENANCE_FILE = "provenance.json"


def read_provenance(sweep_dir: Path) -> list[dict[str, Any]]:
    """The records of ``<sweep_dir>/provenance.json`` (a list, or one record); none without it."""
    try:
        data = json.loads((Path(sweep_dir) / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return []
    records = [data] if isinstance(data, Mapping) else data if isinstance(data, list) else []
    return [r for r in records if isinstance(r, Mapping)]


def peak_load(record: Mapping[str, Any]) -> float | None:
    """The highest 1-minute load average recorded at the start, during or at the end of a run."""
    readings = [(record.get("load_start") or [None])[0], record.get("load_peak"), (record.get("load_end") or [None])[0]]
    numbers = [float(v) for v in readings if isinstance(v, (int, float))]
    return max(numbers) if numbers else None


def wall_clock_caveat(records: Sequence[Mapping[str, Any]]) -> str | None:
    """Why wall-clock times of this sweep cannot be compared, or None: the load average exceeded
    the core count, or several cells shared the CPU or a GPU (a cell's time then depends on which
    cells ran beside it, which the order of the cells decides, not the algorithm)."""
    reasons = []
    for record in records:
        cores = (record.get("machine") or {}).get("cores")
        load = peak_load(record)
        if cores and load is not None and load > cores:
            reasons.append(f"the 1-minute load average reached {fmt(load)} on {cores} cores")
        parallel, devices = int(record.get("parallel") or 1), len(record.get("devices") or [])
        if parallel > 1 and not devices:
            reasons.append(f"{parallel} cells ran at once on the CPU")
        elif parallel > devices > 0:
            reasons.append(f"{parallel} cells ran at once on {devices} GPU{'s' if devices > 1 else ''}")
    if not reasons:
        return None
    unique = list(dict.fromkeys(reasons))
    return "wall-clock times measure the machine's load as much as the algorithm (" + "; ".join(unique) + ")."


def provenance_warnings(records: Sequence[Mapping[str, Any]], cells: Sequence[Any] = ()) -> list[str]:
    """Banners for the top of a report whose code is not one clean commit: no record of it, cells
    run from a checkout with uncommitted changes (and whether the diff was kept), several commits;
    and cells run on several kinds of accelerator (``cells``: the finished cells, whose seeds say
    which pairs mix kinds)."""
    if not records:
        return [f"**Warning: no `{PROVENANCE_FILE}`: the code these runs used is unknown.**"]
    lines = []
    dirty = [r for r in records if r.get("dirty")]
    untracked = sorted({path for r in dirty for path in r.get("untracked") or ()})
    if dirty and not untracked:
        kept = all(r.get("diff") or r.get("deleted") for r in dirty)
        how = ("the uncommitted diff is recorded in `data/provenance.json`" if kept
               else "the uncommitted diff was not recorded, so these runs cannot be redone exactly")  # fmt: skip
        lines.append(f"**Warning: {len(dirty)} of {len(records)} runs of the sweep used a checkout with uncommitted "
                     f"changes to tracked files;** {how}.")  # fmt: skip
    elif dirty:  # files git does not track: their paths are recorded, never their contents
        diff = (" (the diff of tracked files is in `data/provenance.json`)"
                if any(r.get("diff") or r.get("deleted") for r in dirty) else "")  # fmt: skip
        lines.append(f"**Warning: {len(dirty)} of {len(records)} runs of the sweep used a checkout with uncommitted "
                     f"changes{diff} and untracked files, whose contents were not recorded, so these runs cannot be "
                     f"redone exactly:** {join_words([f'`{p}`' for p in untracked])}.")  # fmt: skip
    commits = list(dict.fromkeys(str(r.get("commit")) for r in records))
    if len(commits) > 1:
        shown = ", ".join(f"`{c[:10]}`" for c in commits)
        lines.append(f"**Warning: the cells of this sweep ran at {len(commits)} different commits** ({shown}; see "
                     "Provenance for which cells ran at which): arms may differ by code as well as by setting.")  # fmt: skip
    cards = list(dict.fromkeys(card_kind(r) for r in records if isinstance(r.get("machine"), Mapping)))
    if len(cards) > 1 and any(card != NO_GPU for card in cards):
        split = seeds_on_several_kinds(records, {c.directory.name: c.seed for c in cells})
        pairs = ("compare arms at seeds that ran on one kind" if split is None
                 else "every seed's arms ran on one kind, so each paired difference is of one kind" if not split
                 else f"the arms of seed{'s' * (len(split) > 1)} {join_words([str(s) for s in split])} ran on different "
                      "kinds, so their paired differences mix kinds")  # fmt: skip
        lines.append(f"**Warning: the cells of this sweep ran on {len(cards)} kinds of accelerator** ({'; '.join(cards)}; "
                     "see Provenance for which cells ran where): their kernels round differently, so a seed need not "
                     f"train the same on each; {pairs}.")  # fmt: skip
    return lines


def card_kind(record: Mapping[str, Any]) -> str:
    """The kinds of accelerator of a record's machine (``NVIDIA H200``; not their count), else ``NO_GPU``."""
    machine = record.get("machine") if isinstance(record.get("machine"), Mapping) else {}
    return ", ".join(dict.fromkeys(machine.get("gpus") or [])) or NO_GPU


def seeds_on_several_kinds(records: Sequence[Mapping[str, Any]], seeds: Mapping[str, Any]) -> list[Any] | None:
    """The seeds whose cells (``seeds``: each finished cell's seed by its folder's name) ran on more than one kind
    of accelerator, each cell on the machine of the last record that ran it; ``None`` where a record names no cells."""
    kind_of: dict[str, str] = {}
    for record in in_run_order(records):
        if not record.get("cells"):
            return None
        kind_of.update(dict.fromkeys(record["cells"], card_kind(record)))
    kinds: dict[Any, set[str]] = {}
    for name, seed in seeds.items():
        if name in kind_of:
            kinds.setdefault(seed, set()).add(kind_of[name])
    return sorted(seed for seed, found in kinds.items() if len(found) > 1)


def code_versions(cells: Sequence[Any]) -> dict[str, list[Any]]:
    """The finished cells by the source digest of the code they started with (``cell.code``, from
    their cell.json), the most common first; cells that recorded none are left out."""
    versions: dict[str, list[Any]] = {}
    for cell in cells:
        digest = (cell.code or {}).get("source_sha256") if cell.finished else None
        if digest:
            versions.setdefault(str(digest), []).append(cell)
    return dict(sorted(versions.items(), key=lambda item: -len(item[1])))


def _version_text(digest: str, cells: Sequence[Any], named: bool) -> str:
    code = cells[0].code
    commit = f" at commit `{str(code['commit'])[:10]}`" if code.get("commit") else ""
    dirty = " with uncommitted changes" if code.get("dirty") else ""
    names = [f"{c.arm} seed {c.seed}" for c in cells]
    shown = f": {join_words(names[:12])}" + (f" and {len(names) - 12} more" if len(names) > 12 else "") if named else ""
    return f"`{digest}`{commit}{dirty}, {len(cells)} run{'s' * (len(cells) > 1)}{shown}"


def code_warnings(cells: Sequence[Any]) -> list[str]:
    """A banner where the finished cells started from other versions of the library's code: an
    edit or a checkout while the sweep ran, or runs joined from other checkouts. A commit names
    none of these where the checkout was dirty, so the cells' source digests are compared."""
    versions = code_versions(cells)
    if len(versions) < 2:
        return []
    shown = "; ".join(_version_text(d, group, named=i > 0) for i, (d, group) in enumerate(versions.items()))
    return [f"**Warning: the runs started from {len(versions)} versions of the library's code** (source digests: "
            f"{shown}): arms may differ by code as well as by setting. Rerun the runs of the version you did not mean "
            "to run, or report them apart."]  # fmt: skip


#: Command-line settings of ``grpo-lightning-ablate`` that change how cells run, not what they
#: compute (wall-clock aside): not worth a note.
EXECUTION_SETTINGS = ("parallel", "gpus", "threads", "timeout_s", "hydra", "hydra/launcher")


def command_line_changes(command: str) -> list[str]:
    """The overrides of the sweep's config on a ``grpo-lightning-ablate`` command line (Hydra's
    ``key=value``), leaving out ``EXECUTION_SETTINGS``. The command is as ``provenance.json``
    recorded it (its arguments joined by spaces)."""
    words = command.split()
    changes = []
    for i, word in enumerate(words):
        if word.startswith("-") or "=" not in word or (i and words[i - 1] in ("--config-name", "-cn")):
            continue
        key = word.split("=", 1)[0].lstrip("+~")
        if key.split(".", 1)[0] not in EXECUTION_SETTINGS and key not in EXECUTION_SETTINGS:
            changes.append(word)
    return changes


def command_line_notes(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """A note for the top of a report whose sweep ran with settings its config file does not
    have (fewer steps, other seeds, ...): they are the report's conditions, so they are said first."""
    changes = list(dict.fromkeys(c for r in records for c in command_line_changes(str(r.get("command") or ""))))
    if not changes:
        return []
    return [f"**Note: the sweep's command line changed its config file:** {', '.join(f'`{c}`' for c in changes)} "
            "(the Configuration section shows the settings the cells ran with)."]  # fmt: skip


def provenance_section(doc: Doc, records: Sequence[Mapping[str, Any]], extra: Sequence[str] = (),
                       cells: Sequence[Any] = ()) -> None:  # fmt: skip
    doc.h(2, "Provenance")
    if not records:
        doc.p(f"No `{PROVENANCE_FILE}` in the sweep folder (`grpo-lightning-ablate` records one when it runs cells).")
    versions = code_versions(cells)
    if versions:
        unknown = sum(1 for c in cells if c.finished and not (c.code or {}).get("source_sha256"))
        doc.p("The library's code each run started with (SHA-256 of its Python source, first 16 digits): "
              + "; ".join(_version_text(d, group, named=len(versions) > 1) for d, group in versions.items())
              + (f"; {unknown} run{'s' * (unknown > 1)} recorded none" if unknown else "") + ".")  # fmt: skip
    finished = {c.directory.name for c in cells if c.finished}
    ordered = in_run_order(records)
    for number, record in enumerate(records, start=1):
        if len(records) > 1:
            doc.h(3, f"Run {number} of the sweep")
        later = ordered[next(i for i, r in enumerate(ordered) if r is record) + 1:]
        rerun = {name for run in later for name in run.get("cells") or {}}
        doc.items(record_lines(record, finished - rerun))
    if extra:
        doc.items(list(extra))


def in_run_order(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records by their runs' start times where every one has one (a join keeps its sources' order, which need
    not be the runs'; equal times keep it), else as listed."""
    if all(r.get("started") for r in records):
        return sorted(records, key=lambda r: str(r["started"]))
    return list(records)


#: A cell a record calls not finished that holds its DONE marker, and that no later run started: the run
#: finished it but was stopped before its launcher returned the results (older sweeps recorded such cells so).
DONE_UNCOLLECTED = "done, though recorded as not finished (the run was stopped before it collected them)"


def record_lines(record: Mapping[str, Any], finished: Set[str] = frozenset()) -> list[str]:
    """One record of ``provenance.json`` as list items; ``finished``: the cells done now that no later record
    names (those this record calls not finished are counted as :data:`DONE_UNCOLLECTED`)."""
    lines = [f"Command: `{user_text(record.get('command', '?'))}`",
             f"Date (UTC): {record.get('started', '?')} to {record.get('finished', '?')}"]  # fmt: skip
    commit = record.get("commit")
    dirty = " (with uncommitted changes to tracked files)" if record.get("dirty") else ""
    if record.get("untracked"):
        dirty = f" (with untracked files, contents not recorded: {join_words([f'`{p}`' for p in record['untracked']])})"
    lines.append(f"Commit: `{commit}`{dirty}" if commit else "Commit: unknown (not run from a git checkout)")
    packages = record.get("packages") or {}
    lines.append("Packages: " + ", ".join(f"{name} {version or 'not installed'}" for name, version in packages.items()))
    lines.append("Machine: " + machine_text(record.get("machine") or {}))
    lines.append(load_text(record))
    cells = {name: DONE_UNCOLLECTED if status == "not finished" and name in finished else status
             for name, status in (record.get("cells") or {}).items()}  # fmt: skip
    counts = {status: sum(1 for s in cells.values() if s == status) for status in dict.fromkeys(cells.values())}
    lines.append(f"Cells run: {len(cells)} (" + ", ".join(f"{n} {status}" for status, n in counts.items()) + ")")
    return lines


#: :func:`gpu_text` of a machine without a GPU.
NO_GPU = "no GPU"


def gpu_text(machine: Mapping[str, Any]) -> str:
    """``2 x NVIDIA H200``, or ``NO_GPU``: the accelerators of a provenance record's machine."""
    gpus = machine.get("gpus") or []
    return NO_GPU if not gpus else ", ".join(f"{gpus.count(name)} x {name}" for name in dict.fromkeys(gpus))


def machine_text(machine: Mapping[str, Any]) -> str:
    memory = f", {machine['memory_gib']} GiB" if machine.get("memory_gib") else ""
    return f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores{memory}, {gpu_text(machine)}; {machine.get('platform', '?')}, Python {machine.get('python', '?')}"


def load_text(record: Mapping[str, Any]) -> str:
    def first(key: str) -> str:
        values = record.get(key)
        return fmt(values[0]) if values else "?"

    peak = record.get("load_peak")
    threads = record.get("threads_per_cell")
    return (
        f"Load (1-minute average): {first('load_start')} at the start, {first('load_end')} at the end, at most "
        f"{fmt(peak) if peak is not None else '?'} during the run; cells at once: {record.get('parallel', '?')}, "
        f"CPU threads per cell: {threads if threads is not None else 'torch default'}"
        + (f", devices: {', '.join(record['devices'])}" if record.get("devices") else "")
    )
