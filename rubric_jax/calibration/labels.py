"""Calibration inputs: labelled responses, validated line by line against each row's rubric.

A labels file (.jsonl) has one object per line:
  {"question": str, "response": str,
   "labels":  {"<dimension id>": number, ...},           scores by people, on the dimension's raw scale (null: not
                                                          labelled yet, refused; experiments.sample_for_labels)
   "ratings": {"<dimension id>": [number, number, ...]},  recorded scores of several judges (or samples)
   "rubric":  {"extra": [dimension, ...]} | {"replace": rubric}}   optional, rubrics.schema.parse_row_rubric
`labels` or `ratings` (or both) must be present; other fields are ignored. A Prometheus eval file (.json,
e.g. ../shared/data/prometheus/vicuna_eval.json) is read through rubrics.importers: each record's own
1-5 rubric (dimension `criteria`), its three GPT-4 scores as `ratings` and their mean as `labels`.

Every error is one line naming the file, the line and the field: an unknown dimension, a label that is
not a number or lies outside the dimension's scale, rows whose rater counts disagree, an empty file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rubric_jax.jsonl import finite_float, read_jsonl, shown
from rubric_jax.rubrics import kinds
from rubric_jax.rubrics.importers import import_vicuna_eval
from rubric_jax.rubrics.schema import Dimension, Rubric, RubricError, case_rubric_from_row, check_rubric_identities


class LabelsError(ValueError):
    """A malformed labels file or line; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class LabelledItem:
    """One response with its rubric, labels (dimension -> score) and recorded ratings (dimension -> scores)."""

    source: str  # "FILE:LINE" (or "FILE: record K"), for messages and the worst-disagreement list
    question: str
    response: str
    rubric: Rubric
    labels: Mapping[str, float] = dataclasses.field(default_factory=dict)
    ratings: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DimensionInfo:
    """What the statistics need to know about a dimension id: its judge kind and its raw score levels."""

    kind: str
    levels: tuple[int, ...]

    @property
    def judged(self) -> bool:
        """Whether the LLM judge scores the dimension (its kind says so: rubrics/kinds.py)."""
        return kinds.kind_named(self.kind).judged

    @property
    def scale(self) -> tuple[int, int]:
        return self.levels[0], self.levels[-1]


def _score(value: Any, dim: Dimension, where: str) -> float:
    """A label on `dim`'s raw scale, or LabelsError naming where and why (null: not labelled yet)."""
    lo, hi = dim.scale.raw_range
    if value is None:
        raise LabelsError(f"{where}: not labelled yet (null): fill in a score in [{lo}, {hi}] or remove the key")
    number = finite_float(value)
    if number is None:
        raise LabelsError(f"{where}: expected a number, got {shown(value)}")
    if not lo <= number <= hi:
        raise LabelsError(f"{where}: {value!r} is outside the scale [{lo}, {hi}] of dimension {dim.id!r}")
    return number


def _dimension(rubric: Rubric, dim_id: Any, where: str) -> Dimension:
    if dim_id not in rubric.dimension_ids:
        raise LabelsError(f"{where}: unknown dimension {dim_id!r}; the row's rubric {rubric.name!r} has "
                          f"{rubric.dimension_ids}")
    return rubric.dimension(dim_id)


def check_label(rubric: Rubric, dim_id: Any, value: Any, where: str) -> float:
    """A label of one of `rubric`'s dimensions on its raw scale, or LabelsError naming `where`, the field and why."""
    return _score(value, _dimension(rubric, dim_id, where), f"{where}.{dim_id}")


