"""Dimension kinds as registered scorers: how each kind's dimensions of a reward call are scored.

A `Scorer` scores the dimensions of one kind (rubrics/kinds.py); `register` adds it, the way `rules._register`
adds rules, and `RubricReward` (judges/reward.py) composes every registered scorer without naming a kind:
  prepare   once per distinct rubric, on the dimensions of its kind: builds what scoring needs, or raises
            RubricError naming rubric and dimension (an unknown rule, an LLM dimension with no judge);
  score     the call's rows, each with its dimensions of that kind, -> raw scores on each dimension's scale
            (NaN = missing, with a cause), plus counters for details;
  gated     with gates first, the counters of the dimensions not asked for (a deferred scorer's rows whose gate
            already failed).
Non-deferred scorers run first; with gates first, a gate they score that failed vetoes the row, so deferred
scorers (the LLM judge: slow, paid) are not asked about it. Every registered scorer is called on every call,
with no rows if the batch has none of its kind (the LLM judge is collective: a process with no LLM dimension
still joins another's judge call).

Built in: "rule" (rules.py, once per distinct rubric over its rows, vectorised over the batch) and "llm"
(llm_judge.py, every LLM dimension of every row in one batched judge pass). Adding a kind is one new file with
its scorer and a `register` call: docs/rubrics.md ("Adding a dimension kind") has a worked example.
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from rubric_jax import distributed, text
from rubric_jax.judges.llm_judge import Judge, judge_rows
from rubric_jax.judges.rules import MAX_RUBRIC_PHRASES, Rule, RuleError, make_rule, rule_scores
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.judges.store import VerdictStore
from rubric_jax.rubrics import kinds
from rubric_jax.rubrics.schema import Dimension, Rubric, RubricError


@dataclasses.dataclass(frozen=True)
class Judging:
    """What a reward gives its scorers: the LLM judges, their spec and the cascade's refining judges."""

    judges: tuple[Judge, ...] = ()
    spec: JudgeSpec = JudgeSpec()
    refiners: tuple[Judge, ...] = ()


@dataclasses.dataclass(frozen=True)
class Batch:
    """One reward call's rows as one scorer sees them: `dims[n]` are row n's dimensions of the scorer's kind
    (none on a gated row), `views[reads][n]` row n's text of the part `reads`, `prepared[content hash]` what
    `prepare` gave for that rubric."""

    questions: Sequence[str]
    views: Mapping[str, Sequence[str]]
    rubrics: Sequence[Rubric]
    dims: Sequence[Sequence[Dimension]]
    prepared: Mapping[str, Any]
    key: jax.Array | None = None
    store: VerdictStore | None = None


@dataclasses.dataclass(frozen=True)
class Cells:
    """Raw scores [R, K] of rows `rows` on dimensions `dims` (NaN = missing) and each cell's failure cause."""

    rows: Sequence[int]
    dims: Sequence[Dimension]
    raw: np.ndarray
    causes: Any  # [R, K] strings, or one string for every cell


@dataclasses.dataclass(frozen=True)
class Scored:
    """What a scorer gives back: scored cells and counters for the reward's details."""

    cells: list[Cells] = dataclasses.field(default_factory=list)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


class Scorer(Protocol):
    """Scores the dimensions of one kind (module docstring)."""

    kind: kinds.Kind
    deferred: bool  # scored after the others; with gates first, not on a row whose gate already failed

    def prepare(self, rubric: Rubric, dims: Sequence[Dimension], judging: Judging) -> Any:
        """What scoring `rubric`'s dimensions `dims` (all of this kind) needs; raises RubricError."""
        ...

    def score(self, batch: Batch, judging: Judging) -> Scored:
        """Raw scores of `batch.dims`, with causes and counters."""
        ...

    def gated(self, dims: Sequence[Sequence[Dimension]], judging: Judging) -> dict[str, Any]:
        """Counters of the dimensions `dims` (per row) not asked for because a gate of the row failed."""
        ...


_SCORERS: dict[str, Scorer] = {}


def register(scorer: Scorer) -> Scorer:
    """Adds `scorer` as the scorer of its kind (and the kind to the rubric schema); a kind is scored once."""
    if scorer.kind.name in _SCORERS:
        raise ValueError(f"dimension kind {scorer.kind.name!r} already has a scorer: {_SCORERS[scorer.kind.name]}")
    kinds.register_kind(scorer.kind)
    _SCORERS[scorer.kind.name] = scorer
    return scorer


def scorers() -> list[Scorer]:
    """The scorer of every registered kind (importing the module of any not loaded yet), non-deferred ones first,
    each group in registration order; a kind whose module registers no scorer raises."""
    for kind in kinds.all_kinds():
        if kind.name not in _SCORERS:
            importlib.import_module(kind.scorer)
            if kind.name not in _SCORERS:
                raise ValueError(f"dimension kind {kind.name!r}: importing {kind.scorer} registered no scorer for it")
    return sorted(_SCORERS.values(), key=lambda s: s.deferred)


