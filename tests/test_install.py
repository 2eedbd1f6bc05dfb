"""The shipped configs: found by name, and installed with the package.

The end-to-end test installs the project (not editable) into a fresh virtual environment that
reuses this interpreter's packages, then runs every console script from an empty folder.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from grpo_lightning.cli.resources import config_dir, config_path, resolve_config, resolve_config_args, shipped_config

REPO = Path(__file__).resolve().parents[1]
#: What a build of the project reads.
SOURCES = ["pyproject.toml", "setup.py", "README.md", "grpo_lightning", "variants", "configs"]


def test_shipped_configs_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cpu = config_dir() / "trainer" / "cpu.yaml"
    assert cpu.is_file()
    assert shipped_config("configs/trainer/cpu.yaml") == shipped_config("trainer/cpu.yaml") == shipped_config("trainer/cpu") == cpu
    assert shipped_config("trainer/nope") is None and shipped_config("../configs/trainer/cpu.yaml") is None
    with pytest.raises(FileNotFoundError, match="trainer/cpu.yaml"):
        config_path("trainer/nope")
    own = tmp_path / "configs" / "trainer" / "cpu.yaml"  # a file in the working directory wins
    own.parent.mkdir(parents=True)
    own.write_text("trainer: {}\n")
    assert resolve_config("configs/trainer/cpu.yaml") == own
    assert resolve_config("trainer/gpu") == config_dir() / "trainer" / "gpu.yaml"


def test_config_arguments_resolve_shipped_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", "variant/dapo", "-c=configs/data/arithmetic.yaml", "--config", "mine.yaml", "--model.model", "trainer/cpu"]
    assert resolve_config_args(args) == [
        "fit", "--config", str(config_dir() / "variant/dapo.yaml"), f"-c={config_dir() / 'data/arithmetic.yaml'}",
        "--config", "mine.yaml", "--model.model", "trainer/cpu",
    ]  # fmt: skip


def test_the_cli_takes_shipped_config_names(tmp_path, monkeypatch, capsys):
    from grpo_lightning.cli.app import main

    monkeypatch.chdir(tmp_path)
    names = ["configs/trainer/cpu.yaml", "data/arithmetic", "variant/rloo", "model/tiny"]
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", "fit", *(a for n in names for a in ("--config", n)), "--model.model", "m", "--print_config"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    assert "class_path: grpo_lightning.variants.RLOO" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "name of a shipped config" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------------------- a real install


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed ({done.returncode}):\n{output[-4000:]}"
    return output


def virtual_environment(root: Path, *install: str) -> tuple[Path, dict[str, str]]:
    """A virtual environment in ``root`` with the project installed (``pip install *install SOURCE``)
    from a copy of its sources; its ``python``, and the environment variables that put its scripts
    first on PATH."""
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The dependencies come from this interpreter's environment (a virtual environment is not
    # the "system" of a new one): its site-packages go on the new one's path, after its own.
    new_site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    on_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    ours = [*site.getsitepackages(), sysconfig.get_path("purelib"), *on_path]  # PYTHONPATH: dependencies put there
    (new_site / "zz_test_dependencies.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--no-index", *install, str(source)], root, dict(os.environ))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        GRPO_LIGHTNING_CACHE=str(root / "cache"),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
    )
    return python, env


#: What an installed environment holds of the project: its top-level names, where the presets load from,
#: and whether a top-level ``variants`` imports (another project's name on the package index).
INSTALLED = """
import importlib.metadata, importlib.util
import grpo_lightning.variants as presets
files = importlib.metadata.files("grpo-lightning")
print(*sorted({f.parts[0] for f in files if f.parts[0] != ".." and not f.parts[0].endswith(".dist-info")}))
print(presets.DAPO.__module__, presets.__file__, importlib.util.find_spec("variants"))
"""


def installed_state(python: Path, cwd: Path, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """:data:`INSTALLED`'s lines, as words: the top-level names; the module of DAPO, the presets'
    ``__init__.py`` and what a top-level ``variants`` is."""
    top_level, presets = run([str(python), "-c", INSTALLED], cwd, env).splitlines()
    return top_level.split(), presets.split()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """A virtual environment with the project installed from a copy of its sources; returns the
    environment variables that put its scripts first on PATH."""
    root = tmp_path_factory.mktemp("install")
    python, env = virtual_environment(root)
    venv = python.parent.parent
    where = run([str(python), "-c", "import grpo_lightning.cli.resources as r; print(r.__file__); print(r.config_dir())"], root, env)
    module, configs = where.split()[:2]
    assert Path(module).is_relative_to(venv) and Path(configs).is_relative_to(venv), where  # not the checkout
    top_level, (preset_module, presets, other) = installed_state(python, root, env)
    assert top_level == ["grpo_lightning"]  # the presets and the configs are inside the package
    assert preset_module == "grpo_lightning.variants.dapo" and Path(presets).is_relative_to(venv) and other == "None"
    return env


def test_an_editable_install_has_the_presets_inside_the_package_as_the_checkouts_folder(tmp_path):
    """``pip install -e .``, as CI installs: from another folder, ``grpo_lightning.variants`` is the
    checkout's ``variants/`` and no top-level ``variants`` imports."""
    python, env = virtual_environment(tmp_path, "--editable")
    (tmp_path / "elsewhere").mkdir()
    _, presets = installed_state(python, tmp_path / "elsewhere", env)
    assert presets == ["grpo_lightning.variants.dapo", str(tmp_path / "source" / "variants" / "__init__.py"), "None"]


