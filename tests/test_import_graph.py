"""rubric_jax/ has no import cycle: the graph of its modules' imports, read with `ast` (function-level imports
included; `if TYPE_CHECKING:` imports left out, since they never run), is acyclic; and only the config boundary
imports ml_collections (issue 35)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_files(package: str = "rubric_jax") -> dict[str, Path]:
    """Every module of `package` by dotted name (a package by its own name, for its __init__.py)."""
    files = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks (typing-only imports)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            inside.update(id(n) for body in node.body for n in ast.walk(body))
    return inside


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The innermost module of `modules` that `name` (a module or a name in one) lies in; None outside them."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that module `name` imports anywhere (top level, functions, classes)."""
    return {found for found in (_known(t, modules) for t in import_targets(name, path, modules))
            if found not in (None, name)}


def import_targets(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """Every dotted name module `name` imports anywhere (relative imports resolved; `if TYPE_CHECKING:` left out),
    a name imported from a module of `modules` as that module's attribute."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    targets = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = ".".join(p for p in (package if node.level else "", node.module or "") if p)
            targets += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    return targets


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as [a, b, ..., a], or [] when it has none (depth-first search, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return []


# ml_collections is the user's surface (config files, overrides, sweeps); below the boundary modules read blocks.
ML_COLLECTIONS_IMPORTERS = {"rubric_jax.config_boundary",  # ConfigDicts become blocks (train/blocks.py)
                            "rubric_jax.config_files",  # config files load as ConfigDicts
                            "rubric_jax.sweeps"}  # a sweep's variants are overrides of a ConfigDict


def test_only_the_config_boundary_imports_ml_collections():
    """No module below the boundary reads a ConfigDict: only the three modules above import ml_collections, anywhere
    (before issue 35, train/loop.py, settings.py, experiment.py, runs.py and aot.py did too)."""
    modules = module_files()
    importers = {name for name, path in modules.items()
                 if any(t.split(".")[0] == "ml_collections" for t in import_targets(name, path, modules))}
    assert importers == ML_COLLECTIONS_IMPORTERS


def test_rubric_jax_has_no_import_cycle():
    modules = module_files()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert "rubric_jax.judges.spec" in graph["rubric_jax.judges.llm_judge"]  # the graph sees the imports
    assert find_cycle(graph) == [], " -> ".join(find_cycle(graph))


@pytest.mark.parametrize("source, edge", [
    ("def f():\n    from rubric_jax.judges import spec\n", "rubric_jax.judges.spec"),
    ("from .spec import JudgeSpec\n", "rubric_jax.judges.spec"),
    ("import rubric_jax.judges.spec as s\n", "rubric_jax.judges.spec"),
])
def test_the_graph_reads_function_level_and_relative_imports(tmp_path, source, edge):
    path = tmp_path / "m.py"
    path.write_text(source)
    modules = {"rubric_jax.judges.spec": path, "rubric_jax.judges.m": path}
    assert imports_of("rubric_jax.judges.m", path, modules) == {edge}


def test_type_checking_imports_are_not_edges(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rubric_jax.judges import spec\n")
    assert imports_of("rubric_jax.judges.m", path, {"rubric_jax.judges.spec": path}) == set()


def test_find_cycle_names_the_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
