"""The package layering, read from the source: imports point down, and the lower layers know nothing of Prefect.

Every `import` and `from ... import` in draftsync counts, deferred ones inside functions included: a lazy
import is still a dependency. Inside speculative/ each subpackage is a layer of its own (`speculative/data`, ...),
above the package's own modules (the layer `speculative`); to every other layer all of speculative/ is `speculative`.
Run alone: `python -m pytest tests/unit/test_layers.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "draftsync"
# Modules every layer may use: the error type, the settings and the sync profiles, the model-path confinement,
# atomic file writes, secrets masked in URLs, the statistics validation and the monitors share, a record's JSON dict.
BASE = {
    "errors",
    "settings",
    "profiles",
    "model_paths",
    "files",
    "redaction",
    "user_files",
    "stats",
    "records",
    "__init__",
    "__main__",
}
# Modules of a package that every layer may use: the drafter methods' names and facts (families, vLLM's names), the
# torch-free top of speculative/methods/.
SHARED = {"draftsync.speculative.methods"}
# The package whose subpackages are layers of their own.
INNER = "speculative"
# Each package and the draftsync packages it may import (besides BASE); anything absent is not allowed.
ALLOWED = {
    "speculative": set(),
    "speculative/data": {"speculative"},
    "speculative/methods": {"speculative", "speculative/data"},
    "speculative/train": {"speculative", "speculative/data", "speculative/methods"},
    "speculative/engine": {"speculative", "speculative/data", "speculative/methods"},
    "speculative/builtin": {"speculative", "speculative/data", "speculative/methods"},  # a target trained with its head
    "registry": set(),
    "monitors": set(),
    "planning": {"speculative"},
    "serving": {"speculative"},
    "validation": {"speculative", "serving"},
    "tasks": {"speculative", "registry", "monitors", "planning", "serving", "validation"},
    "flows": {"speculative", "registry", "monitors", "planning", "serving", "validation", "tasks"},
    "receiver": {"speculative", "registry", "monitors", "planning", "serving", "validation", "tasks"},
    "serving_service": {"speculative", "registry", "monitors", "planning", "serving", "validation", "tasks"},
    "cli": {
        "speculative",
        "registry",
        "monitors",
        "planning",
        "serving",
        "validation",
        "tasks",
        "flows",
        "receiver",
        "serving_service",
    },
}
PREFECT_FREE = ("speculative", "registry", "monitors", "planning", "serving", "validation")


def _imports(path: Path) -> set[str]:
    """Every module `path` imports; `from package import module` counts as package.module too."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(
                f"{node.module}.{alias.name}" for alias in node.names if _is_module(f"{node.module}.{alias.name}")
            )
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: relative import; write draftsync.<package>.<module>")
    return names


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_file(name: str) -> Path:
    path = PACKAGE.parent / name.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _layer(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    if parts[0] == INNER and len(parts) > 2:
        return f"{INNER}/{parts[1]}"
    return parts[0].removesuffix(".py")


def _target(name: str) -> str:
    """The layer a module named draftsync.<...> belongs to."""
    parts = name.split(".")
    if parts[1] == INNER and len(parts) > 2 and (PACKAGE / INNER / parts[2] / "__init__.py").is_file():
        return f"{INNER}/{parts[2]}"
    return parts[1]


def test_every_import_points_down_the_layers():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = _layer(path)
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "draftsync" or len(parts) < 2:
                continue
            target = _target(name)
            if not layer.startswith(f"{INNER}/") and layer != INNER:
                target = target.split("/")[0]  # outside it, all of speculative/ is one layer
            if target == layer or target in BASE or name in SHARED:
                continue
            if layer in BASE or target not in ALLOWED.get(layer, set()):
                wrong.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_the_shared_modules_use_nothing_but_the_base():
    """A module every layer may import must itself stand below every layer."""
    wrong = [
        f"{module} imports {name}"
        for module in sorted(SHARED)
        for name in _imports(_module_file(module))
        if name.split(".")[0] == "draftsync" and name.split(".")[1] not in BASE
    ]
    assert not wrong, "\n".join(wrong)


def test_the_lower_layers_know_nothing_of_prefect():
    wrong = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for layer in PREFECT_FREE
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] == "prefect"
    ]
    assert not wrong, "\n".join(wrong)


def test_every_package_is_in_the_table():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages |= {f"{INNER}/{p.name}" for p in (PACKAGE / INNER).iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(ALLOWED), f"add {sorted(packages - set(ALLOWED))} to ALLOWED with the layers it may use"


def _module_graph() -> dict[str, set[str]]:
    """Each draftsync module and the draftsync modules it imports (`from pkg import mod` counts as pkg.mod)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk meets, as `a -> b -> a`."""
    cycles, done = [], set()
    for start in sorted(graph):
        stack, on_path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.pop()
                done.add(node)
            elif child in on_path:
                cycles.append(" -> ".join([*on_path[on_path.index(child) :], child]))
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                on_path.append(child)
    return sorted(set(cycles))


def test_no_module_imports_itself_through_others():
    """No import cycle, deferred imports included: a cycle that works only because one side imports late breaks
    the day someone moves that import up."""
    graph = _module_graph()
    assert "draftsync.cli.common" in graph["draftsync.cli.drafters"]  # the graph holds real edges
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_walk_finds_a_cycle_where_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == ["a -> b -> c -> a"]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def _documented_layers() -> tuple[set[str], dict[str, set[str]]]:
    """docs/ARCHITECTURE.md's layer table: (the base modules, each package's allowed imports)."""
    import re

    text = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text()
    table = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    base: set[str] = set()
    allowed: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = {name.rstrip("/") for name in re.findall(r"`([^`]+)`", cells[0])}
        imports = set() if cells[2] in ("-", "nothing of draftsync") else set(re.findall(r"`([^`]+)`", cells[2]))
        if cells[2] == "nothing of draftsync":
            base |= names
        else:
            allowed.update({name: imports for name in names})
    return base, allowed


def test_the_architecture_docs_layer_table_is_this_tests_table():
    base, allowed = _documented_layers()
    assert base == BASE - {"__init__", "__main__"}, "docs/ARCHITECTURE.md's base row differs from BASE"
    assert allowed == ALLOWED, "docs/ARCHITECTURE.md's 'may import' column differs from ALLOWED"
