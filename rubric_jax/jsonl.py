"""The one JSON-lines reader: every data, rubric, metrics and CLI file goes through it, so a bad line
always reads `FILE:LINE: not valid JSON (...)` or `FILE:LINE: expected a JSON object, got ...`."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rubric_jax.files import PathError, open_input

MAX_LINE_BYTES = 64 << 20  # a longer line is refused rather than read into memory (a file of one endless line)


def read_jsonl(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (line number, object) for each non-blank line; raises `error` naming the file and line.

    A line that is not UTF-8, not JSON (also: nested too deeply, an integer over Python's 4300 digits),
    not an object, or that holds a lone surrogate (`"\\ud800"` parses, but UTF-8 cannot write it back)
    is an error, so nothing downstream (tokenizers, writers) meets it mid-run. Only a regular file is read
    (files.open_input: a FIFO or /dev/zero is refused at once), each line at most MAX_LINE_BYTES long.
    """
    path = Path(path)
    try:
        f = open_input(path, "jsonl")
    except PathError as e:
        raise error(str(e)) from None
    with f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise error(f"{path}:{lineno}: line longer than {MAX_LINE_BYTES} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(f"{path}:{lineno}: not valid UTF-8 (byte {e.start} of the line: {e.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            except ValueError as e:  # e.g. an integer longer than Python's int-to-str limit
                raise error(f"{path}:{lineno}: not valid JSON ({str(e)[:200]})") from None
            except RecursionError:
                raise error(f"{path}:{lineno}: not valid JSON (nested too deeply)") from None
            if not isinstance(row, dict):
                raise error(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            if "\\u" in line and not _encodable(row):
                raise error(f"{path}:{lineno}: contains a lone surrogate escape (e.g. \\ud800) that UTF-8 cannot "
                            "encode")
            yield lineno, row


def finite_float(value: Any) -> float | None:
    """`value` as a float if it is a finite JSON number (an int or float, not a bool), else None. JSON
    integers have no size limit, and float(10**400) or math.isfinite(10**400) raise OverflowError: every
    reader of a number from a data, labels, scores or correction file checks it here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown(value: Any) -> str:
    """`value` for an error message: its repr, a huge integer as its digit count, at most 80 characters."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _encodable(row: dict[str, Any]) -> bool:
    """True if the object can be written back as UTF-8 JSON (no lone surrogates in keys or strings)."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
