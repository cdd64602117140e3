"""Dimension kinds as data: what the rubric schema and the judge-side code need to know of a kind, by name.

A `Kind` names the module whose import registers its scorer, and says whether its dimensions take a `rule` name
and `params` (the rule kind) and whether the LLM judge scores them (the llm kind: judge prompts, calibration,
audits and the judge's context budget count them). The schema accepts any registered kind. How a kind is scored
lives in its scorer (rubric_jax/judges/scorers.py), loaded when first scored; the kinds rubric_jax ships are
declared here, so that a rubric file naming one loads without the judges imported, and `scorers.register`
registers any other at run time. docs/rubrics.md ("Adding a dimension kind") has a worked example.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Kind:
    """A dimension kind: its name, its scorer's module, whether it takes `rule`/`params`, whether the LLM judge
    scores it."""

    name: str
    scorer: str  # the module whose import registers the kind's scorer (scorers.register)
    takes_rule: bool = False
    judged: bool = False


RULE = Kind("rule", "rubric_jax.judges.scorers", takes_rule=True)
LLM = Kind("llm", "rubric_jax.judges.scorers", judged=True)
_KINDS: dict[str, Kind] = {k.name: k for k in (RULE, LLM)}  # a kind shipped with rubric_jax is declared here


def register_kind(kind: Kind) -> Kind:
    """Adds `kind` (registering an equal kind again is a no-op); a different kind under a taken name raises."""
    known = _KINDS.setdefault(kind.name, kind)
    if known != kind:
        raise ValueError(f"dimension kind {kind.name!r} is already registered as {known}")
    return kind


def kind_names() -> tuple[str, ...]:
    """Names of all registered kinds, in registration order."""
    return tuple(_KINDS)


def all_kinds() -> tuple[Kind, ...]:
    """All registered kinds, in registration order."""
    return tuple(_KINDS.values())


def kind_named(name: str) -> Kind | None:
    """The registered kind `name`, or None."""
    return _KINDS.get(name)
