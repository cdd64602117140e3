"""fileio: atomic writes keep the old file on any failure, outputs cannot clobber inputs, reads refuse special files."""

import os
import stat

import pytest

from rubric_jax.fileio import (
    PathError,
    atomic_write_bytes,
    atomic_write_text,
    atomic_writer,
    check_input_file,
    check_output_path,
    read_text,
)


def test_atomic_write_replaces_content_and_keeps_permissions(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    path.chmod(0o640)
    atomic_write_text(path, "new ✓")
    assert path.read_text(encoding="utf-8") == "new ✓"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    atomic_write_bytes(tmp_path / "deep" / "dir" / "b.bin", b"\x00\x01")
    assert (tmp_path / "deep" / "dir" / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "out.txt"]  # no temporary file left


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_writer(path) as f:
            f.write("partial\n")
            raise RuntimeError("disk on fire")
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(path, "lone \ud800 surrogate")
    with pytest.raises(UnicodeEncodeError):
        with atomic_writer(path) as f:
            f.write("fine\n")
            f.write("lone \ud800 surrogate\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_atomic_write_goes_through_a_symlink(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_an_unwritable_directory_is_one_clear_error(tmp_path, monkeypatch):
    """File-system refusals (simulated: the tests may run as root, whom permissions do not stop)."""
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    with pytest.raises(PathError, match="out.txt: cannot write: Permission denied"):
        atomic_write_text(tmp_path / "out.txt", "x")
    monkeypatch.setattr("os.access", lambda path, mode: False)
    with pytest.raises(PathError, match="directory .* is not writable"):
        check_output_path(tmp_path / "out.txt")


def test_output_may_not_be_an_input_or_a_directory(tmp_path):
    responses = tmp_path / "in.jsonl"
    responses.write_text("{}\n")
    rubric = tmp_path / "r.yaml"
    rubric.write_text("x")
    inputs = [responses, None, rubric]
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
            check_output_path(out, [*inputs, tmp_path / "ckpt"])


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
