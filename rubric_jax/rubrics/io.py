"""Rubric files: JSON and YAML load/save, bounded against hostile files, with a save-time version guard.

`load_document` is the one reader of rubric-side JSON/YAML files (rubrics, score corrections). It reads
only regular files of at most `max_bytes` (a FIFO would block, /dev/zero never end).
YAML goes through the safe loader, and the parsed node graph is checked before any Python object is built:
at most MAX_YAML_NODES nodes once aliases are expanded (an alias bomb is a few lines that expand to
billions of nodes), no recursive alias, no duplicate key in a mapping (JSON too). Every problem is a
RubricError naming the file (and the line where YAML knows it).

Saving over an existing file whose content hash differs requires a higher version and a new changelog
entry for it (old entries kept as a prefix): a rubric change must never be silent (RubricRL 7). Saves are
atomic (rubric_jax.files).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rubric_jax.files import PathError, read_text, write_atomic
from rubric_jax.rubrics.schema import Rubric, RubricError, parse_version, rubric_from_dict, rubric_to_dict, short_repr

SUFFIXES = (".json", ".yaml", ".yml")
MAX_RUBRIC_BYTES = 16 << 20  # far above any real rubric (HealthBench's largest is a few kB)
MAX_YAML_NODES = 1_000_000  # YAML nodes after alias expansion; 1000 dimensions of 101 anchors stay below
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _suffix(path: Path, what: str = "rubric") -> str:
    """File suffix, or RubricError when it is neither JSON nor YAML."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise RubricError(f"{path}: expected a {what} file ending in {SUFFIXES}, got suffix {suffix!r}")
    return suffix


def _check_yaml_graph(root: yaml.Node, source: str) -> None:
    """Raise unless the node graph expands to at most MAX_YAML_NODES nodes, has no cycle and no duplicate key.

    Aliases make the graph a DAG whose expansion can be exponential in its size; the expanded size is
    computed once per distinct node (memoised), so this check is linear in the file.
    """
    expanded: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in expanded:
            return expanded[id(node)]
        if id(node) in active:
            raise RubricError(f"{source}:{node.start_mark.line + 1}: recursive YAML alias (a value contains itself)")
        active.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in seen:
                        raise RubricError(f"{source}:{key.start_mark.line + 1}: duplicate key {short_repr(key.value)}")
                    seen.add(key.value)
                total += size(key) + size(value)
        if total > MAX_YAML_NODES:
            raise RubricError(f"{source}: YAML expands to more than {MAX_YAML_NODES} values (an alias bomb?)")
        active.discard(id(node))
        expanded[id(node)] = total
        return total

    size(root)


def loads_yaml(text: str, source: str) -> Any:
    """Parse YAML with the safe loader after bounding its expanded size (see `_check_yaml_graph`)."""
    loader = _YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_graph(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object_pairs_hook: a dict, or ValueError on a repeated key (json would keep the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {short_repr(key)}")
        out[key] = value
    return out


def parse_document(text: str, fmt: str, source: str) -> Any:
    """Parse 'json' or 'yaml' text within the bounds above; every error is a RubricError starting with `source`."""
    try:
        raw = json.loads(text, object_pairs_hook=_unique_keys) if fmt == "json" else loads_yaml(text, source)
    except RubricError:
        raise
    except (yaml.YAMLError, ValueError) as e:  # json.JSONDecodeError is a ValueError; so is a 5000-digit int
        message = " ".join(str(e).split())[:300]
        raise RubricError(f"{source}: not valid {fmt.upper()}: {message}") from None
    except RecursionError:
        raise RubricError(f"{source}: {fmt.upper()} is nested too deeply") from None
    return raw


def load_document(path: str | Path, what: str = "rubric", max_bytes: int | None = None) -> Any:
    """The parsed content of a .json, .yaml or .yml file, read and parsed within the bounds above."""
    path = Path(path)
    suffix = _suffix(path, what)
    try:
        text = read_text(path, what, MAX_RUBRIC_BYTES if max_bytes is None else max_bytes)
    except PathError as e:
        raise RubricError(str(e)) from None
    return parse_document(text, "json" if suffix == ".json" else "yaml", str(path))


def loads_rubric(text: str, fmt: str, source: str) -> Rubric:
    """Parse 'json' or 'yaml' text and validate it as a rubric; errors are RubricErrors starting with `source`."""
    return rubric_from_dict(parse_document(text, fmt, source), source=source)


def load_rubric(path: str | Path) -> Rubric:
    """Read and validate one rubric file (.json, .yaml, .yml); errors name the file."""
    return rubric_from_dict(load_document(path, "rubric"), source=str(path))


def dumps_document(d: Any, fmt: str) -> str:
    """A document as 'json' or 'yaml' text (UTF-8 kept, key order kept): what `load_document` reads back."""
    if fmt == "json":
        return json.dumps(d, ensure_ascii=False, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(d, sort_keys=False, allow_unicode=True, width=100)
    raise ValueError(f"format: expected 'json' or 'yaml', got {fmt!r}")


def dumps_rubric(rubric: Rubric, fmt: str) -> str:
    """Serialise to 'json' or 'yaml' text (UTF-8 kept, field order as in rubric_to_dict)."""
    return dumps_document(rubric_to_dict(rubric), fmt)


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
    """Write a rubric as JSON or YAML (by suffix), atomically; refuses an unversioned change to an existing file."""
    path = Path(path)
    suffix = _suffix(path)
    if path.exists():
        check_revision(load_rubric(path), rubric, str(path))
    try:
        write_atomic(path, dumps_rubric(rubric, "json" if suffix == ".json" else "yaml"))
    except OSError as e:
        raise RubricError(f"{path}: cannot write: {e.strerror or e}") from None


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
