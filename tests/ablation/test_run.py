import json
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import yaml

from grpo_lightning.ablation import provenance
from grpo_lightning.ablation import sweep as ablate
from grpo_lightning.ablation.provenance import PROVENANCE_FILE
from grpo_lightning.ablation.run import SPEC_DIR, main
from grpo_lightning.ablation.spec import SweepError, SweepSpec, cli_value, flatten, variant_config
from grpo_lightning.ablation.sweep import DONE_FILE, METRICS_FILE, cell_command, run_sweep
from grpo_lightning.report import build_report
from grpo_lightning.report.cells import discover_cells
from grpo_lightning.report.outcomes import cell_outcomes

BASE = ["configs/trainer/cpu.yaml", "configs/data/arithmetic.yaml", "configs/model/tiny.yaml"]


def spec_dict(tmp_path, **changes):
    spec = {"output_dir": str(tmp_path / "sweep"), "base_configs": BASE, "variants": ["grpo", "dr_grpo"], "seeds": [0, 1]}
    spec.update(changes)
    return spec


# ---------------------------------------------------------------------------- spec and commands


def test_flatten_and_cli_values():
    tree = {
        "model": {"kl": {"beta": [0.0, 0.04]}, "init_args": {"sampling": {"group_size": 4}}},
        "trainer.max_steps": 5,
        "data": {},
    }
    assert flatten(tree) == {
        "model.kl.beta": [0.0, 0.04],
        "model.init_args.sampling.group_size": 4,
        "trainer.max_steps": 5,
        "data": {},
    }
    assert [cli_value(v) for v in (True, None, 3, 0.5, "x", [1, 2])] == ["true", "null", "3", "0.5", "x", "[1, 2]"]


def test_cells_and_names(tmp_path):
    spec = SweepSpec.from_dict(
        spec_dict(
            tmp_path,
            seeds=[0, 1, 2],
            overrides={"model.sampling.group_size": [4, 8], "model": {"kl": {"beta": [0.0, 0.04]}}},
        )
    )
    cells = spec.cells()
    assert len(cells) == 2 * 2 * 2 * 3
    assert cells[0].name == "grpo-seed0-group_size4-beta0.0"
    assert cells[0].arm == "grpo-group_size4-beta0.0"
    assert len({c.name for c in cells}) == len(cells)
    assert {c.arm for c in cells if c.variant == "dr_grpo" and dict(c.overrides)["model.kl.beta"] == 0.04} == {
        "dr_grpo-group_size4-beta0.04",
        "dr_grpo-group_size8-beta0.04",
    }
    # the same last key component on two axes: longer names
    ambiguous = SweepSpec.from_dict(
        spec_dict(tmp_path, overrides={"model.init_args.batch_size": [1], "data.init_args.batch_size": [2]})
    )
    assert ambiguous.cells()[0].name == "grpo-seed0-model_batch_size1-data_batch_size2"
    # a single variant / seed (what Hydra multirun sets)
    single = SweepSpec.from_dict(spec_dict(tmp_path, variant="dapo", seed=2))
    assert [c.name for c in single.cells()] == ["dapo-seed2"]


def test_spec_errors(tmp_path):
    with pytest.raises(SweepError, match="unknown sweep spec keys"):
        SweepSpec.from_dict(spec_dict(tmp_path, variantz=["grpo"]))
    with pytest.raises(SweepError, match="output_dir"):
        SweepSpec.from_dict({**spec_dict(tmp_path), "output_dir": None})
    with pytest.raises(SweepError, match="base_configs"):
        SweepSpec.from_dict(spec_dict(tmp_path, base_configs=["configs/nope.yaml"]))
    with pytest.raises(SweepError, match="no configs/variant/grpoo.yaml"):
        run_sweep(spec_dict(tmp_path, variants=["grpoo"]))
    assert not (tmp_path / "sweep").exists()  # nothing started
    with pytest.raises(SweepError, match="same directory name"):
        SweepSpec.from_dict(spec_dict(tmp_path, overrides={"model.x": ["a b", "a_b"]})).cells()


