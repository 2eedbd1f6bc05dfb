"""The package's structure: import graph, private names, module sizes and layering.

Every module under ``grpo_lightning/`` and ``variants/`` (installed as ``grpo_lightning.variants``)
is parsed with ``ast`` (nothing is imported), including imports inside functions, so these checks
hold for optional code paths too. Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"grpo_lightning": "grpo_lightning", "variants": "grpo_lightning.variants"}
"""Folder of the repository -> the package its modules are installed as."""
CHECKOUT_STAND_IN = ROOT / "grpo_lightning" / "variants" / "__init__.py"
"""``grpo_lightning.variants`` of a checkout, which runs ``variants/__init__.py`` (never installed)."""
MAX_LINES = {"grpo_lightning": 400, "variants": 120}
"""Most non-blank lines of a ``.py`` file in each folder."""
FUNCTIONAL_MAY_IMPORT = {"torch", "__future__", "typing", "collections", "dataclasses", "math", "functools"}
PURE_MODULES = ("grpo_lightning.algorithms.functional", "grpo_lightning.algorithms.policy_losses")
"""The pure tensor math: each imports ``FUNCTIONAL_MAY_IMPORT`` and the others only."""


def module_name(path: Path) -> str:
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join([PACKAGES[folder], *(parts[:-1] if parts[-1] == "__init__" else parts)])


def project_files() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of the project's packages."""
    files = {}
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts and path != CHECKOUT_STAND_IN:
                files[module_name(path)] = path
    return files


