"""BiGGen-Bench scoring (../shared/data/prometheus/FORMULA.md; prometheus-eval BiGGen-Bench/make_report.py).

Each of the 765 instances carries one Prometheus score rubric ({criteria, score1..score5_description});
the judge gives an integer 1-5 with the instance's reference answer (the score-5 answer) in view. Per
capability: the mean of its instances' scores; overall: the unweighted mean of the capability means.
An instance without a valid score after the judge's retries is left out and counted (Prometheus
records None after its retries too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rubric_jax.evaluation.results import (
    Answer,
    BarChart,
    Benchmark,
    BenchmarkResult,
    data_file,
    finite_or_none,
    limited,
    mean_or_none,
)
from rubric_jax.rubrics.importers import RubricCase, import_biggen_bench


def capability_scores(scores_by_capability: Mapping[str, Sequence[float]]
                      ) -> tuple[dict[str, float | None], float | None]:
    """Per-capability mean 1-5 score and the unweighted mean of the capability means."""
    means = {cap: mean_or_none(v) for cap, v in sorted(scores_by_capability.items())}
    present = [m for m in means.values() if m is not None]
    return means, (float(np.mean(present)) if present else None)


def load_cases(data_dir: Path, name: str | None, limit: int | None) -> list[RubricCase]:
    """biggen_bench_765.jsonl by default."""
    return limited(import_biggen_bench(data_file(data_dir, name, "biggen_bench_765.jsonl", "biggen")), limit)


def score(cases: Sequence[RubricCase], answers: Sequence[Answer]) -> BenchmarkResult:
    """Capability means and the overall mean of judged 1-5 scores."""
    by_capability: dict[str, list[float]] = {}
    totals: dict[str, int] = {}
    records = []
    for case, answer in zip(cases, answers):
        capability = case.meta["capability"]
        totals[capability] = totals.get(capability, 0) + 1
        value = None
        if answer.raw_scores is not None and not np.isnan(answer.raw_scores[0]):
            value = float(answer.raw_scores[0])
            by_capability.setdefault(capability, []).append(value)
        records.append({"capability": capability, "task": case.meta.get("task"), "score": value})
    means, overall = capability_scores({cap: by_capability.get(cap, []) for cap in totals})
    summary = {"overall": finite_or_none(overall), "capabilities": means,
               "instances": len(cases), "instances_scored": sum(map(len, by_capability.values()))}
    rows = [(cap, f"{len(by_capability.get(cap, []))}/{totals[cap]}", finite_or_none(m)) for cap, m in means.items()]
    rows.append(("overall (mean of capabilities)", f"{summary['instances_scored']}/{len(cases)}",
                 finite_or_none(overall)))
    notes = ((f"{len(cases) - summary['instances_scored']} instance(s) not scored: not generated, or no valid "
              "judge score.",) if summary["instances_scored"] < len(cases) else ())
    chart = BarChart("BiGGen-Bench: mean 1-5 score per capability", (*means, "overall"),
                     (*means.values(), overall), "score (1-5)")
    return BenchmarkResult(summary, records, ("capability", "instances scored", "score (1-5)"), rows, chart, notes)


BENCHMARK = Benchmark("biggen", load_cases, score, judge_mode="per_dimension", judge_sees_reference=True)
