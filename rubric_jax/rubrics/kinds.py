"""Dimension kinds as data: what the rubric schema and the judge-side code need to know of a kind, by name.

A `Kind` says whether its dimensions take a `rule` name and `params` (the rule kind) and whether the LLM judge
scores them (the llm kind: judge prompts, calibration, audits and the judge's context budget count them). The
schema accepts any registered kind. How a kind is scored lives in its scorer (rubric_jax/judges/scorers.py),
whose `register` registers the kind here too; "rule" and "llm" are declared here so that rubrics load without
the judges imported. docs/rubrics.md ("Adding a dimension kind") has a worked example.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Kind:
    """A dimension kind: its name, whether it takes `rule`/`params`, whether the LLM judge scores it."""

    name: str
    takes_rule: bool = False
    judged: bool = False


RULE = Kind("rule", takes_rule=True)
LLM = Kind("llm", judged=True)
_KINDS: dict[str, Kind] = {k.name: k for k in (RULE, LLM)}


def register_kind(kind: Kind) -> Kind:
    """Adds `kind` (registering an equal kind again is a no-op); a different kind under a taken name raises."""
    known = _KINDS.setdefault(kind.name, kind)
    if known != kind:
        raise ValueError(f"dimension kind {kind.name!r} is already registered as {known}")
    return kind


def kind_names() -> tuple[str, ...]:
    """Names of all registered kinds, in registration order."""
    return tuple(_KINDS)


def kind_named(name: str) -> Kind | None:
    """The registered kind `name`, or None."""
    return _KINDS.get(name)
