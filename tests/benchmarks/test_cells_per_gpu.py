"""benchmarks/cells_per_gpu.py's MPS switch. The control daemon ships with NVIDIA's driver, absent here:
a stand-in script on the PATH records how it is called (the one thing mocked)."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cells_per_gpu", ROOT / "benchmarks" / "cells_per_gpu.py")
cells_per_gpu = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cells_per_gpu)


def test_the_mps_daemon_runs_for_the_wave_with_its_folders_and_quits_after(tmp_path, monkeypatch):
    calls = tmp_path / "calls.txt"
    control = tmp_path / "bin" / "nvidia-cuda-mps-control"
    control.parent.mkdir()
    control.write_text(f'#!/bin/sh\necho "$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$(cat)" >> {calls}\n')
    control.chmod(control.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{control.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with cells_per_gpu.mps_daemon(tmp_path / "wave") as env:
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "wave" / "mps_pipe")  # the cells' environment
    start, stop = calls.read_text().splitlines()
    assert start == f"-d pipe={tmp_path / 'wave' / 'mps_pipe'} stdin="
    assert stop == f" pipe={tmp_path / 'wave' / 'mps_pipe'} stdin=quit"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ  # this process's own environment is untouched


def test_without_the_daemon_on_the_path_mps_on_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match="--mps off"), cells_per_gpu.mps_daemon(tmp_path):
        pass
