"""Sweeps through Hydra's launcher plugins: real jobs of submitit's local executor and joblib."""

import json
import stat
import sys

import pytest

from grpo_lightning.ablation.provenance import PROVENANCE_FILE
from grpo_lightning.ablation.run import main
from grpo_lightning.ablation.sweep import DONE_FILE, METRICS_FILE
from grpo_lightning.report import build_report

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install 'grpo-lightning[launchers]'")
pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install 'grpo-lightning[launchers]'")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config

    tokenizer = build_char_tokenizer()
    config = tiny_config(tokenizer, hidden_size=16, num_layers=1, intermediate_size=32)
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", tokenizer, config)


def ablate(monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["grpo-lightning-ablate", *args])
    main()


def tiny_sweep(out, model, seeds):
    """A sweep of one GRPO fit of one optimizer step per seed on a sliver of the arithmetic task."""
    return [
        "--config-name", "smoke", f"output_dir={out}", f"model={model}", "variants=[grpo]", f"seeds={seeds}",
        "gpus=none", "threads=1", "validate_before_training=false",
        "args.trainer.max_steps=1", "args.trainer.val_check_interval=1",
        "args.data.init_args.num_train=8", "args.data.init_args.num_val=4", "args.data.init_args.batch_size=2",
        "+args.data.init_args.val_batch_size=4", "+args.model.init_args.sampling.max_new_tokens=4",
        "args.model.init_args.sampling.group_size=2", "args.model.init_args.optim.minibatch_size=4",
        "args.model.init_args.optim.micro_batch_size=4",
    ]  # fmt: skip


@pytest.mark.slow
def test_submitit_local_jobs_run_resume_and_report(tmp_path, tiny_model, monkeypatch):
    out = tmp_path / "sweep"
    # the first run has one cell; the second adds one (the first is skipped); the third runs nothing
    ablate(monkeypatch, *tiny_sweep(out, tiny_model, "[0]"), "hydra/launcher=submitit_local")
    first_done = (out / "grpo-seed0" / DONE_FILE).stat().st_mtime_ns
    ablate(monkeypatch, *tiny_sweep(out, tiny_model, "[0,1]"), "hydra/launcher=submitit_local")
    ablate(monkeypatch, *tiny_sweep(out, tiny_model, "[0,1]"), "hydra/launcher=submitit_local")
    assert (out / "grpo-seed0" / DONE_FILE).stat().st_mtime_ns == first_done

    records = json.loads((out / PROVENANCE_FILE).read_text())
    assert [r["cells"] for r in records] == [{"grpo-seed0": "done"}, {"grpo-seed1": "done"}]
    assert {r["launcher"] for r in records} == {"submitit_local"}
    # each cell ran in a submitit job of its own, in another process, with the cell's own command
    jobs = sorted(p.name for p in out.glob("_hydra/multirun-*/.submitit/*") if p.name.isdigit())  # the job ids
    assert len(jobs) == 2, jobs
    assert len(list(out.glob("_hydra/multirun-*/.submitit/*/*_result.pkl"))) == 2
    for seed in (0, 1):
        cell = out / f"grpo-seed{seed}"
        metrics = json.loads((cell / METRICS_FILE).read_text())
        assert metrics["optimizer_steps"] == 1 and metrics["generated_tokens"] > 0
        command = json.loads((cell / "cell.json").read_text())["command"]
        assert command[1:4] == ["-m", "grpo_lightning.cli", "fit"] and f"--seed_everything {seed}" in " ".join(command)
        assert (cell / "config.yaml").is_file()

    md = (build_report(out, tmp_path / "report", name="tiny") / "report.md").read_text()
    assert "## Final metrics" in md and "grpo (n=2)" in md


FAKE_FIT = """
# A stand-in for the fit: one scalar where the logger would write it, and its GPU and when it ran.
import os, sys, time
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

cell_dir = sys.argv[sys.argv.index("--trainer.default_root_dir") + 1]
start = time.time()
time.sleep(2.0 if sys.argv[sys.argv.index("--seed_everything") + 1] == "0" else 0.3)
writer = EventFileWriter(cell_dir)
writer.add_event(Event(step=0, wall_time=time.time(), summary=Summary(value=[Summary.Value(tag="val/accuracy", simple_value=0.5)])))
writer.close()
with open(os.path.join(cell_dir, "ran.txt"), "w") as f:
    f.write(f"{os.environ.get('CUDA_VISIBLE_DEVICES')} {os.environ.get('OMP_NUM_THREADS')} {start} {time.time()}")
"""


