"""Atomic writes: a failed write leaves the old file and no temporary file; files get the usual permissions."""

import os
import stat

import pytest

from rubric_jax import jsonl


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    jsonl.write_jsonl_atomic(path, [{"a": 1}, {"b": "阅读"}])
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n{"b": "阅读"}\n'

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        jsonl.write_text_atomic(path, "new")
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n{"b": "阅读"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_atomic_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        jsonl.write_text_atomic(tmp_path / "sub" / "f.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "sub" / "f.txt").stat().st_mode) == 0o644
