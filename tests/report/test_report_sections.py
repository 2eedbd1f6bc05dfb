"""The report's sections that read more than the TensorBoard scalars: provenance, settings without
effect, evaluation metrics, health checks and completions; each from crafted files."""

import json
import re

import numpy as np
import pytest

from grpo_lightning.ablation.runs import Run, Series
from grpo_lightning.report import Arm, build_report
from grpo_lightning.report.render.document import plain_text
from grpo_lightning.report.sections.curves import sampled_tags
from grpo_lightning.report.sections.effects import clip_settings, distinct_clip_settings, ineffective_notes
from grpo_lightning.report.sections.provenance import command_line_changes, command_line_notes, wall_clock_caveat

PROVENANCE = {
    "command": "grpo-lightning-ablate --config-name default",
    "started": "2026-11-28T10:00:00+00:00",
    "finished": "2026-11-28T10:30:00+00:00",
    "commit": "0123456789abcdef0123456789abcdef01234567",
    "dirty": False,
    "packages": {"grpo-lightning": "0.1.0", "torch": "2.13.0+cpu", "transformers": "5.24.0", "lightning": "2.6.6"},
    "machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "memory_gib": 24.0, "gpus": [], "platform": "Linux", "python": "3.11.9"},
    "parallel": 1,
    "threads_per_cell": None,
    "devices": [],
    "load_start": [0.5, 0.4, 0.3],
    "load_peak": 1.9,
    "load_end": [1.2, 1.0, 0.8],
    "cells": {"grpo-seed0": "done", "dapo-seed0": "done"},
}


def two_arm_sweep(root, cell_writer, seeds=(0, 1), **kwargs):
    for seed in seeds:
        cell_writer(root, "grpo", seed, 0.5 + 0.1 * seed, **kwargs.get("grpo", {}))
        cell_writer(root, "dapo", seed, 0.3 + 0.1 * seed, **kwargs.get("dapo", {}))
    return root


def report_text(root, tmp_path) -> str:
    return (build_report(root, tmp_path / "out") / "report.md").read_text()


# ---------------------------------------------------------------------------- provenance


def test_provenance_is_shown_and_an_idle_machine_keeps_wall_clock(tmp_path, cell_writer):
    root = two_arm_sweep(tmp_path / "sweep", cell_writer)
    (root / "provenance.json").write_text(json.dumps([PROVENANCE]))
    md = report_text(root, tmp_path)
    provenance = md.split("## Provenance")[1]
    assert "Command: `grpo-lightning-ablate --config-name default`" in provenance
    assert "Commit: `0123456789abcdef0123456789abcdef01234567`" in provenance
    assert "torch 2.13.0+cpu, transformers 5.24.0, lightning 2.6.6" in provenance
    assert "AMD EPYC 7B13, 2 cores, 24.0 GiB, no GPU" in provenance
    assert "0.5 at the start, 1.2 at the end, at most 1.9 during the run; cells at once: 1" in provenance
    assert "Cells run: 2 (2 done)" in provenance
    assert "wall-clock times measure" not in md and "training wall-clock (s) †" not in md