def test_cell_command_uses_the_shared_yaml(tmp_path):
    spec = SweepSpec.from_dict(
        spec_dict(tmp_path, args={"trainer": {"max_steps": 3}}, overrides={"model.kl.beta": [0.0]}, model="/m")
    )
    cell = spec.cells()[0]
    command = cell_command(spec, cell, tmp_path / "cell", "/m")
    assert command[1:4] == ["-m", "grpo_lightning.cli", "fit"]
    configs = [command[i + 1] for i, arg in enumerate(command) if arg == "--config"]
    # the variant first: init_args given before its class_path would bring the base class defaults
    assert [c.split("configs/")[-1] for c in configs] == [
        "variant/grpo.yaml", "trainer/cpu.yaml", "data/arithmetic.yaml", "model/tiny.yaml"
    ]  # fmt: skip
    text = " ".join(command)
    assert "--seed_everything 0 " in text
    assert f"--trainer.logger.init_args.save_dir {tmp_path / 'cell'} " in text
    assert "--model.model /m" in text
    assert text.endswith("--trainer.max_steps 3 --model.kl.beta 0.0")
    assert "--validate_before_fit" not in command  # every fit validates before training by default
    assert "--completions.jsonl true --trainer.max_steps 3" in text  # the report shows some; args come after
    unvalidated = SweepSpec.from_dict(spec_dict(tmp_path, validate_before_training=False))
    no_validation = cell_command(unvalidated, unvalidated.cells()[0], tmp_path / "cell", "/m")
    assert no_validation[no_validation.index("--validate_before_fit") + 1] == "false"


def test_the_config_axis_adds_yaml_files_after_the_shared_ones(tmp_path):
    axis = [None, "schedules/cosine_kl.yaml", ["rewards/r1.yaml", "rollout/beam_search.yaml"]]
    spec = SweepSpec.from_dict(spec_dict(tmp_path, overrides={"config": axis, "model.kl.beta": [0.0]}))
    cells = spec.cells()
    arms = ["grpo-beta0.0", "grpo+cosine_kl-beta0.0", "grpo+r1+beam_search-beta0.0"]
    assert list(dict.fromkeys(c.arm for c in cells)) == arms + [arm.replace("grpo", "dr_grpo") for arm in arms]
    cell = next(c for c in cells if c.name == "grpo+r1+beam_search-seed0-beta0.0")
    command = cell_command(spec, cell, tmp_path / "cell", None)
    configs = [command[i + 1].split("configs/")[-1] for i, arg in enumerate(command) if arg == "--config"]
    assert configs == ["variant/grpo.yaml", "trainer/cpu.yaml", "data/arithmetic.yaml", "model/tiny.yaml",
                       "rewards/r1.yaml", "rollout/beam_search.yaml"]
    assert "--model.kl.beta" in command and not any(
        arg.startswith("--config=") or arg == "--config.0" for arg in command
    )
    with pytest.raises(SweepError, match="overrides.config: .*missing.yaml"):
        SweepSpec.from_dict(spec_dict(tmp_path, overrides={"config": ["missing.yaml"]}))