MODULES = project_files()


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def absolute(name: str, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` in module ``name`` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package(name) else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def project_module(name: str) -> str | None:
    """``name`` or the closest enclosing project module (``a.b.c`` -> ``a.b`` if ``c`` is an attribute)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_nodes(tree: ast.AST):
    """Every node of ``tree``, inside functions too, except the body of ``if TYPE_CHECKING:`` blocks
    (never run; their ``else`` is)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if is_type_checking(node):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def imports(name: str) -> list[tuple[str, int, str | None]]:
    """``(imported module, line, imported name or None)`` for each import in module ``name`` whose
    module is a project module. ``from package import submodule`` counts as an import of the
    submodule."""
    found = []
    for node in runtime_nodes(ast.parse(MODULES[name].read_text(), str(MODULES[name]))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = project_module(alias.name)
                if target:
                    found.append((target, node.lineno, None))
        elif isinstance(node, ast.ImportFrom):
            source = absolute(name, node)
            target = project_module(source)
            if target is None:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:
                    found.append((submodule, node.lineno, None))
                else:
                    found.append((target, node.lineno, alias.name))
    return found


def import_graph() -> dict[str, set[str]]:
    return {name: {target for target, _, _ in imports(name) if target != name} for name in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (the first repeated at the end), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def non_blank_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def oversized(prefix: str = "") -> list[str]:
    """``file: lines > limit`` for each file over its package's limit whose module starts with ``prefix``."""
    found = []
    for name, path in MODULES.items():
        limit = MAX_LINES[path.relative_to(ROOT).parts[0]]
        lines = non_blank_lines(path)
        if name.startswith(prefix) and lines > limit:
            found.append(f"{path.relative_to(ROOT)}: {lines} > {limit}")
    return found


def test_the_graph_walker_sees_the_project():
    assert {"grpo_lightning.rollout.engine.generator", "grpo_lightning.algorithms.functional", "grpo_lightning.variants.grpo"} <= set(MODULES)
    graph = import_graph()
    assert "grpo_lightning.rollout.engine.cache" in graph["grpo_lightning.rollout.engine.generator"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert len(cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b"}})) == 2


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of ``graph``, one at a time: each found is broken at its last edge before the next search."""
    graph = {node: set(targets) for node, targets in graph.items()}
    found = []
    while (cycle := find_cycle(graph)) is not None:
        found.append(cycle)
        graph[cycle[-2]].discard(cycle[-1])
    return found


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_no_private_name_imported_from_another_module():
    found = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: from {target} import {imported}"
        for name in MODULES
        for target, line, imported in imports(name)
        if imported and imported.startswith("_") and not imported.startswith("__") and target != name
    ]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_every_file_is_within_the_size_limit():
    assert not oversized(), "\n".join(oversized())


PRESETS = "grpo_lightning.variants"
ABOVE_THE_PRESETS = ("grpo_lightning.cli", "grpo_lightning.ablation", "grpo_lightning.report")
"""The wings that may import the presets (short names on the command line, a sweep's cell server, the
order of a report's arms); the presets build on the rest of the package, never on these."""


def in_package(name: str, packages: str | tuple[str, ...]) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(name == package or name.startswith(f"{package}.") for package in packages)


def test_the_presets_build_on_the_package_and_only_the_top_wings_import_them():
    found = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: imports {target}"
        for name in MODULES
        for target, line, _ in imports(name)
        if (in_package(target, PRESETS) and not in_package(name, (PRESETS, *ABOVE_THE_PRESETS)))
        or (in_package(name, PRESETS) and in_package(target, ABOVE_THE_PRESETS))
    ]
    assert not found, "\n".join(found)


def test_the_presets_are_the_top_level_folder_and_the_package_holds_only_its_stand_in():
    assert "grpo_lightning.variants.grpo" in MODULES and MODULES[PRESETS] == ROOT / "variants" / "__init__.py"
    assert sorted(p.name for p in CHECKOUT_STAND_IN.parent.iterdir() if p.name != "__pycache__") == ["__init__.py"]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_functional_imports_only_torch_and_the_standard_library(module):
    tree = ast.parse(MODULES[module].read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.level or node.module not in PURE_MODULES):
            roots.add("." if node.level else (node.module or "").split(".")[0])
    assert roots <= FUNCTIONAL_MAY_IMPORT, sorted(roots - FUNCTIONAL_MAY_IMPORT)


def test_no_module_is_an_alias_of_another():
    """A module that replaces itself in ``sys.modules`` is a second name for one thing: import the real one."""
    found = [str(path.relative_to(ROOT)) for path in MODULES.values() if "sys.modules[__name__]" in path.read_text()]
    assert not found, "\n".join(found)


WING_LAYERS = (
    ("cli", "ablation", "report", "quickstart", "variants"),
    ("training",),
    ("evaluation", "checkpoints"),
    ("rollout", "agents", "rewards", "models", "data"),
    ("algorithms",),
    ("runtime", "grpo_lightning", "bytecode", "closed_output", "errors", "import_pause", "process_end", "progress"),
)
"""The wings from the top down: a module may import its own layer's wings and those below, never one
above. A wing is a folder of ``grpo_lightning/`` (or the ``variants`` package); a module at the
package's root is a wing of its own (named for it), and the package's ``__init__`` is ``grpo_lightning``.
The entry points and the presets sit on top; the floor is ``runtime`` and the root's small modules."""
LAYER = {wing: depth for depth, wings in enumerate(WING_LAYERS) for wing in wings}
ENTRY_POINTS = WING_LAYERS[0]
"""The wings above ``training``: the only ones besides ``training`` that may import it."""
MAX_UPWARD_IMPORTS = 3


def wing(name: str) -> str:
    """The wing of module ``name``: ``grpo_lightning.rollout.engine.cache`` -> ``rollout``,
    ``grpo_lightning.errors`` -> ``errors``, ``variants.grpo`` -> ``variants``."""
    parts = name.split(".")
    return parts[0] if parts[0] == "variants" or len(parts) == 1 else parts[1]


def wing_imports() -> dict[tuple[str, str], list[str]]:
    """``(importing wing, imported wing)`` -> ``module -> module`` for every pair of modules of two
    different wings where the first imports the second."""
    found: dict[tuple[str, str], list[str]] = {}
    for name, targets in import_graph().items():
        for target in sorted(targets):
            if wing(name) != wing(target):
                found.setdefault((wing(name), wing(target)), []).append(f"{name} -> {target}")
    return found


def wing_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for source, target in wing_imports():
        graph.setdefault(source, set()).add(target)
    return graph


def upward_imports() -> list[str]:
    """``module -> module`` for each import of a wing by a wing of a lower layer (an unknown wing counts as the floor)."""
    floor = len(WING_LAYERS) - 1
    return [
        edge
        for (source, target), edges in sorted(wing_imports().items())
        if LAYER.get(target, floor) < LAYER.get(source, floor)
        for edge in edges
    ]


def imports_of_training() -> list[str]:
    """``module -> module`` for each import of ``grpo_lightning.training`` by a module of a wing other than it and the entry points."""
    return [
        edge
        for (source, target), edges in sorted(wing_imports().items())
        if target == "training" and source not in ENTRY_POINTS
        for edge in edges
    ]


def test_the_wings_are_named_for_their_folders():
    assert wing("grpo_lightning.rollout.engine.cache") == "rollout"
    assert wing("grpo_lightning.runtime") == "runtime"
    assert (wing("grpo_lightning.errors"), wing("grpo_lightning"), wing("variants.grpo")) == ("errors", "grpo_lightning", "variants")


def test_every_wing_has_a_layer():
    """A new folder is placed in ``WING_LAYERS`` (above what it imports), so the checks below see it."""
    assert not {wing(name) for name in MODULES} - set(LAYER), sorted({wing(name) for name in MODULES} - set(LAYER))


def test_only_the_entry_points_and_the_presets_import_the_training_wing():
    """The wings under ``training`` run without the LightningModule and its update loop: what they
    share with it (strategies, dtypes, argument types, budgets, metrics) is ``runtime``'s."""
    found = imports_of_training()
    assert not found, "imports of grpo_lightning.training from below it:\n" + "\n".join(found)


def test_almost_no_wing_imports_one_above_it():
    found = upward_imports()
    assert len(found) <= MAX_UPWARD_IMPORTS, f"{len(found)} upward imports (at most {MAX_UPWARD_IMPORTS}):\n" + "\n".join(found)


def test_no_import_cycle_between_wings():
    """Not two wings that import each other, directly or through others (each module-level cycle is one too)."""
    found = cycles(wing_graph())
    assert not found, "cycles between wings:\n" + "\n".join(
        " -> ".join(cycle) + "\n  " + "\n  ".join(wing_imports()[(a, b)][0] for a, b in zip(cycle, cycle[1:])) for cycle in found
    )


MAX_MODULES_PER_FOLDER = 13
"""Most modules (``__init__.py`` aside) in one folder of ``grpo_lightning/``: past that, a folder wants a sub-wing."""


def test_no_folder_is_a_flat_hall():
    folders: dict[Path, int] = {}
    for path in (ROOT / "grpo_lightning").rglob("*.py"):
        if "__pycache__" not in path.parts and path.name not in ("__init__.py", "__main__.py"):
            folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = [f"{folder.relative_to(ROOT)}: {count}" for folder, count in folders.items() if count > MAX_MODULES_PER_FOLDER]
    assert not crowded, "folders over the limit:\n" + "\n".join(sorted(crowded))