def test_a_dirty_tree_and_mixed_commits_carry_a_banner(tmp_path, cell_writer):
    root = two_arm_sweep(tmp_path / "sweep", cell_writer)
    clean = {**PROVENANCE, "diff": ""}
    dirty = {**PROVENANCE, "commit": "fedcba9876543210fedcba9876543210fedcba98", "dirty": True, "diff": "-beta = 0.04",
             "command": "grpo-lightning-ablate --config-name default args.trainer.max_steps=50"}  # fmt: skip
    (root / "provenance.json").write_text(json.dumps([clean, dirty]))
    head = report_text(root, tmp_path).split("## Summary")[0]
    assert ("**Warning: 1 of 2 runs of the sweep used a checkout with uncommitted changes to tracked files;** the "
            "uncommitted diff is recorded in `data/provenance.json`.") in head  # fmt: skip
    assert "**Warning: the cells of this sweep ran at 2 different commits** (`0123456789`, `fedcba9876`" in head
    assert "**Note: the sweep's command line changed its config file:** `args.trainer.max_steps=50`" in head
    (root / "provenance.json").write_text(json.dumps([clean]))
    assert "Warning" not in report_text(root, tmp_path / "again").split("## Summary")[0]
    (root / "provenance.json").write_text(json.dumps([{**PROVENANCE, "dirty": True}]))  # no diff recorded
    assert "cannot be redone exactly" in report_text(root, tmp_path / "old").split("## Summary")[0]
    # an untracked file (a new variant config) makes the tree dirty: its path is named, its contents were not kept
    untracked = {**PROVENANCE, "dirty": True, "diff": "", "untracked": ["configs/variant/mine.yaml"]}
    (root / "provenance.json").write_text(json.dumps([untracked]))
    md = report_text(root, tmp_path / "untracked")
    assert ("untracked files, whose contents were not recorded, so these runs cannot be redone exactly:** "
            "`configs/variant/mine.yaml`.") in md.split("## Summary")[0]  # fmt: skip
    assert "(with untracked files, contents not recorded: `configs/variant/mine.yaml`)" in md


def test_cells_run_on_other_kinds_of_accelerator_carry_a_banner(tmp_path, cell_writer):
    """Seeds added later on another card: its kernels round differently, so a seed trains otherwise there."""
    root = two_arm_sweep(tmp_path / "sweep", cell_writer)
    h200 = {**PROVENANCE, "machine": {**PROVENANCE["machine"], "gpus": ["NVIDIA H200"]}}
    h100 = {**PROVENANCE, "machine": {**PROVENANCE["machine"], "gpus": ["NVIDIA H100 80GB HBM3"] * 2}}
    (root / "provenance.json").write_text(json.dumps([h200, h100]))
    head = report_text(root, tmp_path / "two").split("## Summary")[0]
    assert ("**Warning: the cells of this sweep ran on 2 kinds of accelerator** (NVIDIA H200; NVIDIA H100 80GB HBM3; "
            "see Provenance") in head  # fmt: skip
    two_h200 = {**PROVENANCE, "machine": {**PROVENANCE["machine"], "gpus": ["NVIDIA H200"] * 2}}
    (root / "provenance.json").write_text(json.dumps([h200, two_h200]))  # one kind of card, on machines of 1 and 2
    assert "kinds of accelerator" not in report_text(root, tmp_path / "one").split("## Summary")[0]
    # which seeds' pairs are of one kind: each cell on the machine of the last record that ran it
    seed0, seed1 = {"grpo-seed0": "done", "dapo-seed0": "done"}, {"grpo-seed1": "done", "dapo-seed1": "done"}
    (root / "provenance.json").write_text(json.dumps([{**h200, "cells": seed0}, {**h100, "cells": seed1}]))
    assert "every seed's arms ran on one kind, so each paired difference is of one kind." in report_text(root, tmp_path / "a")
    split = [{**h200, "cells": {**seed0, "grpo-seed1": "done"}}, {**h100, "cells": {"dapo-seed1": "done"}}]
    (root / "provenance.json").write_text(json.dumps(split))
    assert "the arms of seed 1 ran on different kinds, so their paired differences mix kinds." in report_text(root, tmp_path / "b")
    (root / "provenance.json").write_text(json.dumps([{**h200, "cells": {}}, h100]))  # a record that names no cells
    assert "compare arms at seeds that ran on one kind." in report_text(root, tmp_path / "c")
    cpus = {**PROVENANCE, "machine": {**PROVENANCE["machine"], "cpu": "Intel Xeon"}}  # CPU sweeps: no banner
    (root / "provenance.json").write_text(json.dumps([PROVENANCE, cpus]))
    assert "kinds of accelerator" not in report_text(root, tmp_path / "cpu").split("## Summary")[0]