def _item_from_row(row: Mapping[str, Any], lineno: int, where: str, shared: Rubric | None) -> LabelledItem:
    for field in ("question", "response"):
        if not isinstance(row.get(field), str):
            raise LabelsError(f"{where}: field {field!r}: expected a string, got {row.get(field)!r}")
    try:
        rubric = case_rubric_from_row(shared, row.get("rubric"), f"line{lineno}", source=where)
    except RubricError as e:
        raise LabelsError(str(e)) from None
    labels_raw, ratings_raw = row.get("labels"), row.get("ratings")
    if labels_raw is None and ratings_raw is None:
        raise LabelsError(f"{where}: expected a field 'labels' (or 'ratings') with scores per dimension")
    labels, ratings = {}, {}
    for field, raw in (("labels", labels_raw), ("ratings", ratings_raw)):
        if raw is not None and (not isinstance(raw, Mapping) or not raw):
            raise LabelsError(f"{where}: field {field!r}: expected a non-empty mapping dimension id -> score(s), "
                              f"got {raw!r}")
    for dim_id, value in (labels_raw or {}).items():
        labels[dim_id] = check_label(rubric, dim_id, value, f"{where}: labels")
    for dim_id, values in (ratings_raw or {}).items():
        dim = _dimension(rubric, dim_id, f"{where}: ratings")
        if not isinstance(values, list) or len(values) < 2:
            raise LabelsError(f"{where}: ratings.{dim_id}: expected a list of at least 2 scores, got {values!r}")
        ratings[dim_id] = tuple(_score(v, dim, f"{where}: ratings.{dim_id}[{k}]") for k, v in enumerate(values))
    return LabelledItem(where, row["question"], row["response"], rubric, labels, ratings)


def read_labels_jsonl(path: Path, shared: Rubric | None) -> list[LabelledItem]:
    """Validated items of a labels .jsonl file (see the module docstring); one rubric name and version must mean one
    content across its rows' `replace` rubrics (agreement is reported by rubric name and version)."""
    items = [_item_from_row(row, lineno, f"{path}:{lineno}", shared) for lineno, row in read_jsonl(path, LabelsError)]
    try:
        check_rubric_identities(([(shared, "the shared rubric")] if shared is not None else [])
                                + [(item.rubric, item.source) for item in items])
    except RubricError as e:
        raise LabelsError(str(e)) from None
    return items


def read_prometheus_eval(path: Path) -> list[LabelledItem]:
    """A Prometheus absolute-grading eval file (vicuna_eval.json): GPT-4's three scores as ratings, mean as label."""
    try:
        cases = import_vicuna_eval(path)
    except (RubricError, KeyError, TypeError, ValueError) as e:
        raise LabelsError(f"{path}: not a Prometheus eval file: {e}") from None
    items = []
    for k, case in enumerate(cases):
        dim = case.rubric.dimensions[0]
        where = f"{path}: record {k}"
        scores = tuple(_score(v, dim, f"{where}: gpt4_score") for v in case.meta["gpt4_score"])
        items.append(LabelledItem(where, case.prompt, case.meta["response"], case.rubric,
                                  {dim.id: sum(scores) / len(scores)}, {dim.id: scores}))
    return items


def read_items(path: str | Path, shared: Rubric | None) -> list[LabelledItem]:
    """Labelled items from a .jsonl labels file or a Prometheus .json eval file; checks rows agree."""
    path = Path(path)
    if not path.is_file():
        raise LabelsError(f"{path}: labels file does not exist")
    items = read_prometheus_eval(path) if path.suffix.lower() == ".json" else read_labels_jsonl(path, shared)
    if not items:
        raise LabelsError(f"{path}: no labelled rows")
    dimension_info(items)
    return items


def dimension_info(items: Sequence[LabelledItem], llm_only: bool = False) -> dict[str, DimensionInfo]:
    """Kind and levels of every labelled or rated dimension id (with `llm_only`: of every LLM dimension of
    the rows' rubrics instead); an id must mean one scale across rows.

    Raises LabelsError when one dimension id has different kinds or scales on two rows, or when two rows
    record different numbers of ratings for one dimension (rater k must be the same rater on every row).
    """
    info: dict[str, tuple[DimensionInfo, str]] = {}
    raters: dict[str, tuple[int, str]] = {}
    for item in items:
        ids = [d.id for d in item.rubric.dimensions if d.judged] if llm_only else {**item.labels, **item.ratings}
        for dim_id in ids:
            dim = item.rubric.dimension(dim_id)
            this = DimensionInfo(dim.kind, dim.scale.levels)
            first = info.setdefault(dim_id, (this, item.source))
            if first[0] != this:
                raise LabelsError(f"{item.source}: dimension {dim_id!r} is a {this.kind} dimension on scale "
                                  f"{list(this.scale)} here but a {first[0].kind} one on {list(first[0].scale)} "
                                  f"at {first[1]}")
        for dim_id, values in item.ratings.items():
            count, where = raters.setdefault(dim_id, (len(values), item.source))
            if count != len(values):
                raise LabelsError(f"{item.source}: ratings.{dim_id}: {len(values)} raters, but {where} has {count}")
    return {dim_id: value[0] for dim_id, value in info.items()}
