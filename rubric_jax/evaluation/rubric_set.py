"""Any rubric set, QuRL-Test style: the project's question jsonl whose rows carry their own rubric R*(q).

Rows are read by `data.load_questions` ({"id", "question", "category", "lang"} + "rubric": {"replace":
rubric} or {"extra": [dimension, ...]} on top of a shared rubric, `--rubric`). The score of an answer is
the rubric's own aggregate in [0, 1], exactly the training reward (judges/reward.py); the benchmark
reports its mean x 100 overall and per category. Answers whose reward is not ok (a missing gate, no
scored dimension) are left out and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rubric_jax import data
from rubric_jax.evaluation.results import (
    Answer,
    BarChart,
    Benchmark,
    BenchmarkResult,
    EvalInputError,
    data_file,
    finite_or_none,
    limited,
    mean_or_none,
)
from rubric_jax.rubrics.importers import RubricCase
from rubric_jax.rubrics.schema import Rubric


def rubric_set_cases(path: Path, shared: Rubric | None) -> list[RubricCase]:
    """Question rows -> cases with their rubric (the row's replacement, or `shared` plus the row's extras)."""
    cases = []
    for q in data.load_questions(path):
        if q.replace_rubric is None and shared is None:
            raise EvalInputError(f"{path}: question {q.id!r} has no 'rubric': {{'replace': ...}} and no shared "
                                 "rubric was given (--rubric)")
        rubric = q.replace_rubric if shared is None else data.question_rubric(shared, q)
        cases.append(RubricCase(q.id, q.question, rubric, None,
                                {"category": q.category, "lang": q.lang, "difficulty": q.difficulty}))
    return cases


def make_benchmark(shared: Rubric | None) -> Benchmark:
    """The rubric_set benchmark over `--data_dir/--data_file`, with an optional shared rubric."""

    def load_cases(data_dir: Path, name: str | None, limit: int | None) -> list[RubricCase]:
        return limited(rubric_set_cases(data_file(data_dir, name, None, "rubric_set"), shared), limit)

    return Benchmark("rubric_set", load_cases, score, judge_mode="per_dimension")


def score(cases: Sequence[RubricCase], answers: Sequence[Answer]) -> BenchmarkResult:
    """Mean reward x 100, overall and per category, and the mean normalised score of each dimension id."""
    by_category: dict[str, list[float]] = {}
    records = []
    for case, answer in zip(cases, answers):
        if answer.reward is not None:
            by_category.setdefault(case.meta["category"], []).append(answer.reward)
        raw = answer.raw_scores if answer.raw_scores is not None else np.full(len(case.rubric.dimensions), np.nan)
        records.append({"category": case.meta["category"], "rubric_name": case.rubric.name,
                        "rubric_hash": case.rubric.content_hash, "reward": answer.reward,
                        "scores": {d.id: finite_or_none(x) for d, x in zip(case.rubric.dimensions, raw)}})
    rewards = [r for v in by_category.values() for r in v]
    mean = mean_or_none(rewards)
    categories = {c: 100 * float(np.mean(v)) for c, v in sorted(by_category.items())}
    summary = {"score": None if mean is None else 100 * mean, "categories": categories,
               "answers": len(cases), "answers_scored": len(rewards)}
    rows = [(c, len(by_category[c]), s) for c, s in categories.items()]
    rows.append(("overall", len(rewards), summary["score"]))
    notes = ((f"{len(cases) - len(rewards)} answer(s) not scored: not generated, or the reward was not ok "
              "(a gate or every dimension without a score).",) if len(rewards) < len(cases) else ())
    chart = BarChart("Rubric set: mean reward x 100 per category", (*categories, "overall"),
                     (*categories.values(), finite_or_none(summary["score"])), "score (0-100)")
    return BenchmarkResult(summary, records, ("category", "answers scored", "score (0-100)"), rows, chart, notes)