def test_runs_that_started_from_other_code_carry_a_banner_naming_them(tmp_path, cell_writer):
    """Code edited (or another branch checked out) while a sweep runs: the commit of the sweep's start
    still names every run, so each cell's own record of its source is what tells them apart."""
    root = two_arm_sweep(tmp_path / "sweep", cell_writer, seeds=(0, 1, 2))
    (root / "provenance.json").write_text(json.dumps([PROVENANCE]))
    start = {"commit": PROVENANCE["commit"], "dirty": False, "source_sha256": "aaaaaaaaaaaaaaaa"}
    edited = {**start, "dirty": True, "source_sha256": "bbbbbbbbbbbbbbbb"}

    def record_code(codes):
        for cell, code in codes.items():
            record = json.loads((root / cell / "cell.json").read_text())
            (root / cell / "cell.json").write_text(json.dumps({**record, "code": code}))

    record_code({f"{arm}-seed{seed}": start for arm in ("grpo", "dapo") for seed in (0, 1, 2)})
    md = report_text(root, tmp_path / "one")
    assert "versions of the library's code" not in md.split("## Summary")[0]
    assert ("The library's code each run started with (SHA-256 of its Python source, first 16 digits): "
            "`aaaaaaaaaaaaaaaa` at commit `0123456789`, 6 runs.") in md.split("## Provenance")[1]  # fmt: skip

    record_code({"dapo-seed2": edited, "grpo-seed2": edited})
    md = report_text(root, tmp_path / "two")
    assert ("**Warning: the runs started from 2 versions of the library's code** (source digests: `aaaaaaaaaaaaaaaa` "
            "at commit `0123456789`, 4 runs; `bbbbbbbbbbbbbbbb` at commit `0123456789` with uncommitted changes, 2 runs: "
            "dapo seed 2 and grpo seed 2): arms may differ by code") in md.split("## Summary")[0]  # fmt: skip
    # a run of an older version, which recorded no code, is counted as such
    record = json.loads((root / "grpo-seed1" / "cell.json").read_text())
    del record["code"]
    (root / "grpo-seed1" / "cell.json").write_text(json.dumps(record))
    assert "; 1 run recorded none." in report_text(root, tmp_path / "old").split("## Provenance")[1]


def test_training_reward_is_compared_only_on_the_baselines_reward_functions(tmp_path, cell_writer):
    majority = {"rewards": {"funcs": ["grpo_lightning.rewards.majority_vote_reward"]}}
    root = two_arm_sweep(tmp_path / "sweep", cell_writer, seeds=(0, 1, 2), dapo={"config_changes": majority})
    md = report_text(root, tmp_path)
    summary = md.split("## Summary")[1].split("## Runs")[0]
    assert "On final val/accuracy (grpo 0.6): **dapo**" in summary
    # only the baseline itself is on its scale: no comparison, and a note why
    assert "On training reward" not in summary
    assert "The training reward of **dapo** is not compared with **grpo**'s: other reward functions" in summary
    assert "Not compared (other reward functions): dapo." in md.split("## Effects against the baseline")[1]


