"""Rubric files under hostile input: special files, size, encodings, YAML alias bombs and cycles, duplicate keys,
deep nesting and huge numbers are each one RubricError naming the file; legitimate YAML aliases still load."""

import json
import os

import pytest

from rubric_jax.rubrics import RubricError, load_correction, load_rubric, rubric_from_dict, rubric_to_dict, save_rubric
from rubric_jax.rubrics import io as rubric_io

HEAD = """name: demo
version: 1.0.0
changelog: [{version: 1.0.0, change: first, reason: test}]
"""
DIMENSIONS = """dimensions:
  - id: accuracy
    description: correct
    kind: llm
    scale: {kind: binary}
    anchors: &binary {0: wrong, 1: right}
  - id: clarity
    description: clear
    kind: llm
    scale: {kind: binary}
    anchors: *binary
"""


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _load_error(path):
    with pytest.raises(RubricError) as e:
        load_rubric(path)
    return str(e.value)


def test_yaml_aliases_that_repeat_anchors_still_load(tmp_path):
    r = load_rubric(_write(tmp_path, "r.yaml", HEAD + DIMENSIONS))
    assert r.dimension("clarity").anchors == r.dimension("accuracy").anchors
    assert rubric_from_dict(rubric_to_dict(r)) == r


def test_a_rubric_path_that_is_not_a_regular_file(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    os.mkfifo(tmp_path / "fifo.yaml")  # reading it would block forever
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")  # reading it would never end
    assert _load_error(tmp_path / "dir.yaml") == f"{tmp_path / 'dir.yaml'}: expected a regular rubric file, got a directory"
    assert "fifo.yaml: expected a regular rubric file, got a FIFO" in _load_error(tmp_path / "fifo.yaml")
    assert "zero.yaml: expected a regular rubric file, got a character device" in _load_error(tmp_path / "zero.yaml")
    assert "missing.json: rubric file does not exist" in _load_error(tmp_path / "missing.json")


def test_size_and_encoding(tmp_path, monkeypatch):
    path = _write(tmp_path, "r.yaml", HEAD + DIMENSIONS)
    monkeypatch.setattr(rubric_io, "MAX_RUBRIC_BYTES", 100)
    assert "r.yaml: rubric file is larger than 100 bytes" in _load_error(path)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes((HEAD + "# caf\xe9\n").encode("latin-1"))
    assert f"{latin}:4: not valid UTF-8" in _load_error(latin)


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """Nine levels of ten aliases: 10**9 strings once expanded, from 10 short lines."""
    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 10)}]" for k in range(1, 9)]
    bomb = "name: [" + ", ".join(f"&a{k} " + level.split(f"&a{k} ", 1)[1] for k, level in enumerate(levels)) + "]\n"
    path = _write(tmp_path, "bomb.yaml", bomb + HEAD.split("\n", 1)[1] + DIMENSIONS)
    message = _load_error(path)
    assert message == f"{path}: YAML expands to more than 1000000 values (an alias bomb?)"


def test_recursive_aliases_duplicate_keys_deep_nesting_and_huge_numbers(tmp_path):
    recursive = HEAD + DIMENSIONS.replace("kind: llm\n    scale: {kind: binary}\n    anchors: *binary",
                                          "kind: rule\n    rule: format\n    params: &p {loop: *p}\n"
                                          "    scale: {kind: binary}\n    anchors: *binary")
    assert "recursive.yaml:14: recursive YAML alias" in _load_error(_write(tmp_path, "recursive.yaml", recursive))
    duplicate = HEAD + "name: other\n" + DIMENSIONS
    assert "duplicate.yaml:4: duplicate key 'name'" in _load_error(_write(tmp_path, "duplicate.yaml", duplicate))
    raw = rubric_to_dict(load_rubric(_write(tmp_path, "r.yaml", HEAD + DIMENSIONS)))
    text = json.dumps(raw).replace('"name": "demo"', '"name": "demo", "name": "other"')
    assert "dup.json: not valid JSON: duplicate key 'name'" in _load_error(_write(tmp_path, "dup.json", text))
    deep = _write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000)
    assert _load_error(deep) == f"{deep}: JSON is nested too deeply"
    assert "deep.yaml: not valid YAML" in _load_error(_write(tmp_path, "deep.yaml", "[" * 5000 + "]" * 5000))
    huge = HEAD.replace("name: demo", "name: " + "9" * 5000)
    assert "huge.yaml: not valid YAML: Exceeds the limit" in _load_error(_write(tmp_path, "huge.yaml", huge))
    assert "huge.json: not valid JSON" in _load_error(_write(tmp_path, "huge.json", '{"name": ' + "9" * 5000 + "}"))


def test_save_is_atomic_and_refuses_a_directory(tmp_path):
    r = load_rubric(_write(tmp_path, "r.yaml", HEAD + DIMENSIONS))
    save_rubric(r, tmp_path / "saved.json")
    assert load_rubric(tmp_path / "saved.json") == r
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(RubricError, match="dir.json: expected a regular rubric file, got a directory"):
        save_rubric(r, tmp_path / "dir.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "r.yaml", "saved.json"]


def test_score_corrections_go_through_the_same_bounded_reader(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(RubricError, match="dir.yaml: expected a regular correction file, got a directory"):
        load_correction(tmp_path / "dir.yaml")
    duplicate = _write(tmp_path, "c.yaml", "format: rubric_jax.correction\nformat: other\n")
    with pytest.raises(RubricError, match="c.yaml:2: duplicate key 'format'"):
        load_correction(duplicate)
