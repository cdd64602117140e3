"""Config blocks as frozen dataclasses that are their own schema: each field says its type (the annotation), its
default, its bounds or choices and its one-line meaning (`setting`), and a block checks itself when it is made.

A block is a frozen dataclass deriving from `Block`. Every field made with `setting(...)` is a config key (its name,
or `key=` where the config spells it otherwise); a field without one is not. Making a block checks each key's type,
bounds and choices, then the block's own `validate()` (rules between its fields), so a block that exists is valid.
A bad value raises `BlockError`, whose message names the key: `rl.group_size=1: expected an integer >= 2`.
`from_mapping` builds a block from a plain mapping (a ConfigDict's `to_dict()`, a run's config.json), naming any
unknown or missing key; `defaults` and `rows` give what configs/common.py and docs/cli.md are generated from.

This module knows no block and no ml_collections: rubric_jax/config_boundary.py turns ConfigDicts into blocks.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from rubric_jax import counts

Bounds = tuple[float, float]


class BlockError(ValueError):
    """A config value a block refuses: `key` (dotted, as the config spells it), the value and why."""

    def __init__(self, key: str, value: Any, why: str):
        self.key, self.value, self.why = key, value, why
        super().__init__(f"{key}={value!r}: {why}")

    def under(self, prefix: str) -> BlockError:
        """The same error for a block that sits at `prefix` ("config.rl", "--judge")."""
        return BlockError(f"{prefix}.{self.key}" if prefix else self.key, self.value, self.why)


def setting(default: Any, doc: str, *, bounds: Bounds | None = None, choices: tuple[Any, ...] | None = None,
            key: str | None = None) -> Any:
    """A config key of a block: its default, one-line meaning (with its source), and for a number its inclusive
    `bounds` (an integer's by `counts.problem`), or the `choices` of an enum-like value. A block class as the
    default makes a nested block (its own defaults)."""
    metadata = {"doc": doc, "bounds": bounds, "choices": choices, "key": key}
    if isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def config_fields(block: type[Block] | Block) -> list[dataclasses.Field]:
    """The fields of a block that are config keys, in declaration order."""
    return [f for f in dataclasses.fields(block) if "doc" in f.metadata]


def config_key(f: dataclasses.Field) -> str:
    """The key a field has in the config (its name unless `setting(key=...)` says otherwise)."""
    return f.metadata["key"] or f.name


class Block:
    """Base of every config block: a frozen dataclass checked when made (types, bounds, choices, `validate`)."""

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in config_fields(self):
            value = getattr(self, f.name)
            why = _problem(value, hints[f.name], f.metadata["bounds"], f.metadata["choices"])
            if why is not None:
                raise BlockError(config_key(f), value, why)
        self.validate()

    @classmethod
    def from_values(cls, values: Mapping[str, Any], where: str = "") -> Block:
        """The block that its config form `values` describes (nested in another block too); `from_mapping` unless a
        block whose config form differs from its fields (the judge's comma-separated checkpoints) says otherwise."""
        return from_mapping(cls, values, where)

    def to_values(self) -> dict[str, Any]:
        """This block's config form, the inverse of `from_values` (`to_mapping` unless a block says otherwise)."""
        return to_mapping(self)

    def validate(self) -> None:
        """Rules between this block's fields; raises `BlockError` through `fail`. None by default."""

    def fail(self, name: str, why: str) -> typing.NoReturn:
        """Refuse this block's field `name` (its config key is named in the error)."""
        f = next(f for f in dataclasses.fields(self) if f.name == name)
        raise BlockError(config_key(f) if "doc" in f.metadata else name, getattr(self, name), why)


def from_mapping(cls: type[Block], values: Mapping[str, Any], where: str = "") -> Block:
    """A block of type `cls` from `values` (exactly its config keys; nested blocks as mappings; lists for tuples),
    every error naming `where.<key>`."""
    fields = {config_key(f): f for f in config_fields(cls)}
    unknown, missing = sorted(set(values) - set(fields)), sorted(set(fields) - set(values))
    if unknown or missing:
        raise BlockError(where or cls.__name__, "...", f"unknown keys {unknown}, missing keys {missing}"
                         if unknown and missing else f"unknown keys {unknown}" if unknown else f"missing keys {missing}")
    hints = _hints(cls)
    kwargs = {}
    for key, f in fields.items():
        value, kind = values[key], hints[f.name]
        if _is_block(kind):
            if not isinstance(value, Mapping):
                raise BlockError(_join(where, key), value, "expected a block of keys")
            value = kind.from_values(value, _join(where, key))
        elif isinstance(value, list) and typing.get_origin(kind) is tuple:
            value = tuple(value)
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except BlockError as e:
        raise e.under(where) from None


def to_mapping(block: Block) -> dict[str, Any]:
    """A block's config keys and values (nested blocks as dicts): the inverse of `from_mapping`."""
    out = {}
    for f in config_fields(block):
        value = getattr(block, f.name)
        out[config_key(f)] = value.to_values() if isinstance(value, Block) else value
    return out


def defaults(cls: type[Block]) -> dict[str, Any]:
    """Every config key of `cls` with its default (nested blocks as dicts)."""
    return cls().to_values()


@dataclasses.dataclass(frozen=True)
class Row:
    """One documented config key: dotted key, type, default, bounds or choices, and meaning."""

    key: str
    kind: str
    default: Any
    allowed: str
    doc: str
    bounds: Bounds | None = None


def rows(cls: type[Block], prefix: str = "", made: Block | None = None) -> list[Row]:
    """Every config key of `cls` (nested blocks flattened, dotted) with its default in `made` (default `cls()`: a
    nested block's default is the one its parent gives) as the config writes it (`to_values`: a field whose config
    form differs, such as the judge's comma-separated checkpoints, shows that form and its type), for generated docs."""
    out, hints, made = [], _hints(cls), cls() if made is None else made
    values = made.to_values()
    for f in config_fields(cls):
        key, kind = _join(prefix, config_key(f)), hints[f.name]
        if _is_block(kind):
            out += rows(kind, key, getattr(made, f.name))
            continue
        bounds, choices, default = f.metadata["bounds"], f.metadata["choices"], values[config_key(f)]
        allowed = (" | ".join(map(str, choices)) if choices else
                   f"[{_number(bounds[0])}, {_number(bounds[1])}]" if bounds else "")
        shown = kind if _problem(default, kind, None, None) is None else type(default)
        out.append(Row(key, _type_name(shown), default, allowed, f.metadata["doc"], bounds))
    return out


def _number(x: float) -> str:
    """A bound as written: an integer in full (a seed's 4294967295), a float shortest (0.5, 1e-06)."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _is_block(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, Block)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a block class (cached: resolving them costs a module lookup per field)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _type_name(kind: Any) -> str:
    if typing.get_origin(kind) is tuple:
        return f"tuple of {_type_name(typing.get_args(kind)[0])}"
    return getattr(kind, "__name__", str(kind))


def _problem(value: Any, kind: Any, bounds: Bounds | None, choices: tuple[Any, ...] | None) -> str | None:
    """Why `value` is not a `kind` within `bounds` or `choices`, or None when it is."""
    if _is_block(kind):
        return None if isinstance(value, kind) else f"expected a {kind.__name__} block"
    if kind is type(None):
        return None if value is None else "expected None"
    if kind is bool:
        return None if isinstance(value, bool) else "expected True or False"
    if kind is int:
        if bounds is not None:
            return counts.problem(value, int(bounds[0]), int(bounds[1]))
        return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "expected a number"
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return f"expected a number in [{bounds[0]:g}, {bounds[1]:g}]"
        if bounds is None and math.isnan(value):
            return "expected a number, not NaN"
    elif kind is str:
        if not isinstance(value, str):
            return "expected a string"
    elif typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        if not isinstance(value, tuple):
            return "expected a tuple"
        why = next((w for v in value if (w := _problem(v, item, bounds, None)) is not None), None)
        if why is not None:
            return f"each item: {why}"
        return None if choices is None or set(value) <= set(choices) else f"expected items of {choices}"
    elif typing.get_origin(kind) in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if not any(_problem(value, option, bounds, None) is None for option in options):
            return f"expected one of the types {[_type_name(o) for o in options]}"
    if choices is not None and value not in choices:
        return f"expected one of {tuple(choices)}"
    return None

