"""HelloBench scoring (../shared/data/hellobench/FORMULA.md; Quehry/HelloBench results/scripts/compute.py).

Per question: weighted = sum_k s_k w_k, the judge's checklist scores s_k in {0, .25, .5, .75, 1} (our
judge's 0-4 integer / 4) times the category's regression weights w_k (sum 100), so weighted is in
[0, 100]. Per task: score = (mean of weighted - 75) * 4, mapping [0, 100] to [-300, 100]. Overall:
the plain mean of the five task scores. A question whose judge did not score every item is left out
of its task's mean and counted (compute.py likewise skips questions whose score list is incomplete).

`score_published_judgements` applies the same formula to HelloBench's published judge outputs
(judgements_main_exp_scores.csv) and lists the models whose judgements do not cover every question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rubric_jax.evaluation.results import (
    Answer,
    BarChart,
    Benchmark,
    BenchmarkResult,
    EvalInputError,
    finite_or_none,
    limited,
    mean_or_none,
)
from rubric_jax.rubrics.importers import (
    HELLOBENCH_TASKS,
    RubricCase,
    hellobench_rubrics,
    hellobench_task_file,
    import_hellobench,
    read_hellobench_judgements,
)

RESCALE_CENTER, RESCALE_FACTOR = 75.0, 4.0  # compute.py: (mean - 75) * 4
JUDGE_LEVELS = 4  # our judge scores each item 0..4; HelloBench's judge 0, .25, .5, .75, 1


def question_score(item_scores_K: Sequence[float], weights_K: Sequence[float]) -> float:
    """sum_k s_k w_k with s in [0, 1] and weights summing to 100: a number in [0, 100]."""
    scores, weights = np.asarray(item_scores_K, np.float64), np.asarray(weights_K, np.float64)
    if scores.shape != weights.shape:
        raise ValueError(f"HelloBench question: {scores.size} checklist scores for {weights.size} weights")
    return float(scores @ weights)


def task_score(question_scores: Sequence[float]) -> float | None:
    """(mean weighted score - 75) * 4; None for a task without scored questions."""
    mean = mean_or_none(question_scores)
    return None if mean is None else (mean - RESCALE_CENTER) * RESCALE_FACTOR


def hellobench_scores(per_task: Mapping[str, Sequence[float]]) -> dict[str, float | None]:
    """{task: task score, ..., "avg": plain mean of the five} from each task's weighted question scores."""
    scores = {task: task_score(per_task.get(task, ())) for task in HELLOBENCH_TASKS}
    values = list(scores.values())
    scores["avg"] = None if None in values else float(np.mean(values))
    return scores


def load_cases(data_dir: Path, data_file: str | None, limit: int | None) -> list[RubricCase]:
    """The five task files (summarization: the reconstructed copy when the original is absent); `limit` per task."""
    if data_file is not None:
        raise EvalInputError(f"--data_file={data_file}: hellobench reads its five task files from --data_dir")
    for task in HELLOBENCH_TASKS:
        if not hellobench_task_file(data_dir, task).is_file():
            raise EvalInputError(f"{hellobench_task_file(data_dir, task)}: HelloBench task file does not exist")
    return [case for task in HELLOBENCH_TASKS for case in limited(import_hellobench(data_dir, task), limit)]


def _table(scores: Mapping[str, float | None], counts: Mapping[str, str]) -> list[tuple[Any, ...]]:
    return [(task, counts.get(task, ""), finite_or_none(scores[task])) for task in (*HELLOBENCH_TASKS, "avg")]


def score(cases: Sequence[RubricCase], answers: Sequence[Answer]) -> BenchmarkResult:
    """Task and overall HelloBench scores of judged answers (0-4 item scores / 4, category weights)."""
    per_task: dict[str, list[float]] = {task: [] for task in HELLOBENCH_TASKS}
    totals = {task: 0 for task in HELLOBENCH_TASKS}
    records = []
    for case, answer in zip(cases, answers):
        task = case.meta["task"]
        totals[task] += 1
        items = None if answer.raw_scores is None else answer.raw_scores / JUDGE_LEVELS
        weighted = None
        if items is not None and not np.isnan(items).any():
            weighted = question_score(items, [d.weight for d in case.rubric.dimensions])
            per_task[task].append(weighted)
        records.append({"task": task, "category": case.meta["category"],
                        "checklist_scores": None if items is None else [finite_or_none(x) for x in items],
                        "weighted_score": weighted})
    scores = hellobench_scores(per_task)
    counts = {task: f"{len(per_task[task])}/{totals[task]}" for task in HELLOBENCH_TASKS}
    summary = {**{k: finite_or_none(v) for k, v in scores.items()},
               "questions_scored": {t: len(per_task[t]) for t in HELLOBENCH_TASKS}, "questions": totals}
    chart = BarChart("HelloBench: (mean weighted checklist score - 75) x 4 per task", (*HELLOBENCH_TASKS, "avg"),
                     tuple(finite_or_none(scores[k]) for k in (*HELLOBENCH_TASKS, "avg")), "score")
    return BenchmarkResult(summary, records, ("task", "questions scored", "score"), _table(scores, counts), chart)