def test_identical_arms_and_other_starts_are_flagged(tmp_path, cell_writer):
    root = tmp_path / "sweep"
    for seed in (0, 1, 2):
        cell_writer(root, "grpo", seed, 0.5 + 0.1 * seed)
        cell_writer(root, "grpo", seed, 0.5 + 0.1 * seed, stem="+r1")  # the same runs under another name
    summary = report_text(root, tmp_path).split("## Summary")[1].split("## Runs")[0]
    assert ("**Warning:** **grpo** and **grpo+r1** logged the same reward, kl and val/accuracy at every step of "
            "every seed: what sets them apart had no effect.") in summary  # fmt: skip
    assert "**grpo+r1** identical at every seed" in summary


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"load_peak": 3.1}, "the 1-minute load average reached 3.1 on 2 cores"),
        ({"parallel": 2}, "2 cells ran at once on the CPU"),
        ({"parallel": 8, "devices": ["0"]}, "8 cells ran at once on 1 GPU"),  # a cell's time: which cells ran beside it
        ({"parallel": 4, "devices": ["0", "1"]}, "4 cells ran at once on 2 GPUs"),
    ],
)
def test_a_loaded_machine_flags_wall_clock(tmp_path, cell_writer, changes, reason):
    root = two_arm_sweep(tmp_path / "sweep", cell_writer)
    (root / "provenance.json").write_text(json.dumps([{**PROVENANCE, **changes}]))
    md = report_text(root, tmp_path)
    assert reason in wall_clock_caveat([{**PROVENANCE, **changes}])
    summary = md.split("## Summary")[1].split("## Runs")[0]
    assert (
        f"The training wall-clock is not compared: wall-clock times measure the machine's load as much as the algorithm ({reason})."
        in summary
    )
    final = md.split("## Final metrics")[1].split("## Pairwise")[0]
    assert "| training wall-clock (s) † |" in final and "† Training wall-clock: wall-clock times measure" in final
    assert "| training wall-clock (s) † |\n" in final.split("<summary>Final values of every run")[1]  # the per-run column too
    curves = md.split("## Learning curves")[1].split("### ")[0]
    assert "**The wall-clock column is left out:** Wall-clock times measure" in curves


def test_a_sweep_run_with_changed_settings_says_so_first():
    command = ("grpo-lightning-ablate --config-name grpo_systems args.trainer.max_steps=100 parallel=2 gpus=none "
               "hydra/launcher=joblib hydra.launcher.n_jobs=2 ++seeds=[0,1]")  # fmt: skip
    assert command_line_changes(command) == ["args.trainer.max_steps=100", "++seeds=[0,1]"]  # not how cells ran
    assert command_line_notes([{**PROVENANCE, "command": command}]) == [
        "**Note: the sweep's command line changed its config file:** `args.trainer.max_steps=100`, `++seeds=[0,1]` "
        "(the Configuration section shows the settings the cells ran with)."]  # fmt: skip
    assert command_line_notes([PROVENANCE]) == []


def test_parallel_cells_on_gpus_keep_wall_clock():
    assert wall_clock_caveat([{**PROVENANCE, "parallel": 2, "devices": ["0", "1"]}]) is None
    assert wall_clock_caveat([]) is None


# ---------------------------------------------------------------------------- settings without effect


def arm(name: str, clip_values) -> Arm:
    steps = np.arange(len(clip_values))
    series = Series(steps, np.asarray(clip_values, dtype=float), steps * 1.0)
    scalars = {"clip_ratio/low": series, "clip_ratio/high": series, "clip_ratio/region": series}
    return Arm(name, [], [Run(None, scalars), Run(None, scalars)])


def clip_config(class_name: str, low: float = 0.2, high: float = 0.2) -> dict:
    return {"model.class_path": f"grpo_lightning.variants.{class_name}", "model.init_args.loss.clip_eps_low": str(low),
            "model.init_args.loss.clip_eps_high": str(high)}  # fmt: skip


def test_the_arms_with_clip_settings_of_their_own():
    settings = {
        "grpo": {"clip_eps_high": "0.2", "delta": "—"},
        "dr_grpo": {"clip_eps_high": "0.2", "delta": "—"},
        "dapo": {"clip_eps_high": "0.28", "delta": "—"},
    }
    assert distinct_clip_settings(settings) == {"dapo": ["clip_eps_high"]}  # grpo's and dr_grpo's are the majority
    assert distinct_clip_settings({"a": {"x": "1"}, "b": {"x": "2"}}) == {"a": ["x"], "b": ["x"]}  # no majority
    assert distinct_clip_settings({"a": {"x": "1"}, "b": {"x": "1"}}) == {}


