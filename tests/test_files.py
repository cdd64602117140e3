"""files: a failed write leaves the old file and no temporary file; files get the umask's mode (a replaced one
keeps its own); outputs cannot clobber inputs; reads refuse special files, big files and invalid UTF-8."""

import os
import stat

import pytest

from bounded import deadline, run_bounded
from rubric_jax import jsonl
from rubric_jax.files import (PathError, atomic_writer, check_input_file, check_output_path, open_input, read_text,
                              write_atomic)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    assert write_atomic(path, '{"b": "阅读"}\n') == path
    assert path.read_text(encoding="utf-8") == '{"b": "阅读"}\n'

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, b"new")
    assert path.read_text(encoding="utf-8") == '{"b": "阅读"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "sub" / "f.png", b"\x89PNG")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "sub" / "f.png").stat().st_mode) == 0o644  # mkstemp would give 0o600
    assert (tmp_path / "sub" / "f.png").read_bytes() == b"\x89PNG"


def test_a_failure_inside_a_streaming_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    path.chmod(0o640)
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_writer(path) as f:
            f.write("partial\n")
            raise RuntimeError("disk on fire")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "lone \ud800 surrogate")
    with pytest.raises(UnicodeEncodeError):
        with atomic_writer(path) as f:
            f.write("fine\n")
            f.write("lone \ud800 surrogate\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
    with atomic_writer(path) as f:
        f.write("new ✓\n")
    assert path.read_text(encoding="utf-8") == "new ✓\n" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_atomic_writes_go_through_a_symlink(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_output_may_not_be_an_input_a_directory_or_unwritable(tmp_path, monkeypatch):
    responses = tmp_path / "in.jsonl"
    responses.write_text("{}\n")
    rubric = tmp_path / "r.yaml"
    rubric.write_text("x")
    inputs = [responses, None, rubric, tmp_path / "ckpt"]
    assert check_output_path(tmp_path / "out.jsonl", inputs) == tmp_path / "out.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(responses)
    hard = tmp_path / "hard.yaml"
    os.link(rubric, hard)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "file").write_text("x")
    cases = {
        responses: "same file as the input",
        tmp_path / "." / "in.jsonl": "same file as the input",
        link: "same file as the input",
        hard: "same file as the input",
        tmp_path: "is a directory",
        tmp_path / "ckpt" / "config.json": "inside the input directory",
        tmp_path / "file" / "out.jsonl": "is not a directory",
    }
    for out, message in cases.items():
        with pytest.raises(PathError, match=message):
            check_output_path(out, inputs)
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # tests may run as root, whom modes do not stop
    with pytest.raises(PathError, match="directory .* is not writable"):
        check_output_path(tmp_path / "out.jsonl")


def test_reads_refuse_directories_fifos_devices_big_and_non_utf8_files(tmp_path):
    fifo = tmp_path / "rubric.yaml"
    os.mkfifo(fifo)
    device = tmp_path / "zero.yaml"
    device.symlink_to("/dev/zero")
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 101)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("line one\ncaf\xe9\n".encode("latin-1"))
    cases = {
        tmp_path / "missing.yaml": "rubric file does not exist",
        tmp_path: "expected a regular rubric file, got a directory",
        fifo: "expected a regular rubric file, got a FIFO",  # reading it would block forever
        device: "expected a regular rubric file, got a character device",  # /dev/zero never ends
        big: "rubric file is larger than 100 bytes",
        latin: "latin.txt:2: not valid UTF-8",
    }
    for path, message in cases.items():
        with pytest.raises(PathError, match=message):
            read_text(path, "rubric", max_bytes=100)
    assert read_text(big, max_bytes=101) == "x" * 101
    assert check_input_file(big) == big


def test_open_input_refuses_a_fifo_at_once_and_devices_and_big_files(tmp_path):
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"{}\n" * 10)
    with deadline(10):  # a blocking open of a FIFO without a writer would wait here forever
        with pytest.raises(PathError, match="train.jsonl: expected a regular data file, got a FIFO"):
            open_input(fifo, "data")
    with pytest.raises(PathError, match="expected a regular data file, got a character device"):
        open_input("/dev/zero", "data")
    with pytest.raises(PathError, match="data file is larger than 29 bytes"):
        open_input(big, "data", max_bytes=29)
    with open_input(big, "data", max_bytes=30) as f:
        assert f.read() == b"{}\n" * 10


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_every_jsonl_reader_refuses_fifos_and_dev_zero_without_hanging(tmp_path, special):
    path = tmp_path / "q.jsonl"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(special)
    # In a child with 2 GiB and 60 s: before the fix a FIFO blocked forever and /dev/zero grew until killed.
    done = run_bounded(f"from rubric_jax import jsonl\ntry:\n    list(jsonl.read_jsonl({str(path)!r}))\n"
                       f"except ValueError as e:\n    print(e)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{path}: expected a regular jsonl file, got a" in done.stdout


def test_jsonl_refuses_an_endless_line(tmp_path, monkeypatch):
    path = tmp_path / "one_line.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"x" * 100)
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 50)
    with pytest.raises(ValueError, match="one_line.jsonl:2: line longer than 50 bytes"):
        list(jsonl.read_jsonl(path))
