"""HealthBench scoring (../shared/data/healthbench/FORMULA.md; openai/simple-evals healthbench_eval.py).

Per example: score = sum of the points of the criteria the grader found met (a negative-points
criterion met = the undesirable behaviour is present, so it subtracts) / sum of the positive points.
It can be negative and is not clipped. Benchmark: clip(mean over examples, 0, 1); bootstrap std = std
(ddof 0) of the clipped means of 1,000 resamples with replacement, drawn from a seeded generator.
Tag scores: each example tag (theme) records the example's score; each rubric tag (axis, cluster,
level) applies the same formula to the criteria carrying it (kept when one of them is positive); each
tag is then clipped and bootstrapped like the overall score.

The grader (our LLM judge, one call per criterion) answers met (1) / not met (0). HealthBench re-asks
until every criterion has a verdict; an example whose verdicts are still incomplete after the judge's
retries is left out of every mean and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rubric_jax.evaluation.results import (
    Answer,
    BarChart,
    Benchmark,
    BenchmarkResult,
    data_file,
    limited,
)
from rubric_jax.rubrics.importers import RubricCase, import_healthbench

BOOTSTRAP_SAMPLES = 1000  # simple-evals _compute_clipped_stats
BOOTSTRAP_SEED = 0  # simple-evals draws from numpy's global state; a fixed seed makes reruns identical


def example_score(points_K: Sequence[float], met_K: Sequence[bool]) -> float | None:
    """sum of met points / sum of positive points (unclipped); None when no criterion is positive."""
    points, met = np.asarray(points_K, np.float64), np.asarray(met_K, bool)
    possible = points[points > 0].sum()
    return None if possible == 0 else float(points[met].sum() / possible)


def clipped_mean(values: Sequence[float]) -> float:
    """clip(mean(values), 0, 1): the clip comes after the average, not per example."""
    return float(np.clip(np.mean(values), 0.0, 1.0))


def bootstrap_std(values: Sequence[float], rng: np.random.Generator, samples: int = BOOTSTRAP_SAMPLES) -> float:
    """Std of `clipped_mean` over `samples` resamples (with replacement, same size) of `values`."""
    values = np.asarray(values, np.float64)
    picks_SxN = rng.choice(values, size=(samples, values.size), replace=True)
    return float(np.std(np.clip(picks_SxN.mean(axis=1), 0.0, 1.0)))


def tag_values(cases: Sequence[RubricCase], met: Sequence[np.ndarray]) -> dict[str, list[float]]:
    """Per tag, the per-example scores it collects (example tags: the example's score; rubric tags: the
    formula over that tag's criteria, when one of them is positive)."""
    out: dict[str, list[float]] = {}
    for case, met_K in zip(cases, met):
        points_K = case.rubric.points
        overall = example_score(points_K, met_K)
        for tag in case.meta["example_tags"]:
            out.setdefault(tag, []).append(overall)
        criterion_tags = [case.meta["criterion_tags"][d.id] for d in case.rubric.dimensions]
        for tag in dict.fromkeys(t for tags in criterion_tags for t in tags):
            mask_K = np.asarray([tag in tags for tags in criterion_tags])
            value = example_score(points_K[mask_K], met_K[mask_K])
            if value is not None:
                out.setdefault(tag, []).append(value)
    return out


def clipped_stats(values: Sequence[float], rng: np.random.Generator) -> dict[str, Any]:
    """{"mean": clipped mean, "bootstrap_std", "n_samples"}."""
    return {"mean": clipped_mean(values), "bootstrap_std": bootstrap_std(values, rng), "n_samples": len(values)}


def load_cases(data_dir: Path, name: str | None, limit: int | None) -> list[RubricCase]:
    """A HealthBench jsonl named by --data_file (oss_eval schema, or the RuscaRL copy)."""
    return limited(import_healthbench(data_file(data_dir, name, None, "healthbench")), limit)


def score(cases: Sequence[RubricCase], answers: Sequence[Answer]) -> BenchmarkResult:
    """Overall and per-tag clipped means with bootstrap stds (resamples drawn from BOOTSTRAP_SEED)."""
    records, kept_cases, kept_met = [], [], []
    for case, answer in zip(cases, answers):
        dims = case.rubric.dimensions
        raw_K = answer.raw_scores if answer.raw_scores is not None else np.full(len(dims), np.nan)
        value = None
        if not np.isnan(raw_K).any():
            met_K = raw_K > 0.5
            value = example_score(case.rubric.points, met_K)
            kept_cases.append(case)
            kept_met.append(met_K)
        records.append({"score": value, "criteria": [
            {"criterion": d.description, "points": d.scale.points, "met": None if np.isnan(x) else bool(x > 0.5)}
            for d, x in zip(dims, raw_K)]})
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    overall = [r["score"] for r in records if r["score"] is not None]
    stats = clipped_stats(overall, rng) if overall else None
    tags = {tag: clipped_stats(v, rng) for tag, v in sorted(tag_values(kept_cases, kept_met).items())}
    summary = {"overall": None if stats is None else stats["mean"],
               "overall_bootstrap_std": None if stats is None else stats["bootstrap_std"],
               "examples": len(cases), "examples_scored": len(overall), "tags": tags}
    axes = [t for t in tags if t.startswith("axis:")]
    rows = [("overall", len(overall), summary["overall"], summary["overall_bootstrap_std"])]
    rows += [(t, tags[t]["n_samples"], tags[t]["mean"], tags[t]["bootstrap_std"]) for t in axes]
    notes = ((f"{len(cases) - len(overall)} example(s) not scored: not generated, or the judge left a "
              "criterion without a verdict.",) if len(overall) < len(cases) else ())
    chart = BarChart("HealthBench: clipped mean score with bootstrap std", ("overall", *axes),
                     (summary["overall"], *(tags[t]["mean"] for t in axes)), "score (0-1)",
                     (summary["overall_bootstrap_std"], *(tags[t]["bootstrap_std"] for t in axes)))
    return BenchmarkResult(summary, records, ("metric", "examples", "score", "bootstrap std"), rows, chart, notes)


BENCHMARK = Benchmark("healthbench", load_cases, score, judge_mode="per_dimension")