def test_sequence_level_clipping_follows_the_surrogate_an_arm_names():
    def sequence(class_name, surrogate=None):
        config = {**clip_config(class_name), "model.init_args.loss.surrogate": surrogate}
        return clip_settings(config)["sequence-level clipping"]

    assert [sequence("GSPO"), sequence("LUSPO"), sequence("GRPO")] == ["yes", "yes", "no"]
    assert [sequence("GRPO", "gspo"), sequence("GSPO", "ppo_clip"), sequence("GSPO", "None")] == ["yes", "no", "yes"]


def test_clip_settings_that_never_clipped_are_flagged_only_where_no_arm_clipped_or_theirs_is_the_tightest():
    # the default ablation's shape: grpo and rloo clip alike (the majority), dapo and gspo differ
    arms = [arm("grpo", [0, 0, 0]), arm("rloo", [0, 0, 0]), arm("dapo", [0, 0, 0]), arm("gspo", [0, 0.3, 0])]
    configs = {"grpo": clip_config("GRPO"), "rloo": clip_config("RLOO"), "dapo": clip_config("DAPO", high=0.28),
               "gspo": clip_config("GSPO", 3e-4, 4e-4)}  # fmt: skip
    # gspo (sequence-level) clipped at step 1: dapo's looser 0.28 never clipping says nothing of grpo's 0.2
    assert ineffective_notes(arms, configs) == []
    arms[3] = arm("gspo", [0, 0, 0])  # no arm clipped (one optimizer step a rollout): every setting is inert
    notes = [plain_text(note) for note in ineffective_notes(arms, configs)]
    assert notes[0] == (
        "**dapo** (`clip_eps_high`=0.28): clip_ratio/region, clip_ratio/low and clip_ratio/high stayed 0 at every "
        "step of every seed, so its clip settings had no effect; the importance ratio never left the clip range."
    )
    assert notes[1].startswith(
        "**gspo** (`clip_eps_low`=0.0003, `clip_eps_high`=0.0004, `sequence-level clipping`=yes): clip_ratio/region"
    )


def test_an_upper_bound_that_never_clipped_is_flagged_when_it_is_the_tightest():
    steps = np.arange(3)
    zero, some = Series(steps, np.zeros(3), steps * 1.0), Series(steps, np.full(3, 0.1), steps * 1.0)

    def clipped_low_only(name):
        return Arm(name, [], [Run(None, {"clip_ratio/low": some, "clip_ratio/high": zero, "clip_ratio/region": some})])

    others = [arm("grpo", [0.1] * 3), arm("rloo", [0.1] * 3)]  # their bounds (0.2, 0.2) clipped
    configs = {"grpo": clip_config("GRPO"), "rloo": clip_config("RLOO"), "tight": clip_config("GRPO", high=0.1),
               "dapo": clip_config("DAPO", high=0.28), "cispo": clip_config("CISPO", low="null", high=5.0)}  # fmt: skip
    notes = ineffective_notes([*others, clipped_low_only("tight")], configs)
    assert [plain_text(note) for note in notes] == ["**tight**: its `clip_eps_high`=0.1 never clipped a token (clip_ratio/high 0 at every step of every seed)."]
    # a looser bound (DAPO's clip-higher) or an unset one (CISPO's lower) that never clipped: grpo's 0.2 might have
    assert ineffective_notes([*others, clipped_low_only("dapo")], configs) == []
    cispo = Arm("cispo", [], [Run(None, {"clip_ratio/low": zero, "clip_ratio/high": some, "clip_ratio/region": some})])
    assert ineffective_notes([*others, cispo], configs) == []


def test_the_report_names_settings_without_effect(tmp_path, cell_writer):
    root = tmp_path / "sweep"
    for seed in (0, 1):
        cell_writer(root, "grpo", seed, 0.5, clip=(0.0, 0.0))
        cell_writer(root, "rloo", seed, 0.5, clip=(0.0, 0.0))
        cell_writer(root, "dapo", seed, 0.5, clip=(0.0, 0.0))  # clip_eps_high 0.28, the others 0.2
    md = report_text(root, tmp_path)
    assert "Settings without effect: **dapo** has a clip setting that never clipped a token" in md
    section = md.split("## Settings without effect")[1].split("## Final metrics")[0]
    assert "- **dapo** (`clip_eps_high`=0.28): clip_ratio/region, clip_ratio/low and clip_ratio/high stayed 0" in section
    assert "**grpo**" not in section and "**rloo**" not in section


