"""Atomic file writes: a reader (or a crash) sees the old file or the whole new one, never half of it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Writes `data` to a temporary file beside `path`, flushes it to disk, then renames it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    # A new, uniquely named file opened exclusively: unlike mkstemp (mode 0600), it gets the umask's mode,
    # as a plain write would.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("xb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
