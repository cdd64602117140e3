"""Safe file I/O for user-named paths: atomic writes, output paths that cannot clobber an input, bounded reads.

Every CLI and library writer of a whole file goes through `atomic_write_text` / `atomic_write_bytes` (or
`atomic_writer` to stream): the data goes to a temporary file in the target's directory, is flushed to
disk, and replaces the target with `os.replace`, so a crash or an error leaves either the old file or the
complete new one, never a truncated one. `check_output_path` refuses an output that is a directory or the
same file as one of the command's inputs (also through a symlink or a hard link), before any work is done.
`read_text` refuses directories, FIFOs and devices (a FIFO would block, /dev/zero would never end) and
files over a size cap. Problems raise `PathError`, whose message names the path, for a one-line CLI error.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO


class PathError(ValueError):
    """A path that cannot be used as asked (missing, a directory, an input reused as output, unreadable...)."""


def _kind(mode: int) -> str:
    """What a stat mode is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_input_file(path: str | Path, what: str = "input") -> Path:
    """`path` if it names an existing regular file, else PathError ('PATH: <what> file does not exist', ...)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise PathError(f"{path}: {what} file does not exist") from None
    except OSError as e:
        raise PathError(f"{path}: cannot read {what} file: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise PathError(f"{path}: expected a regular {what} file, got {_kind(mode)}")
    return path


def read_text(path: str | Path, what: str = "input", max_bytes: int = 64 << 20) -> str:
    """UTF-8 text of a regular file of at most `max_bytes`; PathError naming the file otherwise."""
    path = check_input_file(path, what)
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise PathError(f"{path}: cannot read {what} file: {e.strerror}") from None
    if len(data) > max_bytes:
        raise PathError(f"{path}: {what} file is larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise PathError(f"{path}:{line}: not valid UTF-8 (byte {e.start}: {e.reason})") from None


def _same_file(a: Path, b: Path) -> bool:
    """True when both paths name one file (equal resolved paths, or the same inode via a link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output_path(out: str | Path, inputs: Iterable[str | Path | None] = ()) -> Path:
    """`out` if it may be written: not a directory or special file, not the same file as any input, and
    not inside an input that is a directory (e.g. a checkpoint directory).

    Call it before the work starts, so a bad output path fails in a second rather than after scoring.
    `inputs` may contain None (an optional input not given). Returns `out` as a Path.
    """
    out = Path(out)
    if out.is_dir():
        raise PathError(f"{out}: output path is a directory; give a file name")
    if out.exists() and not out.resolve().is_file():
        raise PathError(f"{out}: output path is {_kind(out.stat().st_mode)}, expected a regular file")
    for parent in out.resolve().parents:
        if parent.exists():
            if not parent.is_dir():
                raise PathError(f"{out}: cannot create the output: {parent} is not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PathError(f"{out}: cannot create the output: directory {parent} is not writable")
            break
    for source in inputs:
        if source is None or not Path(source).exists():
            continue
        if _same_file(out, Path(source)):
            raise PathError(f"{out}: output path is the same file as the input {source}; writing it would "
                            "destroy the input")
        if Path(source).is_dir() and out.resolve().is_relative_to(Path(source).resolve()):
            raise PathError(f"{out}: output path is inside the input directory {source}")
    return out


def _new_file_mode(target: Path) -> int:
    """Permission bits for the replacement: the existing file's, or 0o666 minus the process umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_writer(path: str | Path, binary: bool = False, encoding: str = "utf-8") -> Iterator[IO]:
    """Context manager yielding a file that replaces `path` atomically when the block ends without error.

    The temporary file lives next to the target (same file system, so `os.replace` is atomic) and is
    removed if the block raises; the target is untouched until then. A symlink target is written through
    (the link keeps pointing at the new content). Missing parent directories are created.
    OSError from the file system is raised as PathError naming `path`.
    """
    target = Path(os.path.realpath(path))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise PathError(f"{path}: cannot write: {e.strerror or e}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": encoding, "newline": ""})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _new_file_mode(target))
        os.replace(tmp, target)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise PathError(f"{path}: cannot write: {e.strerror or e}") from None
        raise


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Replace `path` with `text` atomically (see `atomic_writer`); an unencodable text leaves `path` as it was."""
    data = text.encode(encoding)
    with atomic_writer(path, binary=True) as f:
        f.write(data)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (see `atomic_writer`)."""
    with atomic_writer(path, binary=True) as f:
        f.write(data)