def test_no_note_where_clipping_happened(tmp_path, cell_writer):
    md = report_text(two_arm_sweep(tmp_path / "sweep", cell_writer), tmp_path)
    assert "Settings without effect" not in md


# ---------------------------------------------------------------------------- evaluation metrics


def test_pass_at_k_and_maj_at_k_per_variant(tmp_path, cell_writer):
    def val(seed):  # pass@1 0.5 / 0.6 by seed; pass@2, pass@4 and maj@4 above it
        p1 = 0.5 + 0.1 * seed
        return {"val/pass@1": p1, "val/pass@1_ci_low": p1 - 0.05, "val/pass@1_ci_high": p1 + 0.05,
                "val/pass@2": p1 + 0.1, "val/pass@4": p1 + 0.2, "val/maj@4": p1 + 0.05,
                "val/accuracy_ci_low": p1 - 0.1, "val/accuracy_ci_high": p1 + 0.1}  # fmt: skip

    root = tmp_path / "sweep"
    for seed in (0, 1):
        cell_writer(root, "grpo", seed, 0.5 + 0.1 * seed, final_val=val(seed))
    cell_writer(root, "dapo", 0, 0.3)  # an arm without pass@k: no rows of its own
    md = report_text(root, tmp_path)
    section = md.split("## Evaluation")[1].split("## Effects")[0]
    # two seeds: 0.55 -+ t(0.975, 1) 12.706 * 0.05 = [-0.085, 1.19], clipped to [0, 1]
    assert "| accuracy | 0.55 [0, 1] | 0.3 |" in section
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["metric", "accuracy", "pass@1", "pass@2", "pass@4", "maj@4", "run", "grpo-seed0", "grpo-seed1", "dapo-seed0"]
    assert "| pass@4 | 0.75 [0.1147, 1] | n/a |" in section  # 0.75 -+ 0.6353, clipped at 1
    assert "| grpo-seed1 | 0.6 [0.5, 0.7] | 0.6 [0.55, 0.65] |" in section  # the run's own intervals over prompts
    # per-run accuracy in the final values table: the interval the run logged
    assert "| grpo-seed0 | 0 | 0.5 [0.4, 0.6] |" in md
    # pass@k (k > 1) and maj@k over training, after val/accuracy's figure (pass@1 is its curve)
    curves = md.split("## Learning curves")[1]
    assert curves.index("### val/accuracy") < curves.index("### pass@k and maj@k") < curves.index("### reward")
    assert (tmp_path / "out" / "curves_pass_maj.png").is_file()
    assert sampled_tags([Arm("grpo", [], [Run(tmp_path, {t: None for t in ("val/pass@1", "val/maj@4", "val/pass@2",
                                                                              "val/pass@1_ci_low")})])]) == [
        "val/pass@2", "val/maj@4"]  # fmt: skip


def test_per_run_accuracy_has_a_wilson_interval_when_the_prompts_are_counted(tmp_path, cell_writer):
    root = tmp_path / "sweep"
    cell_writer(root, "grpo", 0, 0.7, config_changes={})
    config = root / "grpo-seed0" / "config.yaml"
    config.write_text(config.read_text().replace("num_train: 32", "num_train: 32\n    num_val: 10"))
    md = report_text(root, tmp_path)
    assert "## Evaluation" not in md  # nothing beyond the greedy accuracy
    assert "| grpo-seed0 | 0 | 0.7 [0.3968, 0.8922] |" in md  # Wilson 7 of 10, see test_wilson_interval_by_hand


# ---------------------------------------------------------------------------- health