def test_hydra_configs_compose():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(SPEC_DIR), version_base="1.3"):
        default = SweepSpec.from_dict(compose("default"))
        smoke = SweepSpec.from_dict(compose("smoke", overrides=["+overrides.model.kl.beta=[0.0,0.04]", "parallel=2"]))
    assert default.variants == ["grpo", "dr_grpo", "dapo", "rloo", "gspo"] and default.seeds == [0, 1, 2, 3, 4]
    assert default.model == "warmstart" and default.output_dir.name == "default"
    assert [p.name for p in default.base_configs] == ["cpu.yaml", "arithmetic.yaml", "tiny.yaml"]
    assert len(default.cells()) == 25 and default.baseline_arm() == "grpo"
    assert smoke.variants == ["grpo", "dapo"] and smoke.seeds == [0, 1] and smoke.parallel == 2
    assert smoke.args["trainer.max_steps"] == 12 and smoke.args["trainer.val_check_interval"] == 6
    # several optimizer steps per rollout, so that the clip ranges the variants differ in act
    data = yaml.safe_load((SPEC_DIR.parent / "data" / "arithmetic.yaml").read_text())["data"]["init_args"]
    model = yaml.safe_load((SPEC_DIR.parent / "model" / "tiny.yaml").read_text())["model"]["init_args"]
    rollout = data["batch_size"] * model["sampling"]["group_size"]  # completions per rollout
    assert default.args["model.init_args.optim.minibatch_size"] in (rollout // 4, rollout // 2)
    assert rollout % default.args["model.init_args.optim.minibatch_size"] == 0
    assert (
        smoke.args["model.init_args.optim.minibatch_size"] * 2 == 4 * smoke.args["model.init_args.sampling.group_size"]
    )
    assert smoke.overrides == {"model.kl.beta": [0.0, 0.04]}
    assert smoke.output_dir.parts[-3:] == ("runs", "ablation", "smoke")


@pytest.mark.parametrize("name", sorted(p.stem for p in SPEC_DIR.glob("*.yaml")))
def test_every_shipped_sweep_composes_and_names_existing_configs(name):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(SPEC_DIR), version_base="1.3"):
        spec = SweepSpec.from_dict(compose(name))  # every variant and config file resolves, or SweepError
    cells = spec.cells()
    assert cells and all(variant_config(c.variant).is_file() for c in cells)
    if name == "grpo_options":
        assert sorted({c.arm for c in cells}) == ["grpo", "grpo+beam_search", "grpo+cosine_kl", "grpo+majority_vote", "grpo+r1"]


def test_warmstart_model_is_resolved_once(tmp_path, monkeypatch):
    calls = []
    stub = types.ModuleType("grpo_lightning.quickstart.warmstart")
    stub.warm_start = lambda **kw: calls.append(kw) or tmp_path / "ws"
    monkeypatch.setitem(sys.modules, "grpo_lightning.quickstart.warmstart", stub)
    spec = spec_dict(tmp_path, model="warmstart", warmstart={"steps": 5}, seeds=[0, 1], parallel=2)
    monkeypatch.setattr(ablate, "launch", fake_fit())
    results = run_sweep(spec)
    assert calls == [{"steps": 5}] and len(results) == 4
    command = json.loads((tmp_path / "sweep" / "grpo-seed0" / "cell.json").read_text())["command"]
    assert command[command.index("--model.model") + 1] == str(tmp_path / "ws")
    assert run_sweep(spec) and calls == [{"steps": 5}]  # nothing left to run: not resolved again


# ---------------------------------------------------------------------------- running, without real fits


def fake_fit(fail=()):
    """A stand-in for the fit subprocess: writes a few scalars where the logger would."""
    from torch.utils.tensorboard import SummaryWriter

    seen = []
    running: dict[str, int] = {}
    lock = threading.Lock()

    def launch(command, log, env, timeout_s=None):
        save_dir = command[command.index("--trainer.logger.init_args.save_dir") + 1]
        device = (env or {}).get("CUDA_VISIBLE_DEVICES")
        with lock:
            assert device is None or device not in running.values(), "two running cells on one GPU"
            running[save_dir] = device
            seen.append((save_dir, device))
        time.sleep(0.05)
        writer = SummaryWriter(log_dir=save_dir)
        for step in range(2):
            writer.add_scalar("perf/step_s", 0.5, step)
            writer.add_scalar("perf/generated_tokens", 10.0 * (step + 1), step)
            writer.add_scalar("perf/flops", 1e6 * (step + 1), step)
            writer.add_scalar("val/accuracy", 0.25 * step, step)
        writer.close()
        with lock:
            del running[save_dir]
        return 1 if any(name in save_dir for name in fail) else 0

    launch.seen = seen
    return launch


class StoppedBeforeReturning:
    """A launcher that returns its results all at once, as joblib's does, stopped (the sweep's deadline) after
    its first cell finished and before it returned any."""

    local, name, in_this_process = True, "joblib", False

    def __call__(self, spec, cells):
        (spec.output_dir / cells[0].name).mkdir(parents=True)
        (spec.output_dir / cells[0].name / DONE_FILE).write_text("")
        raise KeyboardInterrupt
        yield  # a generator, as a launcher is


