"""Responses files: `{"question", "response", optional "rubric"}` lines (the experiments.score input format), read
with each row's rubric (shared, extended or replaced per row). Shared by the tools that score or distil on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rubric_jax.files import check_input_file
from rubric_jax.jsonl import read_jsonl
from rubric_jax.rubrics.schema import Rubric, case_rubric_from_row, check_rubric_identities, short_repr


class InputError(ValueError):
    """A malformed input line; the message names the file and line."""


def read_rows(path: Path, shared: Rubric | None, shared_source: str = "--rubric",
              ) -> tuple[list[dict[str, Any]], list[Rubric], list[str]]:
    """Validated input rows, each row's rubric (shared, extended or replaced per row) and its 'file:line'.

    One rubric name and version must mean one content across the shared rubric and every row's.
    """
    check_input_file(path, "responses")
    rows, rubrics, sources = [], [], []
    for lineno, row in read_jsonl(path, InputError):
        where = f"{path}:{lineno}"
        for field in ("question", "response"):
            if not isinstance(row.get(field), str):
                raise InputError(f"{where}: field {field!r}: expected a string, got {short_repr(row.get(field))}")
        rubrics.append(case_rubric_from_row(shared, row.get("rubric"), f"line{lineno}", source=where))
        rows.append(row)
        sources.append(where)
    if not rows:
        raise InputError(f"{path}: no input rows")
    check_rubric_identities(([(shared, shared_source)] if shared is not None else []) + list(zip(rubrics, sources)))
    return rows, rubrics, sources
