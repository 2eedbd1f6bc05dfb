"""A sweep's cells forked from a server that imported the CLI once: each still a process of its own,
with its own log and exit status, training exactly what a subprocess trains."""

from __future__ import annotations

import os
import sys

from grpo_lightning.ablation import cell_process
from grpo_lightning.ablation import sweep as ablate
from grpo_lightning.ablation.metrics import summarize_cell
from grpo_lightning.ablation.spec import SweepSpec
from grpo_lightning.ablation.sweep import cell_command

BASE = ["configs/trainer/cpu.yaml", "configs/data/arithmetic.yaml", "configs/model/tiny.yaml"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def test_only_this_interpreter_running_the_cli_is_forked(tmp_path):
    assert cell_process.can_fork([sys.executable, "-m", "grpo_lightning.cli", "fit"])
    (tmp_path / "python").symlink_to(sys.executable)  # another virtual environment's python, say
    assert not cell_process.can_fork([str(tmp_path / "python"), "-m", "grpo_lightning.cli", "fit"])
    assert not cell_process.can_fork(["/usr/bin/python3.9", "-m", "grpo_lightning.cli", "fit"])
    assert not cell_process.can_fork([sys.executable, "-m", "some_other_module", "fit"])


def test_a_forked_cell_trains_what_a_subprocess_trains_and_fails_or_times_out_as_one(tmp_path, tiny_model_dir):
    spec = SweepSpec.from_dict({
        "output_dir": str(tmp_path / "sweep"), "base_configs": BASE, "variants": ["grpo"], "seeds": [3],
        "args": {"trainer": {"max_steps": 2, "val_check_interval": 2},
                 "data": {"init_args": {"num_train": 16, "num_val": 4, "batch_size": 2, "val_batch_size": 4}},
                 "model": {"init_args": {"sampling": {"group_size": 2, "max_new_tokens": 4}}}},
    })  # fmt: skip
    cell = spec.cells()[0]
    finals = []
    for how in ("forked", "subprocess"):
        cell_dir = tmp_path / how
        cell_dir.mkdir()
        command = cell_command(spec, cell, cell_dir, tiny_model_dir)
        with open(cell_dir / "train.log", "w") as log:
            if how == "forked":
                assert cell_process.can_fork(command)
                status = ablate.launch(command, log, ONE_THREAD)
            else:
                status = ablate._run_subprocess(command, log, {**os.environ, **ONE_THREAD}, None)
        assert status == 0, (cell_dir / "train.log").read_text()[-2000:]
        finals.append(summarize_cell(cell_dir)["final"])
    assert {"loss", "grad_norm", "val/accuracy"} <= finals[0].keys()
    same = [{k: v for k, v in final.items() if not k.startswith("perf/")} for final in finals]  # all but timings
    assert same[0] == same[1]

    with open(tmp_path / "bad.log", "w") as log:  # a user's error: the CLI's one line and its exit status
        log.write("before\n")
        assert ablate.launch([*command, "--model.no_such_option", "1"], log, ONE_THREAD) == 2
    text = (tmp_path / "bad.log").read_text()
    assert text.startswith("before\n") and "no_such_option" in text and "run again with --verbose" in text

    with open(tmp_path / "long.log", "w") as log:
        assert ablate.launch([*command, "--trainer.max_steps", "100000"], log, ONE_THREAD, timeout_s=2) == 124
    assert (tmp_path / "long.log").read_text().rstrip().endswith("stopped after the cell timeout of 2 s")


def test_a_cell_the_server_cannot_fork_runs_as_a_subprocess(tmp_path, monkeypatch, caplog):
    def refuse(*args):
        raise cell_process.ServerUnavailable("CUDA was initialised while importing")

    ran = []
    monkeypatch.setattr(cell_process, "run_forked", refuse)
    monkeypatch.setattr(ablate, "_run_subprocess", lambda command, log, env, timeout_s: ran.append(command) or 0)
    command = [sys.executable, "-m", "grpo_lightning.cli", "fit"]
    with open(tmp_path / "train.log", "w") as log:
        assert ablate.launch(command, log, ONE_THREAD) == 0
    assert ran == [command] and "cells run as subprocesses: CUDA was initialised while importing" in caplog.text


def test_a_forked_cell_of_two_ddp_processes_starts_its_second_as_python_m_would(tmp_path, tiny_model_dir):
    """Lightning starts a CPU DDP run's other processes as ``python -m <__main__.__spec__.name> ARGS``: a
    forked cell must read as ``python -m grpo_lightning.cli`` (run as a script, ``grpo_lightning/cli``
    would come first on ``sys.path``, its modules top-level ones)."""
    spec = SweepSpec.from_dict({
        "output_dir": str(tmp_path / "sweep"), "base_configs": BASE, "variants": ["grpo"], "seeds": [0],
        "args": {"trainer": {"max_steps": 1, "val_check_interval": 1, "strategy": "ddp", "devices": 2},
                 "data": {"init_args": {"num_train": 8, "num_val": 4, "batch_size": 2, "val_batch_size": 4}},
                 "model": {"init_args": {"sampling": {"group_size": 2, "max_new_tokens": 4}}}},
    })  # fmt: skip
    command = cell_command(spec, spec.cells()[0], tmp_path / "cell", tiny_model_dir)
    with open(tmp_path / "train.log", "w") as log:
        status = ablate.launch(command, log, ONE_THREAD, timeout_s=300)
    text = (tmp_path / "train.log").read_text()
    assert status == 0 and "MEMBER: 2/2" in text and "fit finished: 1 / 1" in text, text[-2000:]


def test_a_sweep_starts_its_cell_server_before_it_checks_its_cells(tmp_path, monkeypatch):
    """The check parses every cell's command here, importing the CLI; the server imports it meanwhile.
    A launcher that starts the cells elsewhere gets no server here."""

    class Stop(Exception):
        pass

    def check_cells(spec, cells, commands):
        servers.append(cell_process._current)
        raise Stop

    monkeypatch.setattr(cell_process, "_current", None)
    monkeypatch.setattr(ablate.labels, "check_cells", check_cells)
    spec = {"output_dir": str(tmp_path / "sweep"), "base_configs": BASE, "model": "/m", "variants": ["grpo"], "seeds": [0]}
    servers: list = []
    for launch in (ablate.InProcess(in_this_process=False), ablate.InProcess()):
        try:
            ablate.run_sweep(spec, launch)
        except Stop:
            pass
    elsewhere, here = servers
    assert elsewhere is None and here is not None
    try:
        assert here.serves(ablate.cell_environment(ONE_THREAD))  # the cells' environment, per-cell variables aside
    finally:
        here.close()