class RuleScorer:
    """Rule dimensions (rules.py): each built once per rubric, scored once per distinct rubric over its rows."""

    kind = kinds.RULE
    deferred = False

    def prepare(self, rubric: Rubric, dims: Sequence[Dimension], judging: Judging) -> dict[str, Rule]:
        """The built rule of each dimension id; no more than MAX_RUBRIC_PHRASES phrases in all."""
        built: dict[str, Rule] = {}
        for dim in dims:
            try:
                built[dim.id] = make_rule(dim.rule, dim.params)
            except RuleError as e:
                raise RubricError(f"rubric {rubric.name!r}: dimension {dim.id!r}: {e}") from None
        if sum(rule.phrase_count() for rule in built.values()) > MAX_RUBRIC_PHRASES:
            worst = max(built, key=lambda k: built[k].phrase_count())
            raise RubricError(f"rubric {rubric.name!r}: its rule dimensions search for more than {MAX_RUBRIC_PHRASES} "
                              f"phrases in all (dimension {worst!r} alone has {built[worst].phrase_count()}); "
                              "each is a search of every response")
        return built

    def score(self, batch: Batch, judging: Judging) -> Scored:
        """Each rule dimension over the rows of each distinct rubric, vectorised over those rows."""
        groups: dict[str, list[int]] = {}
        for i, rubric in enumerate(batch.rubrics):
            if batch.dims[i]:
                groups.setdefault(rubric.content_hash, []).append(i)
        cells = []
        for h, rows in groups.items():
            for dim in batch.dims[rows[0]]:
                rule = batch.prepared[h][dim.id]
                lo, hi = dim.scale.raw_range
                raw = rule_scores(rule, [batch.views[dim.reads][i] for i in rows], lo, hi)
                cells.append(Cells(rows, [dim], np.asarray(raw)[:, None], rule.failure_cause))
        return Scored(cells)

    def gated(self, dims: Sequence[Sequence[Dimension]], judging: Judging) -> dict[str, Any]:
        """Nothing: rules are never deferred."""
        return {}


class LlmScorer:
    """LLM dimensions (llm_judge.py): every LLM dimension of every row in one batched, collective judge pass."""

    kind = kinds.LLM
    deferred = True

    def prepare(self, rubric: Rubric, dims: Sequence[Dimension], judging: Judging) -> None:
        """Checks a judge is configured."""
        if dims and not judging.judges:
            raise RubricError(
                f"rubric {rubric.name!r}: dimension {dims[0].id!r} is an LLM dimension but no judge is "
                "configured (give a judge checkpoint, or make it a rule dimension)"
            )

    def score(self, batch: Batch, judging: Judging) -> Scored:
        """The judges' scores of `batch.dims`; joins another process's judge call when this one has none."""
        judged_anywhere = bool(judging.judges) and distributed.max_over_processes(int(any(batch.dims)))[0] > 0
        if not (any(batch.dims) or judged_anywhere):
            return Scored()
        if batch.key is None:
            raise ValueError("reward: rubrics with LLM dimensions need an explicit PRNG `key` for the judge")
        rows, judged_dims = split_by_reads(batch.dims)
        judged = judge_rows(judging.judges, judging.spec, [batch.questions[i] for i, _ in rows],
                            [batch.views[reads][i] for i, reads in rows], judged_dims, batch.key, batch.store,
                            judging.refiners)
        cells = [Cells([i], dims, np.asarray(scores, dtype=float)[None, :], np.asarray(causes, dtype=object)[None, :])
                 for (i, _), dims, scores, causes in zip(rows, judged_dims, judged.scores, judged.causes)]
        return Scored(cells, dict(judged.details))

    def gated(self, dims: Sequence[Sequence[Dimension]], judging: Judging) -> dict[str, Any]:
        """judge_prompts_gated: the first-round judge prompts saved (every judge, every sample; no retries); in the
        group layout, the (response, criterion) items left out of their groups' prompts."""
        _, groups = split_by_reads(dims)
        requests = sum(map(len, groups)) if judging.spec.mode == "per_dimension" else len(groups)
        return {"judge_prompts_gated": requests * judging.spec.samples * len(judging.judges)}


def split_by_reads(llm_dims: Sequence[Sequence[Dimension]]) -> tuple[list[tuple[int, str]], list[list[Dimension]]]:
    """The LLM judge's rows: one per (row, part read) with the row's dimensions that read that part (the judge is
    shown that part: an all_criteria prompt never mixes parts)."""
    rows, dims = [], []
    for i, row_dims in enumerate(llm_dims):
        for reads in text.READS:
            reading = [d for d in row_dims if d.reads == reads]
            if reading:
                rows.append((i, reads))
                dims.append(reading)
    return rows, dims


register(RuleScorer())
register(LlmScorer())
