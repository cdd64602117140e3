"""The one JSON-lines reader, and atomic text writes: every data, rubric, metrics and CLI file goes through
it, so a bad line always reads `FILE:LINE: not valid JSON (...)` or `FILE:LINE: expected a JSON object, got
...`, and a write interrupted at any point leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (line number, object) for each non-blank line; raises `error` naming the file and line."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise error(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def write_text_atomic(path: str | Path, text: str) -> None:
    """Writes `text` (UTF-8) to a new temporary file next to `path`, fsyncs it, then renames it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_jsonl_atomic(path: str | Path, rows: Iterable[Any]) -> None:
    """One JSON object per line (UTF-8 kept), written atomically."""
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