def test_a_stopped_run_records_the_cells_it_finished_as_done(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec_dict(tmp_path, seeds=[0], model="/m"), StoppedBeforeReturning())
    (record,) = json.loads((tmp_path / "sweep" / PROVENANCE_FILE).read_text())
    assert record["cells"] == {"grpo-seed0": "done", "dr_grpo-seed0": "not finished"}


def test_parallel_gpus_round_robin_and_failures(tmp_path, monkeypatch):
    launch = fake_fit(fail=("dr_grpo-seed1",))
    monkeypatch.setattr(ablate, "launch", launch)
    spec = spec_dict(tmp_path, seeds=[0, 1, 2], parallel=2, gpus=["3", "5"], model="/m")
    results = run_sweep(spec)
    assert [r.status for r in results] == ["done"] * 4 + ["failed", "done"]
    assert {device for _, device in launch.seen} == {"3", "5"}
    failed = tmp_path / "sweep" / "dr_grpo-seed1"
    assert not (failed / DONE_FILE).exists() and "exit status 1" in results[4].message
    metrics = json.loads((tmp_path / "sweep" / "grpo-seed0" / METRICS_FILE).read_text())
    assert metrics["final"]["val/accuracy"] == 0.25 and metrics["generated_tokens"] == 20.0
    assert metrics["training_flops"] == 2e6

    launch = fake_fit()
    monkeypatch.setattr(ablate, "launch", launch)
    results = run_sweep(spec)
    assert [r.status for r in results] == ["skipped"] * 4 + ["done", "skipped"]
    assert [save_dir for save_dir, _ in launch.seen] == [str(failed)]

    # one provenance record per run of the sweep that started cells
    first, second = json.loads((tmp_path / "sweep" / PROVENANCE_FILE).read_text())
    assert first["parallel"] == 2 and first["devices"] == ["3", "5"] and first["cells"]["dr_grpo-seed1"] == "failed"
    assert len(first["cells"]) == 6 and second["cells"] == {"dr_grpo-seed1": "done"}
    run_sweep(spec)  # nothing to run: no record
    assert len(json.loads((tmp_path / "sweep" / PROVENANCE_FILE).read_text())) == 2