def write_health(directory, flagged_first_step=None):
    checks = [{"check": "finite_loss", "ok": True, "steps": 0, "first_step": None, "detail": ""}]
    flagged = flagged_first_step is not None
    checks.append({"check": "reward_collapse", "ok": not flagged, "steps": 3 if flagged else 0,
                   "first_step": flagged_first_step, "detail": "reward std 0 for 3 steps" if flagged else ""})  # fmt: skip
    (directory / "health.json").write_text(json.dumps(checks))


def test_health_counts_the_seeds_that_flagged_each_check(tmp_path, cell_writer):
    root = tmp_path / "sweep"
    grpo = [cell_writer(root, "grpo", seed, 0.5) for seed in range(3)]
    dapo = [cell_writer(root, "dapo", seed, 0.5) for seed in range(2)]
    write_health(grpo[0], flagged_first_step=14)
    write_health(grpo[1], flagged_first_step=9)
    write_health(grpo[2])
    write_health(dapo[0])  # dapo-seed1 has no health.json: it adds no rows
    md = report_text(root, tmp_path)
    section = md.split("## Health")[1].split("## Learning curves")[0]
    assert "| check | grpo | dapo |" in section
    assert "| `finite_loss` | 0 of 3 | 0 of 1 |" in section
    assert "| `reward_collapse` | 2 of 3 (from step 9) | 0 of 1 |" in section
    assert "`grpo-seed0`: `reward_collapse`, 3 steps from step 14: reward std 0 for 3 steps" in section


def test_no_health_section_without_files(tmp_path, cell_writer):
    assert "## Health" not in report_text(two_arm_sweep(tmp_path / "sweep", cell_writer), tmp_path)


# ---------------------------------------------------------------------------- completions


def completion(step, group, text, reward=1.0, advantage=0.5, truncated=False):
    return {"step": step, "group": group, "prompt": f"What is {step}+{group}?", "completion": text,
            "rewards": {"accuracy": reward, "format": None}, "reward": reward, "advantage": advantage,
            "truncated": truncated}  # fmt: skip


def test_completions_of_the_first_and_last_step(tmp_path, cell_writer):
    root = tmp_path / "sweep"
    seed1 = cell_writer(root, "grpo", 1, 0.5)
    seed0 = cell_writer(root, "grpo", 0, 0.5)
    cell_writer(root, "dapo", 0, 0.4)  # no completions.jsonl: no rows
    records = [completion(0, g, f"first {g}") for g in range(5)]
    records += [completion(5, 0, "middle step")]
    records += [completion(9, 0, "a | b **bold** `tick` <b>x</b>\nnext line", reward=0.0, advantage=-0.75, truncated=True)]
    records += [completion(9, 1, "x" * 500)]
    lines = [json.dumps(r) for r in records] + ["not json"]
    (seed0 / "completions.jsonl").write_text("\n".join(lines) + "\n")
    (seed1 / "completions.jsonl").write_text(json.dumps(completion(0, 0, "from seed 1")) + "\n")
    target = build_report(root, tmp_path / "out")
    md = (target / "report.md").read_text()
    section = md.split("## Completions")[1].split("## Learning curves")[0]
    assert "### grpo" in section and "### dapo" not in section and "from seed 1" not in section
    assert "| 0 | `What is 0+0?` | `first 0` | 1 | 0.5 |" in section
    assert "first 2" in section and "first 3" not in section  # three per step
    assert "middle step" not in section
    # Markdown inside a code span is not read as such; | is escaped for the table; the line break shows as ⏎
    assert "| 9 | `What is 9+0?` | `a \\| b **bold** 'tick' <b>x</b>⏎next line` (truncated) | 0 | -0.75 |" in section
    long = next(line for line in section.splitlines() if "xxx" in line)
    assert " … " in long and long.count("x") == 160 - 3
    html = (target / "report.html").read_text()
    assert "<code>a | b **bold** 'tick' &lt;b&gt;x&lt;/b&gt;⏎next line</code>" in html


# ---------------------------------------------------------------------------- users' text