@pytest.mark.slow
def test_console_scripts_from_an_empty_folder(installed, tmp_path):
    env = installed
    out = run(["grpo-lightning-quickstart", "--warmstart-steps", "10", "--trainer.max_steps", "2"], tmp_path, env)
    assert "validation accuracy (grpo): warm start" in out
    summary = json.loads(next(tmp_path.glob("runs/quickstart/version_*/quickstart.json")).read_text())
    assert summary["optimizer_steps"] == 2
    assert "after RL, 8 samples per problem at T=1" in out and 0 <= summary["pass@1"] <= summary["pass@8"] <= 1
    (model_dir,) = Path(env["GRPO_LIGHTNING_CACHE"]).glob("warmstart-*")

    # the smoke sweep, one seed, without DAPO (whose dynamic sampling waits for groups with
    # different rewards, rare from this weak start model), one rollout of two optimizer steps a
    # cell (what is tested is the path through the installed scripts, not learning); the warm
    # start comes from the cache
    sweep = ["grpo-lightning-ablate", "--config-name", "smoke", "variants=[grpo,dr_grpo]", "seeds=[0]", "+warmstart.steps=10",
             "args.trainer.max_steps=2", "args.trainer.val_check_interval=2", "timeout_s=240"]  # fmt: skip
    out = run(sweep, tmp_path, env)
    assert "sweep smoke: 2 done, 0 skipped, 0 failed" in out
    assert len(list(Path(env["GRPO_LIGHTNING_CACHE"]).glob("warmstart-*"))) == 1
    run(["grpo-lightning-report", "runs/ablation/smoke", "--output", "reports/smoke"], tmp_path, env)
    assert "**dr_grpo**" in (tmp_path / "reports" / "smoke" / "report.md").read_text()

    # shipped configs by name, as in the README (configs/...) or short
    run([
        "grpo-lightning", "fit", "--config", "configs/trainer/cpu.yaml", "--config", "data/arithmetic",
        "--config", "variant/dapo", "--config", "model/tiny", "--model.model", str(model_dir),
        "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", "fit",
        "--trainer.logger.init_args.save_dir", "fit",
    ], tmp_path, env)  # fmt: skip
    saved = next((tmp_path / "fit").rglob("config.yaml")).read_text()
    assert "grpo_lightning.variants.DAPO" in saved
    assert not (tmp_path / "configs").exists()


def test_the_quickstart_needs_none_of_the_test_extra(tmp_path):
    """The README's quickstart installs the package alone: with pytest, hypothesis and triton (the
    ``test`` extra's) unimportable, the quickstart's modules import and its fit's configs resolve
    (in a fresh interpreter, where none of them is loaded yet)."""
    code = """
import sys
sys.modules.update(dict.fromkeys(("pytest", "hypothesis", "triton")))  # None: importing one fails
from grpo_lightning.quickstart import quickstart_args, warmstart, accuracy
from grpo_lightning.cli.app import GRPOLightningCLI
try:
    GRPOLightningCLI(args=["fit", *quickstart_args("some/model"), "--print_config"])
except SystemExit as done:
    assert done.code == 0, done.code
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(REPO)}
    out = run([sys.executable, "-c", code], tmp_path, env)
    assert "class_path: grpo_lightning.variants.GRPO" in out
