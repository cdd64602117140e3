"""The trainer's shape (issue 22): train/loop.py is the thin `run(config, workdir)` and no function in
rubric_jax/train/ grows past a screen, so that a reader can follow a parameter from the config to the step."""

from __future__ import annotations

import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "rubric_jax" / "train"
MAX_LOOP_LINES = 150
MAX_FUNCTION_LINES = 60


def function_lengths(source: str) -> dict[str, int]:
    """Lines (def line to last line, decorators and docstring included) of every function and method in
    `source`, by qualified name."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{getattr(child, 'name', '')}"
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                lengths[name] = child.end_lineno - start + 1
            visit(child, f"{name}." if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  else prefix)

    visit(ast.parse(source), "")
    return lengths


def test_function_lengths_counts_nested_functions_and_methods():
    source = "def f():\n    def g():\n        pass\n    return g\n\n\nclass C:\n    @staticmethod\n    def m():\n        pass\n"
    assert function_lengths(source) == {"f": 4, "f.g": 2, "C.m": 3}


def test_the_loop_is_thin_and_no_function_in_train_is_over_sixty_lines():
    assert len((TRAIN / "loop.py").read_text(encoding="utf-8").splitlines()) <= MAX_LOOP_LINES
    too_long = {f"{path.name}:{name}": n for path in sorted(TRAIN.glob("*.py"))
                for name, n in function_lengths(path.read_text(encoding="utf-8")).items() if n > MAX_FUNCTION_LINES}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines in rubric_jax/train: {too_long}"
