"""Safe file I/O for user-named paths: atomic writes, outputs that cannot clobber an input, bounded reads.

Atomic writes (`write_atomic`, or `atomic_writer` to stream): a reader (or a crash) sees the old file or
the whole new one, never half of it. The data goes to a uniquely named temporary file beside the target
(same file system, so `os.replace` is atomic), is flushed to disk, and replaces the target; on any error
the temporary file is removed and the target is untouched.
`check_output_path` refuses an output that is a directory, the same file as one of the command's inputs
(also through a symlink or a hard link) or inside an input directory, before any work is done.
Output directories: `atomic_directory` (the whole directory appears at once, by a rename) and
`check_output_dir` (not an input, not containing one, not inside an input directory).
Every user-named input is opened by `open_input` (or `read_text`, its text form): a regular file under a size
cap only, never a directory, a FIFO (would block) or a device (/dev/zero never ends). These checks raise
`PathError`, whose message names the path, for a one-line CLI error.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, BinaryIO


MAX_INPUT_BYTES = 16 << 30  # the largest input file any command reads (a data set, a scores file): 16 GiB


class PathError(ValueError):
    """A path that cannot be used as asked (missing, a directory, an input reused as output, unreadable...)."""


@contextlib.contextmanager
def atomic_writer(path: str | Path, binary: bool = False, encoding: str = "utf-8") -> Iterator[IO]:
    """A file to write that replaces `path` atomically when the block ends without an exception.

    Missing parent directories are created. A symlink is written through (it keeps pointing at the new
    content). A new file gets the umask's mode, a replaced one keeps its mode. OSError propagates.
    """
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        # Opened exclusively under a unique name: unlike mkstemp (mode 0600) it gets the umask's mode.
        with tmp.open("xb") if binary else tmp.open("x", encoding=encoding, newline="") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if target.exists():
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Writes `data` (str as UTF-8) to `path` atomically (see `atomic_writer`); returns `path`."""
    payload = data.encode("utf-8") if isinstance(data, str) else data  # unencodable text fails before any file
    with atomic_writer(path, binary=True) as f:
        f.write(payload)
    return Path(path)


def _kind(mode: int) -> str:
    """What a stat mode is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_input_file(path: str | Path, what: str = "input") -> Path:
    """`path` if it names an existing regular file, else PathError ('PATH: <what> file does not exist', ...)."""
    open_input(path, what, max_bytes=None).close()
    return Path(path)


def open_input(path: str | Path, what: str = "input", max_bytes: int | None = MAX_INPUT_BYTES) -> BinaryIO:
    """`path` opened for binary reading if it is a regular file of at most `max_bytes` (None: any size);
    PathError naming the path and `what` otherwise (missing, a directory, a FIFO, a device, too large).

    Opened non-blocking and then checked with fstat, so a FIFO without a writer is refused at once (a
    blocking open would wait forever) and nothing can swap the file between the check and the read.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PathError(f"{path}: {what} file does not exist") from None
    except OSError as e:
        raise PathError(f"{path}: cannot read {what} file: {e.strerror}") from None
    info = os.fstat(fd)
    problem = (f"expected a regular {what} file, got {_kind(info.st_mode)}" if not stat.S_ISREG(info.st_mode)
               else f"{what} file is larger than {max_bytes} bytes"
               if max_bytes is not None and info.st_size > max_bytes else None)
    if problem is not None:
        os.close(fd)
        raise PathError(f"{path}: {problem}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_text(path: str | Path, what: str = "input", max_bytes: int = 64 << 20) -> str:
    """UTF-8 text of a regular file of at most `max_bytes`; PathError naming the file (and line) otherwise."""
    with open_input(path, what, max_bytes) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise PathError(f"{path}: cannot read {what} file: {e.strerror}") from None
    if len(data) > max_bytes:  # grew after the size check
        raise PathError(f"{path}: {what} file is larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise PathError(f"{path}:{line}: not valid UTF-8 (byte {e.start}: {e.reason})") from None


def _same_file(a: Path, b: Path) -> bool:
    """True when both paths name one file (equal resolved paths, or the same inode via a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output_path(out: str | Path, inputs: Iterable[str | Path | None] = ()) -> Path:
    """`out` if it may be written: not a directory or special file, not the same file as any input, not
    inside an input that is a directory (e.g. a checkpoint), in a directory that exists or can be created.

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


def give_new_file_modes(directory: Path) -> None:
    """Sets every regular file directly in `directory` to the mode a new file gets there (0o666 less the umask,
    found by creating one): safetensors' save_file writes 0600 files and copies keep their source's mode, so an
    exported directory would otherwise mix 0600 and 0644 files."""
    probe = directory / f".{uuid.uuid4().hex}.mode"
    probe.open("x").close()
    mode = stat.S_IMODE(probe.stat().st_mode)
    probe.unlink()
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def check_output_dir(out: Path, inputs: Sequence[Path], input_dirs: Sequence[Path], *, flag: str = "--out") -> None:
    """An output directory `out` must not be, contain, or lie inside an input (`input_dirs` may not hold
    it either; a run's workdir, given in `inputs`, may hold `out` below it). PathError names `flag`."""
    resolved = out.resolve()
    if resolved.exists() and not resolved.is_dir():
        raise PathError(f"{flag}={out}: exists and is not a directory")
    for path in [*inputs, *input_dirs]:
        if resolved == path.resolve():
            raise PathError(f"{flag}={out}: is also an input ({path})")
    for path in [*inputs, *input_dirs]:
        if path.resolve().is_relative_to(resolved):
            raise PathError(f"{flag}={out}: contains the input {path}")
    for directory in input_dirs:
        if resolved.is_relative_to(directory.resolve()):
            raise PathError(f"{flag}={out}: lies inside the input directory {directory}")