def test_each_cell_records_its_code_and_the_sweep_warns_where_it_changed(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(ablate, "launch", fake_fit())
    spec = spec_dict(tmp_path, model="/m")
    run_sweep(spec)
    code = json.loads((tmp_path / "sweep" / "grpo-seed0" / "cell.json").read_text())["code"]
    assert code["source_sha256"] == provenance.source_digest() and len(code["source_sha256"]) == 16
    assert json.loads((tmp_path / "sweep" / PROVENANCE_FILE).read_text())[0]["source_sha256"] == code["source_sha256"]
    assert "versions of the library's code" not in caplog.text

    # the checkout is edited while the sweep runs: cells from the third on start from other code
    states = iter(["a" * 16] * 3 + ["b" * 16] * 2)  # the sweep's record, then each cell
    monkeypatch.setattr(provenance, "source_digest", lambda roots=None: next(states))
    run_sweep(spec_dict(tmp_path, output_dir=str(tmp_path / "edited"), model="/m"))
    assert (f"the cells ran 2 versions of the library's code (source digests: {'a' * 16}: grpo-seed0, grpo-seed1; "
            f"{'b' * 16}: dr_grpo-seed0, dr_grpo-seed1)") in caplog.text  # fmt: skip


def test_every_cell_runs_under_one_hash_seed_unless_the_sweep_set_one(monkeypatch):
    """Data whose order follows Python's hash seed (some reasoning-gym tasks) is the same in every cell."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert ablate.cell_environment({"CUDA_VISIBLE_DEVICES": "1"})["PYTHONHASHSEED"] == "0"
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert ablate.cell_environment()["PYTHONHASHSEED"] == "7"


def test_the_source_digest_follows_every_python_file_and_only_those(tmp_path):
    package, variants = tmp_path / "grpo_lightning", tmp_path / "variants"
    for folder in (package, variants, package / "__pycache__"):
        folder.mkdir()
    (package / "loss.py").write_text("beta = 0.04\n")
    (variants / "dapo.py").write_text("clip = 0.28\n")
    first = provenance.source_digest([package, variants])
    (package / "__pycache__" / "loss.cpython-311.py").write_text("cached")
    (package / "notes.txt").write_text("not code")
    assert provenance.source_digest([package, variants]) == first
    (variants / "dapo.py").write_text("clip = 0.2\n")
    assert provenance.source_digest([package, variants]) != first
    (variants / "dapo.py").write_text("clip = 0.28\n")
    (variants / "dapo.py").rename(variants / "dapo2.py")  # a renamed file is other code
    assert provenance.source_digest([package, variants]) != first
    assert provenance.source_roots()[0] == Path(provenance.__file__).resolve().parents[1]


def test_the_baseline_arm_and_five_seeds_by_default(tmp_path):
    spec = {"output_dir": str(tmp_path / "sweep"), "base_configs": BASE, "variants": ["grpo", "dapo"]}
    default = SweepSpec.from_dict(spec)
    assert default.seeds == [0, 1, 2, 3, 4]
    assert default.baseline_arm() == "grpo"  # the first arm
    assert SweepSpec.from_dict({**spec, "baseline": "dapo"}).baseline_arm() == "dapo"
    with pytest.raises(SweepError, match="baseline: 'ppo' is not an arm of the sweep; give one of"):
        SweepSpec.from_dict({**spec, "baseline": "ppo"})
    # a job of `-m variant=grpo,dapo` runs one variant; the baseline is the whole sweep's, the same in every job
    assert SweepSpec.from_dict({**spec, "variant": "dapo"}).baseline_arm() == "grpo"
    assert SweepSpec.from_dict({**spec, "variant": "dapo", "baseline": "grpo"}).baseline_arm() == "grpo"


def test_provenance_records_the_uncommitted_diff(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)  # fmt: skip

    git("init", "-q")
    (tmp_path / "loss.py").write_text("beta = 0.04\n")
    (tmp_path / ".gitignore").write_text("*.log\n")
    git("add", "loss.py", ".gitignore")
    git("commit", "-q", "-m", "first")
    (tmp_path / "train.log").write_text("ignored\n")
    assert provenance.git_commit(tmp_path)["dirty"] is False and provenance.git_commit(tmp_path)["diff"] == ""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.yaml").write_text("beta: 0.0\n")  # untracked, not ignored: the tree is dirty
    record = provenance.git_commit(tmp_path)
    assert record["dirty"] is True and record["untracked"] == ["configs/mine.yaml"]
    (tmp_path / "loss.py").write_text("beta = 0.0\n")
    record = provenance.git_commit(tmp_path)
    assert record["dirty"] is True and "-beta = 0.04" in record["diff"] and "+beta = 0.0" in record["diff"]
    git("add", "loss.py")
    git("commit", "-q", "-m", "second")
    (tmp_path / "results.csv").write_text("step,accuracy\n" * 10_000)
    git("add", "results.csv")
    git("commit", "-q", "-m", "results")
    (tmp_path / "results.csv").unlink()  # a deleted file is named, its text (in the commit) is not repeated
    record = provenance.git_commit(tmp_path)
    assert record["dirty"] is True and record["deleted"] == ["results.csv"] and record["diff"] == ""
    assert record["untracked"] == ["configs/mine.yaml"]


def test_deleted_files_are_summarised_by_the_folders_left_empty():
    tracked = ["README.md", "reports/a/data/1.json", "reports/a/data/2.json", "reports/a/report.md",
               "reports/b/report.md", "src/x.py", "src/y.py", "top.txt"]  # fmt: skip
    deleted = ["reports/a/data/1.json", "reports/a/data/2.json", "reports/a/report.md", "src/y.py", "top.txt"]
    assert provenance.deleted_folders(deleted, tracked) == ["reports/a/", "src/y.py", "top.txt"]
    assert provenance.deleted_folders(deleted + ["reports/b/report.md"], tracked) == ["reports/", "src/y.py", "top.txt"]
    assert provenance.deleted_folders([], tracked) == []


def test_provenance_record():
    record = provenance.finish_record(provenance.start_record(1, None, []), provenance.LoadMonitor(), {"a": "done"})
    assert set(record["packages"]) == {"grpo-lightning", "torch", "transformers", "lightning"}
    assert record["packages"]["torch"]  # installed here
    assert record["machine"]["cores"] >= 1 and isinstance(record["machine"]["gpus"], list)
    assert record["commit"] is None or len(record["commit"]) == 40
    assert len(record["load_start"]) == 3 and record["started"] <= record["finished"]
    with provenance.LoadMonitor(interval_s=0.01) as monitor:
        time.sleep(0.05)
    assert monitor.peak is not None and monitor.peak >= 0


def test_threads_per_cell(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(ablate.os, "cpu_count", lambda: 8)
    assert ablate._threads_per_cell("auto", 4, on_gpus=False) == 2
    assert ablate._threads_per_cell("auto", 16, on_gpus=False) == 1
    assert ablate._threads_per_cell("auto", 1, on_gpus=False) is None
    assert ablate._threads_per_cell("auto", 4, on_gpus=True) is None
    assert ablate._threads_per_cell(3, 1, on_gpus=False) == 3
    assert ablate._threads_per_cell(None, 4, on_gpus=False) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert ablate._threads_per_cell("auto", 4, on_gpus=False) is None


def test_finished_cells_with_other_settings_stop_the_sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate, "launch", fake_fit())
    run_sweep(spec_dict(tmp_path, args={"trainer.max_steps": 2}, model="/m"))
    with pytest.raises(SweepError, match="other settings"):
        run_sweep(spec_dict(tmp_path, args={"trainer.max_steps": 3}, model="/m"))
    # the same settings written the other way round resume
    results = run_sweep(spec_dict(tmp_path, args={"trainer": {"max_steps": 2}}, parallel=2, model="/m"))
    assert {r.status for r in results} == {"skipped"}


def test_finished_cells_whose_config_files_were_edited_stop_the_sweep(tmp_path, monkeypatch):
    """A config file is a setting by its content, not its name alone: an edited base config (or variant
    file) under the same path is another design. Records without the digests (earlier versions)
    compare by path, as they did."""
    monkeypatch.setattr(ablate, "launch", fake_fit())
    shared = tmp_path / "shared.yaml"
    shared.write_text("trainer:\n  max_steps: 2\n")
    run_sweep(spec_dict(tmp_path, base_configs=[*BASE, str(shared)], model="/m"))
    assert {r.status for r in run_sweep(spec_dict(tmp_path, base_configs=[*BASE, str(shared)], model="/m"))} == {"skipped"}
    shared.write_text("trainer:\n  max_steps: 3\n")
    with pytest.raises(SweepError, match="other settings"):
        run_sweep(spec_dict(tmp_path, base_configs=[*BASE, str(shared)], model="/m"))

    for cell_json in (tmp_path / "sweep").glob("*/cell.json"):  # as an earlier version recorded them
        record = json.loads(cell_json.read_text())
        del record["settings"]["base_configs_sha256"], record["settings"]["variant_config_sha256"]
        cell_json.write_text(json.dumps(record))
    assert {r.status for r in run_sweep(spec_dict(tmp_path, base_configs=[*BASE, str(shared)], model="/m"))} == {"skipped"}


def test_finished_cells_resume_from_another_checkout_of_the_tree(tmp_path, monkeypatch):
    """Cells record their config files relative to the shipped configs, not where this checkout
    lies; records with this checkout's absolute paths (as earlier versions wrote them) still match."""
    monkeypatch.setattr(ablate, "launch", fake_fit())
    run_sweep(spec_dict(tmp_path, model="/m"))
    spec = SweepSpec.from_dict(spec_dict(tmp_path, model="/m"))
    cell_json = tmp_path / "sweep" / spec.cells()[0].name / "cell.json"
    record = json.loads(cell_json.read_text())
    assert record["settings"]["variant_config"] == "configs/variant/grpo.yaml"
    assert record["settings"]["base_configs"] == BASE
    record["settings"]["variant_config"] = str(variant_config("grpo"))
    record["settings"]["base_configs"] = [str(p) for p in spec.base_configs]
    cell_json.write_text(json.dumps(record))
    assert {r.status for r in run_sweep(spec_dict(tmp_path, model="/m"))} == {"skipped"}


def test_variant_as_a_yaml_path(tmp_path):
    spec = SweepSpec.from_dict(spec_dict(tmp_path, variants=["configs/variant/gspo.yaml"], seeds=[4]))
    assert [c.name for c in spec.cells()] == ["gspo-seed4"]
    assert "--config" in cell_command(spec, spec.cells()[0], tmp_path, None)


def test_cli_exits_nonzero_on_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate, "launch", fake_fit(fail=("grpo-seed0",)))
    monkeypatch.setattr(sys, "argv", ["grpo-lightning-ablate", f"output_dir={tmp_path / 'sweep'}", "model=/m",
                                      "variants=[grpo]", "seeds=[0]"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1


# ---------------------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config

    tokenizer = build_char_tokenizer()
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, intermediate_size=64)
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", tokenizer, config)


def hydra_args(out, model):
    return [
        f"output_dir={out}",
        f"model={model}",
        "variants=[grpo,dr_grpo]",
        "seeds=[0,1]",
        "gpus=none",
        "threads=1",
        "args.trainer.max_steps=2",
        "args.trainer.val_check_interval=1",
        "args.data.init_args.num_train=32",
        "args.data.init_args.num_val=8",
        "args.data.init_args.batch_size=2",
        "+args.data.init_args.val_batch_size=8",
        "+args.model.init_args.sampling.max_new_tokens=8",
        "args.model.init_args.optim.minibatch_size=4",  # one optimizer step per rollout of 2 prompts x 2
        "args.model.init_args.optim.micro_batch_size=4",
        "+overrides.model.sampling.group_size=[2]",
    ]


def test_sweep_resume_and_report(tmp_path, tiny_model, monkeypatch, capsys):
    out = tmp_path / "sweep"
    names = ["grpo-seed0-group_size2", "grpo-seed1-group_size2", "dr_grpo-seed0-group_size2", "dr_grpo-seed1-group_size2"]
    # left over from an interrupted run: no DONE marker, partial files
    interrupted = out / names[3]
    interrupted.mkdir(parents=True)
    (interrupted / "cell.json").write_text("{}")
    (interrupted / "partial.txt").write_text("left over")

    launches = []
    real_launch = ablate.launch
    monkeypatch.setattr(ablate, "launch", lambda command, *a: launches.append(command) or real_launch(command, *a))
    argv = ["grpo-lightning-ablate", "--config-name", "smoke", *hydra_args(out, tiny_model)]
    monkeypatch.setattr(sys, "argv", argv)
    main()

    printed = capsys.readouterr().out
    assert f"sweep smoke: 4 cells, 4 to run, in {out}; first each cell's settings are checked" in printed
    arms_and_seeds = [("grpo-group_size2", 0), ("grpo-group_size2", 1), ("dr_grpo-group_size2", 0), ("dr_grpo-group_size2", 1)]
    for number, (name, (arm, seed)) in enumerate(zip(names, arms_and_seeds), 1):  # each cell's start, as it is launched
        assert f"cell {number}/4: {arm}, seed {seed}, starting; its log: {out / name / 'train.log'}" in printed
    assert len(launches) == 4
    assert not (interrupted / "partial.txt").exists()
    for name in names:
        cell = out / name
        assert (cell / DONE_FILE).is_file() and (cell / "config.yaml").is_file(), (cell / "train.log").read_text()[-2000:]
        assert list(cell.glob("events.out.tfevents.*"))
        metrics = json.loads((cell / METRICS_FILE).read_text())
        assert metrics["val/accuracy_before"] is not None  # the validation before training ran
        assert metrics["generated_tokens"] > 0 and metrics["wall_time_s"] > 0
        assert metrics["final_step"]["reward"] == 2 and "val/accuracy" in metrics["final"]  # optimizer steps
        assert metrics["optimizer_steps"] == 2 and metrics["rollouts"] == 2 and metrics["generation_batches"] == 2
        assert json.loads((cell / "completions.jsonl").read_text().splitlines()[0])["step"] == 0
        assert sorted(p.name for p in (cell / "outcomes").iterdir()) == [f"val-step00000{i}.csv.gz" for i in range(3)]
        record = json.loads((cell / "cell.json").read_text())
        assert record["overrides"] == {"model.sampling.group_size": 2} and record["seed"] == int(
            name.split("seed")[1][0]
        )
    saved = (out / names[0] / "config.yaml").read_text()
    assert (
        yaml.safe_load(saved)["model"]["init_args"]["sampling"]["group_size"] == 2
        and "max_steps: 2" in saved
        and "validate_before_fit: true" in saved
    )

    # run again, then as a Hydra multirun (one job per cell): every cell is done, nothing starts
    marks = {name: (out / name / DONE_FILE).stat().st_mtime_ns for name in names}
    monkeypatch.setattr(ablate, "launch", lambda *a: pytest.fail("a finished cell was started again"))
    main()
    multirun = ["grpo-lightning-ablate", "-m", "--config-name", "smoke", *hydra_args(out, tiny_model),
                "variant=grpo,dr_grpo", "seed=0,1"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", multirun)
    main()
    assert {name: (out / name / DONE_FILE).stat().st_mtime_ns for name in names} == marks

    assert [r["cells"] for r in json.loads((out / PROVENANCE_FILE).read_text())] == [dict.fromkeys(names, "done")]
    target = build_report(out, tmp_path / "reports" / "tiny", name="tiny")
    md = (target / "report.md").read_text()
    for section in ["## Summary", "## Runs", "## Configuration", "## Final metrics",
                    "## Effects against the baseline (grpo-group_size2)", "## Learning curves"]:  # fmt: skip
        assert section in md
    assert json.loads((out / names[0] / "cell.json").read_text())["baseline"] == "grpo-group_size2"
    assert (target / "data" / names[0] / "scalars.csv.gz").is_file() and (target / "REGENERATE").is_file()
    outcomes = cell_outcomes(discover_cells(target / "data"))  # the same 8 prompts in every cell, by index
    assert sorted(outcomes) == sorted(names)
    assert all(o.step == 2 and o.prompt.tolist() == list(range(8)) for o in outcomes.values())
    assert "| grpo-group_size2 (n=2) | dr_grpo-group_size2 (n=2) |" in md
    assert "| `model.class_path` | grpo_lightning.variants.GRPO | grpo_lightning.variants.DrGRPO |" in md
    assert "| `model.init_args.kl.beta` | 0.04 | 0.0 |" in md  # each variant keeps its own defaults
    assert "val/accuracy before training" in md
    assert (target / "curves_val_accuracy.png").is_file() and (target / "report.html").is_file()


def test_an_abbreviated_hydra_option_is_refused_naming_the_full_one(capsys):
    from grpo_lightning.ablation.run import refuse_abbreviations

    with pytest.raises(SystemExit) as done:
        refuse_abbreviations(["--config-n", "smoke", "seed=0,1"])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --config-n: no such option; did you mean --config-name?"


def test_cells_sharing_a_card_each_get_a_part_of_its_memory(tmp_path, monkeypatch):
    from grpo_lightning.ablation.sweep import MEMORY_FRACTION_ENV, local_slot
    from grpo_lightning.cli import app

    shared = SweepSpec.from_dict(spec_dict(tmp_path / "a", parallel=4, gpus=["0"], model="/m"))
    with local_slot(shared, 0) as env:
        assert env == {"CUDA_VISIBLE_DEVICES": "0", MEMORY_FRACTION_ENV: "0.2375"}  # (1 - 0.05) / 4
    one_each = SweepSpec.from_dict(spec_dict(tmp_path / "b", parallel=2, gpus=["0", "1"], model="/m"))
    with local_slot(one_each, 1) as env:
        assert env == {"CUDA_VISIBLE_DEVICES": "1"}
    # The cell's side: no GPU here, so torch.cuda's two calls are replaced (and recorded).
    calls = []
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.set_per_process_memory_fraction", lambda share: calls.append(share))
    monkeypatch.setenv(MEMORY_FRACTION_ENV, "0.2375")
    app.cap_cuda_memory()
    monkeypatch.delenv(MEMORY_FRACTION_ENV)
    app.cap_cuda_memory()
    assert calls == [0.2375]
