"""Atomic writes (a reader, or a crash, sees the old file or directory or the whole new one, never half
of it) and the rule that no output may overwrite, contain or lie inside an input."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path


class OutputPathError(ValueError):
    """An output path that is, contains or lies inside an input; the message names both."""


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


@contextlib.contextmanager
def atomic_directory(path: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """Yields a new temporary directory beside `path`, renamed to `path` when the block succeeds (removed
    when it fails). `path` must not exist or be an empty directory, unless `replace`: then the old
    directory is swapped out by renames and deleted only once the new one is in place."""
    path = Path(path)
    if not replace and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path}: already exists and is not an empty directory; write into a new one")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir()
    try:
        yield tmp
        old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old") if replace and path.exists() else None
        if old is not None:
            os.rename(path, old)
        os.rename(tmp, path)  # onto a missing or empty directory: atomic on POSIX
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old)


def check_output_dir(out: Path, inputs: Sequence[Path], input_dirs: Sequence[Path], *, flag: str = "--out") -> None:
    """`out` must not be, contain, or lie inside an input (`input_dirs` may not hold it either; a run's
    workdir, given in `inputs`, may hold `out` below it). Raises OutputPathError naming `flag`."""
    resolved = out.resolve()
    if resolved.exists() and not resolved.is_dir():
        raise OutputPathError(f"{flag}={out}: exists and is not a directory")
    for path in [*inputs, *input_dirs]:
        if resolved == path.resolve():
            raise OutputPathError(f"{flag}={out}: is also an input ({path})")
    for path in [*inputs, *input_dirs]:
        if path.resolve().is_relative_to(resolved):
            raise OutputPathError(f"{flag}={out}: contains the input {path}")
    for directory in input_dirs:
        if resolved.is_relative_to(directory.resolve()):
            raise OutputPathError(f"{flag}={out}: lies inside the input directory {directory}")
