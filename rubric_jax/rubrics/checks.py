"""The field checks every rubric object's validation is built from: one error type, bounded quoting of the
offending value (`short_repr`), and typed checks of strings, integers, numbers, plain-JSON data and keys.

Every check names the dimension and field, and quotes at most a `short_repr` of the value, so a hostile
file (a YAML alias bomb, a 5000-digit integer, a lone surrogate) gives a one-line message in bounded time.
"""
from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from rubric_jax.jsonl import finite_float

MAX_PARAM_DEPTH = 16  # nesting of a rule's params (lists and mappings)


class RubricError(ValueError):
    """A malformed rubric; the message names the source file, the dimension id and the field."""


class RubricWarning(UserWarning):
    """Advice-level problems (e.g. more than 7 dimensions) that do not make a rubric invalid."""


class _ShortRepr(reprlib.Repr):
    """reprlib with small limits that also survives ints too long for `repr` (Python's 4300-digit cap)."""

    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxtuple, self.maxset = 3, 4, 6, 6, 6
        self.maxfrozenset = self.maxdeque = self.maxarray = 6
        self.maxstring, self.maxother, self.maxlong = 80, 80, 40

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:
            return f"<integer of about {int(x.bit_length() * 0.30103)} digits>"


_SHORT_REPR = _ShortRepr()


def short_repr(value: Any, limit: int = 200) -> str:
    """`repr(value)` cut to about `limit` characters, in time bounded by the limits, not by the value.

    Every validation error quotes the offending value through this, so a YAML alias bomb, a huge list or
    a megabyte string gives a one-line message (a plain repr of such a value can take gigabytes).
    """
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def where(dim_id: str | None, field: str) -> str:
    """Location prefix `dimension 'x': field 'y'` (or just the field for rubric-level fields)."""
    return f"dimension {short_repr(dim_id)}: field {field!r}" if dim_id is not None else f"field {field!r}"


def fail(dim_id: str | None, field: str, expected: str, got: Any) -> RubricError:
    """A RubricError naming the dimension, field, expectation and offending value."""
    return RubricError(f"{where(dim_id, field)}: expected {expected}, got {short_repr(got)}")


def encodable(text: str) -> bool:
    """True unless `text` holds a lone surrogate (JSON '\\ud800' parses to one; UTF-8 cannot encode it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_str(value: Any, dim_id: str | None, field: str, *, nonempty: bool = True) -> str:
    """Return `value` if it is a (non-empty) string that UTF-8 can encode, else raise."""
    if not isinstance(value, str) or (nonempty and not value.strip()):
        raise fail(dim_id, field, "a non-empty string" if nonempty else "a string", value)
    if not encodable(value):
        raise fail(dim_id, field, "text without lone surrogates (it must be encodable as UTF-8)", value)
    return value


def check_int(value: Any, dim_id: str | None, field: str, bound: int | None = None) -> int:
    """Return `value` if it is an int (not a bool), with |value| <= bound when given, else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(dim_id, field, "an integer", value)
    if bound is not None and abs(value) > bound:
        raise fail(dim_id, field, f"an integer in [-{bound}, {bound}]", value)
    return value


def check_number(value: Any, dim_id: str | None, field: str, bounds: tuple[float, float] | None = None) -> float:
    """Return `value` as a finite float (ints accepted, bools not), inside `bounds` when given, else raise."""
    number = finite_float(value)
    if number is None:
        raise fail(dim_id, field, "a finite number", value)
    if bounds is not None and not bounds[0] <= number <= bounds[1]:
        raise fail(dim_id, field, f"a number in [{bounds[0]:g}, {bounds[1]:g}] (rewards are computed in float32)",
                    value)
    return number


def check_json_value(value: Any, dim_id: str | None, field: str, depth: int = 0) -> None:
    """Raise unless `value` is plain JSON data (what the content hash serialises): null, bool, int, finite
    float, encodable str, list, or mapping with string keys, nested at most MAX_PARAM_DEPTH deep."""
    if depth > MAX_PARAM_DEPTH:
        raise fail(dim_id, field, f"data nested at most {MAX_PARAM_DEPTH} deep", value)
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        check_int(value, dim_id, field, bound=2**63)
    elif isinstance(value, float):
        check_number(value, dim_id, field)
    elif isinstance(value, str):
        check_str(value, dim_id, field, nonempty=False)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_json_value(item, dim_id, field, depth + 1)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_str(key, dim_id, f"{field} key", nonempty=False)
            check_json_value(item, dim_id, f"{field}.{key}", depth + 1)
    else:
        raise fail(dim_id, field, "JSON data (null, bool, number, string, list or mapping)", value)


def check_strings(value: Any, dim_id: str | None, field: str) -> tuple[str, ...]:
    """Return a tuple of non-empty strings from a list/tuple, else raise."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise fail(dim_id, field, "a list of strings", value)
    return tuple(check_str(v, dim_id, field) for v in value)


def check_keys(d: Any, allowed: Sequence[str], required: Sequence[str], dim_id: str | None, what: str) -> None:
    """Reject a non-mapping, unknown keys and missing required keys of a raw dict."""
    if not isinstance(d, Mapping):
        raise fail(dim_id, what, "a mapping", d)
    unknown = sorted(set(d) - set(allowed), key=str)
    if unknown:
        raise RubricError(f"{where(dim_id, what)}: unknown field(s) {short_repr(unknown)}; allowed: {list(allowed)}")
    missing = [k for k in required if k not in d]
    if missing:
        raise RubricError(f"{where(dim_id, what)}: missing required field(s) {missing}")