def test_joblib_jobs_share_the_local_slots(tmp_path, monkeypatch):
    """Four cells in joblib's worker processes, two at a time: never two on one GPU at once, even
    when a short cell frees its GPU while a long one holds the other. The fit is a stand-in script
    (the cells' ``python``): this checks the scheduling only."""
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}" + FAKE_FIT)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "sweep"
    with pytest.warns(UserWarning, match="not checked"):  # another interpreter's cells are not parsed here
        ablate(monkeypatch, f"output_dir={out}", "model=/m", "variants=[grpo,dapo]", "seeds=[0,1]",
               f"+python={fake}", "parallel=2", "gpus=[3,5]", "threads=1", "hydra/launcher=joblib")  # fmt: skip
    runs = [(out / name / "ran.txt").read_text().split() for name in ("grpo-seed0", "grpo-seed1", "dapo-seed0", "dapo-seed1")]
    assert {gpu for gpu, *_ in runs} == {"3", "5"} and {threads for _, threads, *_ in runs} == {"1"}
    for i, (gpu, _, start, end) in enumerate(runs):
        for other_gpu, _, other_start, other_end in runs[i + 1:]:
            overlap = float(start) < float(other_end) and float(other_start) < float(end)
            assert not (overlap and gpu == other_gpu), runs
    assert all((out / name / DONE_FILE).is_file() for name in ("grpo-seed0", "dapo-seed1"))
    assert json.loads((out / PROVENANCE_FILE).read_text())[0]["launcher"] == "joblib"


def test_parallel_cells_need_a_launcher_that_runs_several(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ablate(monkeypatch, f"output_dir={tmp_path / 'sweep'}", "model=/m", "parallel=2")
    assert exit_info.value.code == 2
    assert "hydra/launcher=joblib" in capsys.readouterr().err
    assert not (tmp_path / "sweep" / PROVENANCE_FILE).exists()  # nothing started


def test_a_job_that_dies_fails_its_cell(tmp_path, monkeypatch, capsys):
    """A submitit job killed mid-cell (as SLURM's time limit would): the cell counts as failed,
    the command exits 1, and the cell has no DONE, so the next run redoes it."""
    from submitit.core.core import Job

    # submitit waits this long for the result file of a finished job (for slow shared filesystems):
    # this job never writes one, and a local folder needs no wait
    monkeypatch.setattr(Job, "_results_timeout_s", 1)
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\nimport os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "sweep"
    with pytest.raises(SystemExit) as exit_info, pytest.warns(UserWarning, match="not checked"):
        ablate(monkeypatch, f"output_dir={out}", "model=/m", "variants=[grpo]", "seeds=[0]", f"+python={fake}",
               "gpus=none", "hydra/launcher=submitit_local")  # fmt: skip
    assert exit_info.value.code == 1
    assert "FAILED grpo-seed0: its job did not finish" in capsys.readouterr().err
    assert not (out / "grpo-seed0" / DONE_FILE).exists()
    assert json.loads((out / PROVENANCE_FILE).read_text())[0]["cells"] == {"grpo-seed0": "failed"}


def test_a_missing_launcher_names_the_extra(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ablate(monkeypatch, f"output_dir={tmp_path / 'sweep'}", "model=/m", "hydra/launcher=no_such_launcher")
    assert exit_info.value.code == 2
    assert "pip install 'grpo-lightning[launchers]'" in capsys.readouterr().err


def test_a_job_checks_its_cell_before_it_runs(tmp_path, monkeypatch, capsys):
    """A job's cell is checked where it runs: a hand-written ``cell=`` whose base config makes every
    arm GRPO is refused there too, and nothing starts."""
    from grpo_lightning.ablation import sweep

    monkeypatch.setattr(sweep, "launch", lambda *a, **k: pytest.fail("a cell ran"))
    base = "[configs/trainer/cpu.yaml,configs/data/arithmetic.yaml,docs/bring_your_own/config.yaml]"
    with pytest.raises(SystemExit) as exit_info:
        ablate(monkeypatch, f"output_dir={tmp_path / 'sweep'}", "model=/m", "variants=[dapo]", "seeds=[0]",
               f"base_configs={base}", "cell=dapo-seed0")  # fmt: skip
    assert exit_info.value.code == 2
    assert "sets model.class_path (grpo_lightning.variants.GRPO)" in capsys.readouterr().err
