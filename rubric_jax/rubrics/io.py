"""Rubric files: JSON and YAML (safe_load only) load/save, with a save-time version/changelog guard.

Saving over an existing file whose content hash differs requires a higher version and a new changelog
entry for it (old entries kept as a prefix): a rubric change must never be silent (RubricRL 7).
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from rubric_jax.rubrics.schema import Rubric, RubricError, parse_version, rubric_from_dict, rubric_to_dict

SUFFIXES = (".json", ".yaml", ".yml")


def _suffix(path: Path) -> str:
    """File suffix, or RubricError when it is neither JSON nor YAML."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise RubricError(f"{path}: expected a rubric file ending in {SUFFIXES}, got suffix {suffix!r}")
    return suffix


def load_rubric(path: str | Path) -> Rubric:
    """Read and validate one rubric file (.json, .yaml, .yml); errors name the file."""
    path = Path(path)
    suffix = _suffix(path)
    text = path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise RubricError(f"{path}: not valid {suffix[1:].upper()}: {e}") from None
    return rubric_from_dict(raw, source=str(path))


def dumps_rubric(rubric: Rubric, fmt: str) -> str:
    """Serialise to 'json' or 'yaml' text (UTF-8 kept, field order as in rubric_to_dict)."""
    d = rubric_to_dict(rubric)
    if fmt == "json":
        return json.dumps(d, ensure_ascii=False, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(d, sort_keys=False, allow_unicode=True, width=100)
    raise ValueError(f"format: expected 'json' or 'yaml', got {fmt!r}")


def check_revision(old: Rubric, new: Rubric, source: str) -> None:
    """Raise unless `new` may replace `old`: same content, or a higher version with a new changelog entry.

    A Rubric's last changelog entry is always its own version, so an append-only changelog plus a higher
    version means a new entry was added for it.
    """
    if old.changelog != new.changelog[: len(old.changelog)]:
        raise RubricError(f"{source}: changelog is append-only; the entries on disk must stay a prefix of the new ones")
    if old.content_hash == new.content_hash:
        return
    if parse_version(new.version) <= parse_version(old.version):
        raise RubricError(
            f"{source}: content changed (hash {old.content_hash[:12]} -> {new.content_hash[:12]}) but version "
            f"{new.version!r} is not higher than {old.version!r} on disk; use with_version(...)")


def save_rubric(rubric: Rubric, path: str | Path) -> None:
    """Write a rubric as JSON or YAML (by suffix); refuses an unversioned change to an existing file."""
    path = Path(path)
    suffix = _suffix(path)
    if path.exists():
        check_revision(load_rubric(path), rubric, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_rubric(rubric, "json" if suffix == ".json" else "yaml"), encoding="utf-8")


def load_rubric_dir(directory: str | Path) -> dict[str, Rubric]:
    """Every rubric file in a directory, keyed by file stem; duplicate stems are an error."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RubricError(f"{directory}: expected a directory of rubric files")
    out: dict[str, Rubric] = {}
    for path in sorted(p for p in directory.iterdir() if p.suffix.lower() in SUFFIXES):
        if path.stem in out:
            raise RubricError(f"{path}: a rubric named {path.stem!r} is already loaded from another file")
        out[path.stem] = load_rubric(path)
    return out
