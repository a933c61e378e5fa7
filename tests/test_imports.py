"""scratchflow's modules import one another without a cycle, and the start-up checks import no training
code. Read from the source: every import of a file counts, at any depth (in a function, under
TYPE_CHECKING), so an import moved into a function to dodge a cycle is still seen."""

import ast
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest
from conftest import REPO

SCRIPTS = REPO / "scripts"
PACKAGE = "scratchflow"


def module_files(root: Path = SCRIPTS) -> dict[str, Path]:
    """Every module of the package under `root` by its dotted name (a package by its own, for its
    __init__.py)."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def named_imports(name: str, path: Path) -> set[str]:
    """The dotted names one file imports: a relative import resolved, and for `from X import y`
    both X and X.y (which is a module's name where y is a submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*above, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path = SCRIPTS) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. Importing a submodule also runs the packages
    above it, except those the importer is inside (already run before it)."""
    modules = module_files(root)
    graph = {}
    for name, path in modules.items():
        imported = set()
        for target in named_imports(name, path):
            if target in modules:
                imported.add(target)
            parts = target.split(".")
            for depth in range(1, len(parts)):
                above = ".".join(parts[:depth])
                if above in modules and not f"{name}.".startswith(f"{above}."):
                    imported.add(above)
        graph[name] = imported
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str | None]:
    """Every module `start` imports, directly or not, each with the module it is first reached from."""
    came_from: dict[str, str | None] = {start: None}
    waiting = deque([start])
    while waiting:
        module = waiting.popleft()
        for target in sorted(graph[module]):
            if target not in came_from:
                came_from[target] = module
                waiting.append(target)
    return came_from


def chain(came_from: dict[str, str | None], end: str) -> list[str]:
    """The modules from the search's start to `end`, as `reachable` reached them."""
    path = [end]
    while (before := came_from[path[-1]]) is not None:
        path.append(before)
    return path[::-1]


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each module that imports itself, and each group of modules that import one another (a
    strongly connected component): one shortest cycle through its first module, then each member's
    imports within the group, one of which has to go for each cycle."""
    found = [f"{module} -> {module}" for module in sorted(graph) if module in graph[module]]
    reach = {module: set(reachable(graph, module)) for module in graph}
    seen: set[str] = set()
    for module in sorted(graph):
        component = sorted(other for other in reach[module] if module in reach[other])
        if module in seen or len(component) < 2:
            continue
        seen.update(component)
        inside = {member: graph[member] & set(component) for member in component}
        came_from = reachable(inside, module)
        back = min(
            (member for member in component if module in inside[member]),
            key=lambda member: len(chain(came_from, member)),
        )
        imports = "".join(f"\n  {member} -> {', '.join(sorted(inside[member]))}" for member in component)
        loop = " -> ".join([*chain(came_from, back), module])
        found.append(f"{loop}, among {len(component)} modules that import one another:{imports}")
    return found


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles in scripts/scratchflow:\n" + "\n".join(found)


def test_the_cycle_check_finds_a_module_importing_itself_and_names_one_cycle_per_group():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(graph) == [
        "d -> d",
        "a -> b -> a, among 3 modules that import one another:\n  a -> b\n  b -> a, c\n  c -> a",
    ]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_import_counts_wherever_it_is_in_a_file(tmp_path):
    """In a function, under TYPE_CHECKING, relative, a submodule named in `from package import`; a
    submodule's import runs the packages above it, but a module's own package counts only where
    named."""
    files = {
        "__init__.py": "",
        "files.py": "",
        "tasks/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..piece import Spec\n",
        "tasks/command.py": "import scratchflow.tasks.helpers\n\n\ndef train():\n    from .. import files\n",
        "tasks/helpers.py": "import os\n",
        "piece.py": "def run():\n    import scratchflow.tasks.command\n",
    }
    for name, text in files.items():
        (tmp_path / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["scratchflow.tasks"] == {"scratchflow.piece"}
    assert graph["scratchflow.tasks.command"] == {"scratchflow", "scratchflow.files", "scratchflow.tasks.helpers"}
    assert graph["scratchflow.piece"] == {"scratchflow.tasks", "scratchflow.tasks.command"}
    assert cycles(graph)[0].startswith("scratchflow.piece -> scratchflow.tasks -> scratchflow.piece, among 2")


# The start-up checks run whenever the workflow is read, before any job: they need none of the
# training code, and importing it would tie them to the training's modules (and to torch and
# transformers, seconds to import).
# What trains: a piece's sequence, its processes and their launchers (the run's storage, checkpoints
# and ledger, is not: the start-up warns where the grid's checkpoints may not fit).
TRAINING = ("scratchflow.piece", "scratchflow.training_process", "scratchflow.distributed")
STARTUP_CHECKS = {"scratchflow.config": TRAINING, "scratchflow.workflow_hooks": TRAINING}


@pytest.mark.parametrize("module", STARTUP_CHECKS)
def test_the_start_up_checks_import_no_training_code(module):
    came_from = reachable(import_graph(), module)
    imported = [" -> ".join(chain(came_from, training)) for training in STARTUP_CHECKS[module] if training in came_from]
    assert not imported, f"{module} imports training code:\n" + "\n".join(imported)


@pytest.mark.parametrize("module", STARTUP_CHECKS)
def test_importing_a_start_up_check_loads_no_training_code_nor_torch(module):
    forbidden = [*STARTUP_CHECKS[module], "torch", "transformers"]
    imports = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print(*sorted(sys.modules))"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
    )
    assert imports.returncode == 0, imports.stderr
    loaded = [name for name in imports.stdout.split() if name in forbidden or name.split(".")[0] in forbidden]
    assert not loaded, f"importing {module} loads {', '.join(loaded)}"
