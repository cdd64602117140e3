"""What flows through an evaluation: a benchmark's cases, the policy's answers, and what scoring returns.

A benchmark (one module each: hellobench, longbench_write, healthbench, biggen, rubric_set) is a
`Benchmark`: how to read its cases (`rubrics.importers.RubricCase`: prompt, rubric, reference, meta),
how its judge reads the rubric, and `score(cases, answers) -> BenchmarkResult` that applies the
benchmark's own formula (../shared/data/*/FORMULA.md) to the judged answers. The harness
(harness.py) generates and judges; nothing here touches a model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rubric_jax.rubrics.importers import RubricCase

FINISH_PROMPT_TOO_LONG = "prompt_too_long"  # next to sampling's "stop" / "length": the case was not generated


class EvalInputError(ValueError):
    """Input an evaluation cannot use; the message names the file (and line, field, value where there is one)."""


class EvalFailed(RuntimeError):
    """An evaluation that ran but scored nothing (every judged answer lacks every score); the message says why."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """The policy's answer to one case and the judge's verdicts on it."""

    response: str | None  # decoded text; None when the case was not generated
    finish_reason: str  # "stop" | "length" | FINISH_PROMPT_TOO_LONG
    tokens: int  # generated tokens, including the stop token
    judged_text: str | None  # the answer (text.parts), as judges of "answer" dimensions and a length count read it
    format_ok: bool | None  # think_answer format: the answer came from a closed <answer>...</answer>; None in plain
    raw_scores: np.ndarray | None  # [D] the case rubric's dimensions, raw scale; NaN = judge failed; None = not judged
    reward: float | None  # the rubric's aggregate in [0, 1] (the training reward); None when not judged or not ok

    @property
    def judged(self) -> bool:
        return self.raw_scores is not None


@dataclasses.dataclass(frozen=True)
class BarChart:
    """Bars (optionally with error bars) of named scores."""

    title: str
    labels: tuple[str, ...]
    values: tuple[float | None, ...]
    ylabel: str
    errors: tuple[float | None, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ScatterChart:
    """Points (x, y) on log-log axes with the y = x diagonal (LongBench-Write: output vs required length)."""

    title: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    xlabel: str
    ylabel: str


@dataclasses.dataclass(frozen=True)
class BenchmarkResult:
    """Benchmark scores (summary.json "scores"), one record per case, a table and a chart a person reads."""

    scores: dict[str, Any]
    records: list[dict[str, Any]]
    table_headers: tuple[str, ...]
    table_rows: list[tuple[Any, ...]]
    chart: BarChart | ScatterChart
    notes: tuple[str, ...] = ()  # lines printed under the table (what was left out, and why)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """How one benchmark is read, judged and scored."""

    name: str
    load_cases: Callable[[Path, str | None, int | None], list[RubricCase]]  # (data_dir, data_file, limit)
    score: Callable[[Sequence[RubricCase], Sequence[Answer]], BenchmarkResult]
    judge_mode: str  # per_dimension (one judge call per criterion) | all_criteria (one per answer): the benchmark's way
    judge_optional: bool = False  # True: scores that need no judge are still reported without one
    judge_sees_reference: bool = False  # the judge prompt shows the case's reference answer (Prometheus)


def finite_or_none(x: float | None) -> float | None:
    """A float for JSON, None for missing or non-finite values (summary.json never holds NaN)."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


def mean_or_none(values: Sequence[float]) -> float | None:
    """Plain mean, None for an empty sequence."""
    return float(np.mean(values)) if len(values) else None


def limited(cases: list[RubricCase], limit: int | None) -> list[RubricCase]:
    """The first `limit` cases (all when None)."""
    return cases if limit is None else cases[:limit]


def data_file(data_dir: Path, name: str | None, default: str | None, benchmark: str) -> Path:
    """`data_dir/name` (`name` may be absolute), or the benchmark's default file; raises if it does not exist."""
    if name is None and default is None:
        raise EvalInputError(f"{data_dir}: {benchmark} needs --data_file (one of "
                             f"{sorted(p.name for p in data_dir.glob('*.jsonl'))})")
    path = data_dir / (name or default)
    if not path.is_file():
        raise EvalInputError(f"{path}: {benchmark} data file does not exist")
    return path