HOSTILE_ARM = "<script>x</script>|a"
HOSTILE_COMPLETION = "<img src=x onerror=alert(1)> | `tick` *not bold*\r\nnext"


def table_widths(md: str) -> list[set[int]]:
    """The numbers of cells in the rows of each table (split at the pipes that are not escaped)."""
    widths, current = [], set()
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.add(len(re.split(r"(?<!\\)\|", line)))
        elif current:
            widths, current = widths + [current], set()
    return widths


def test_an_arms_name_and_a_completion_show_as_text_in_report_md(tmp_path, cell_writer):
    root = tmp_path / "sweep"
    for seed in (0, 1):
        cell_writer(root, "grpo", seed, 0.5)
        hostile = cell_writer(root, "dapo", seed, 0.3 + 0.1 * seed)
        record = json.loads((hostile / "cell.json").read_text())
        (hostile / "cell.json").write_text(json.dumps({**record, "arm": HOSTILE_ARM}))
        (hostile / "completions.jsonl").write_text(json.dumps(completion(0, 0, HOSTILE_COMPLETION)) + "\n")
    target = build_report(root, tmp_path / "out")
    md = (target / "report.md").read_text()
    outside_code_spans = re.sub(r"`[^`\n]*`", "", md)
    assert "<script" not in outside_code_spans and "<img" not in outside_code_spans
    assert "### &lt;script&gt;x&lt;/script&gt;&#124;a\n" in md  # its completions' heading
    assert "| **&lt;script&gt;x&lt;/script&gt;&#124;a** | dapo |" in md  # the Runs table
    assert "| `<img src=x onerror=alert(1)> \\| 'tick' *not bold*⏎next` | 1 | 0.5 |" in md  # shown as code
    assert all(len(widths) == 1 for widths in table_widths(md))  # no row has a cell more or less
    html = (target / "report.html").read_text()
    assert "&lt;script&gt;x&lt;/script&gt;|a" in html and "<script" not in html


def test_a_looser_bound_that_never_clipped_is_not_called_inert_when_the_baseline_clipped(tmp_path, cell_writer):
    """GRPO clipped at its upper bound 0.2 and DAPO never at its 0.28: whether DAPO's ratios passed 0.2 is not
    in the logs, so its clip-higher is not reported as a setting without effect (it may be what set it apart)."""
    root = tmp_path / "sweep"
    for seed in (0, 1):
        cell_writer(root, "grpo", seed, 0.5, clip=(0.01, 0.02))
        cell_writer(root, "dapo", seed, 0.5, clip=(0.01, 0.0))
    md = report_text(root, tmp_path)
    assert "Settings without effect" not in md and "never clipped" not in md

def test_cells_a_stopped_run_finished_but_never_collected_count_as_done(tmp_path, cell_writer):
    """A joblib sweep stopped at its deadline returned no results, so older records called every cell not
    finished; a cell with its DONE marker that no later run started was finished by that run."""
    root = two_arm_sweep(tmp_path / "sweep", cell_writer)
    stopped = {**PROVENANCE, "cells": dict.fromkeys(["grpo-seed0", "dapo-seed0", "grpo-seed1", "dapo-seed1"], "not finished")}
    resumed = {**PROVENANCE, "cells": {"dapo-seed1": "done"}}  # the next run finished this one
    (root / "provenance.json").write_text(json.dumps([stopped, resumed]))
    text = report_text(root, tmp_path / "a")
    assert ("Cells run: 4 (3 done, though recorded as not finished (the run was stopped before it collected them), "
            "1 not finished)") in text
    assert "Cells run: 1 (1 done)" in text
    # joined from its sources in the other order: the records' start times, not their places, say which came later
    stopped["started"], resumed["started"] = "2026-11-28T10:00:00+00:00", "2026-11-29T10:00:00+00:00"
    (root / "provenance.json").write_text(json.dumps([resumed, stopped]))
    assert "3 done, though recorded as not finished (the run was stopped before it collected them), 1 not finished)" in (
        report_text(root, tmp_path / "b"))