BENCHMARK = Benchmark("hellobench", load_cases, score, judge_mode="all_criteria")


# ------------------------------------------------------------------------------------------ published judgements

def score_published_judgements(path: Path, data_dir: Path, models: Sequence[str] | None = None) -> BenchmarkResult:
    """HelloBench scores of every model whose judgements cover every question of `data_dir`'s task files.

    scores = {"models": {name: {task: x, ..., "avg": x}}, "incomplete": [names]}. A malformed row (unknown
    id, wrong category, wrong number of scores, a duplicate) raises naming its line; with `models`, a named
    model that is absent or incomplete raises too.
    """
    rubrics = hellobench_rubrics(data_dir)
    expected = {task: {c.case_id: c.meta["category"] for c in import_hellobench(data_dir, task)}
                for task in HELLOBENCH_TASKS}
    per_model: dict[str, dict[str, dict[str, float]]] = {}
    seen: dict[tuple[str, str, str], str] = {}
    records = []
    for row in read_hellobench_judgements(path):
        category = expected[row.task].get(row.case_id)
        if category is None:
            raise EvalInputError(f"{row.where}: field 'id': {row.case_id!r} is not a question of task {row.task!r} "
                                 f"in {hellobench_task_file(data_dir, row.task)}")
        if row.category != category:
            raise EvalInputError(f"{row.where}: field 'category': {row.category!r}, but question {row.case_id!r} "
                                 f"is in category {category!r}")
        key = (row.model, row.task, row.case_id)
        if key in seen:
            raise EvalInputError(f"{row.where}: duplicate judgement of {row.case_id!r} by {row.model!r} "
                                 f"(first at {seen[key]})")
        seen[key] = row.where
        weights = [d.weight for d in rubrics[category].dimensions]
        if len(row.scores) != len(weights):
            raise EvalInputError(f"{row.where}: field 'checklist_scores': {len(row.scores)} scores, but category "
                                 f"{category!r} has {len(weights)} checklist items")
        weighted = question_score(row.scores, weights)
        per_model.setdefault(row.model, {t: {} for t in HELLOBENCH_TASKS})[row.task][row.case_id] = weighted
        records.append({"model": row.model, "task": row.task, "id": row.case_id, "category": category,
                        "weighted_score": weighted})
    missing = {model: {task: [i for i in expected[task] if i not in done[task]] for task in HELLOBENCH_TASKS}
               for model, done in per_model.items()}
    for model in models or ():
        if model not in per_model:
            raise EvalInputError(f"{path}: no judgements of model {model!r}; the file has {sorted(per_model)}")
        for task, ids in missing[model].items():
            if ids:
                raise EvalInputError(f"{path}: model {model!r} is missing {len(ids)} of {len(expected[task])} "
                                     f"judgements of task {task!r} (first missing id {ids[0]!r})")
    chosen = sorted(models or per_model)
    incomplete = [m for m in chosen if any(missing[m].values())]
    scored = {m: hellobench_scores({t: list(per_model[m][t].values()) for t in HELLOBENCH_TASKS})
              for m in chosen if m not in incomplete}
    order = sorted(scored, key=lambda m: -scored[m]["avg"])
    rows = [(m, *(scored[m][t] for t in (*HELLOBENCH_TASKS, "avg"))) for m in order]
    notes = tuple(f"Not scored, incomplete judgements: {m} (" + ", ".join(
        f"{t} {len(expected[t]) - len(ids)}/{len(expected[t])}" for t, ids in missing[m].items() if ids) + ")"
        for m in incomplete)
    chart = BarChart(f"HelloBench overall score per model (published judgements, {Path(path).name})",
                     tuple(order), tuple(scored[m]["avg"] for m in order), "avg of the 5 task scores")
    return BenchmarkResult({"models": scored, "incomplete": incomplete}, records,
                           ("model", *HELLOBENCH_TASKS, "avg"), rows, chart, notes)
