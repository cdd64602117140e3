"""Atomic writes: a failed write leaves the old file and no temporary file; files get the umask's mode."""

import os
import stat

import pytest

from rubric_jax.files import write_atomic


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
