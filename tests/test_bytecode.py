"""An entry point gives a process told not to write bytecode, where torch has none, a cache of its
own; importing the package changes nothing: each case is a new interpreter, as a console script starts one."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys

REPORT = "print(sys.pycache_prefix); print(sys.dont_write_bytecode)"
PROBE = "import sys; from grpo_lightning import bytecode; bytecode.use_own_bytecode_cache(); import probe_module; " + REPORT


def python(tmp_path, code=PROBE, verbose=False, torch_bytecode=False, **env):
    """A new interpreter running ``code``, whose ``torch`` is a stand-in package on ``src`` (never
    imported), with or without its bytecode beside it as pip leaves it."""
    if not (tmp_path / "src").exists():  # written once: a rewrite a second later would make the cached bytecode stale
        (tmp_path / "src" / "torch").mkdir(parents=True)
        (tmp_path / "src" / "probe_module.py").write_text("VALUE = 1\n")
        (tmp_path / "src" / "torch" / "__init__.py").write_text("")
    if torch_bytecode:
        py_compile.compile(str(tmp_path / "src" / "torch" / "__init__.py"))
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    environment.update(PYTHONPATH=os.pathsep.join([str(tmp_path / "src"), *sys.path]), **env)
    command = [sys.executable, *(["-v"] if verbose else []), "-c", code]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=True)


def test_a_process_told_not_to_write_bytecode_caches_it_in_the_project_cache_and_reads_it_back(tmp_path):
    cache = tmp_path / "cache"
    first = python(tmp_path, PYTHONDONTWRITEBYTECODE="1", GRPO_LIGHTNING_CACHE=str(cache))
    assert first.stdout.split() == [str(cache / "pycache"), "False"]
    written = list((cache / "pycache").rglob("probe_module.*.pyc"))
    assert len(written) == 1 and not (tmp_path / "src" / "__pycache__").exists()  # the sources' folder untouched
    second = python(tmp_path, verbose=True, PYTHONDONTWRITEBYTECODE="1", GRPO_LIGHTNING_CACHE=str(cache))
    assert f"code object from '{written[0]}'" in second.stderr


def test_nothing_changes_where_bytecode_may_be_written_or_a_prefix_is_set(tmp_path):
    cache = tmp_path / "cache"
    default = python(tmp_path, GRPO_LIGHTNING_CACHE=str(cache))
    assert default.stdout.split() == ["None", "False"] and not cache.exists()
    prefix = tmp_path / "users_prefix"
    chosen = python(tmp_path, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(prefix), GRPO_LIGHTNING_CACHE=str(cache))
    assert chosen.stdout.split() == [str(prefix), "True"] and not cache.exists()


def test_nothing_changes_where_torch_has_its_bytecode(tmp_path):
    cache = tmp_path / "cache"
    result = python(tmp_path, torch_bytecode=True, PYTHONDONTWRITEBYTECODE="1", GRPO_LIGHTNING_CACHE=str(cache))
    assert result.stdout.split() == ["None", "True"] and not cache.exists()


def test_a_cache_that_cannot_be_written_leaves_python_as_it_was(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = python(tmp_path, PYTHONDONTWRITEBYTECODE="1", GRPO_LIGHTNING_CACHE=str(blocker))
    assert result.stdout.split() == ["None", "True"]


def test_a_python_child_the_package_starts_writes_to_and_reads_from_the_same_cache(tmp_path):
    cache = tmp_path / "cache"
    (tmp_path / "src" / "torch").mkdir(parents=True)
    (tmp_path / "src" / "torch" / "__init__.py").write_text("")
    (tmp_path / "src" / "probe_module.py").write_text("VALUE = 1\n")
    (tmp_path / "src" / "child_module.py").write_text("VALUE = 2\n")
    child = "import subprocess, sys; from grpo_lightning.bytecode import child_environment; "
    child += "subprocess.run([sys.executable, '-c', 'import child_module'], env=child_environment(), check=True)"
    own_cache = "from grpo_lightning.bytecode import use_own_bytecode_cache; use_own_bytecode_cache(); "
    python(tmp_path, own_cache + child, PYTHONDONTWRITEBYTECODE="1", GRPO_LIGHTNING_CACHE=str(cache))
    assert len(list((cache / "pycache").rglob("child_module.*.pyc"))) == 1
    unchanged = "import os; from grpo_lightning.bytecode import child_environment; "
    unchanged += "print(child_environment() == dict(os.environ))"
    assert python(tmp_path, unchanged, GRPO_LIGHTNING_CACHE=str(cache)).stdout.strip() == "True"  # no cache of its own


def test_importing_the_package_and_its_command_line_changes_no_interpreter_setting(tmp_path):
    # The real torch, which this package's check is told has no bytecode: the setting it would act on.
    code = (
        "import importlib.util, sys; real = importlib.util.cache_from_source; "
        "importlib.util.cache_from_source = lambda path, *a, **k: path + '.absent' if 'torch' in path else real(path, *a, **k); "
        "import grpo_lightning, grpo_lightning.cli.app; from grpo_lightning.bytecode import torch_has_bytecode; "
        "assert not torch_has_bytecode(); " + REPORT
    )  # fmt: skip
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    environment.update(PYTHONDONTWRITEBYTECODE="1", GRPO_LIGHTNING_CACHE=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.split() == ["None", "True"] and not (tmp_path / "cache").exists()


def test_the_console_entry_point_applies_the_cache_before_its_work(tmp_path):
    cache = tmp_path / "cache"
    work = "import sys, grpo_lightning.cli as cli; cli.main = lambda: print(sys.pycache_prefix, sys.dont_write_bytecode); "
    result = python(tmp_path, work + "cli.console_main()", PYTHONDONTWRITEBYTECODE="1", GRPO_LIGHTNING_CACHE=str(cache))
    assert result.stdout.split() == [str(cache / "pycache"), "False"]


def test_the_report_applies_the_cache_from_its_entry_point(tmp_path):
    cache = tmp_path / "cache"
    code = "import sys; from grpo_lightning.report import main; main(['--help'])"
    code = f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\n{REPORT.replace('; ', chr(10))}"
    result = python(tmp_path, code, PYTHONDONTWRITEBYTECODE="1", GRPO_LIGHTNING_CACHE=str(cache))
    assert result.stdout.split()[-2:] == [str(cache / "pycache"), "False"]
