"""LongBench-Write scoring (../shared/data/longbench_write/FORMULA.md; THUDM/LongWriter evaluation/).

Length score S_l (eval_length.py), x = required length, y = output length (pred.py count_words: CJK
characters plus English words):
    y > x:  S_l = 100 * max(0, 1 - (y/x - 1) / 3)     (0 at y = 4x)
    y <= x: S_l = 100 * max(0, 1 - (x/y - 1) / 2)     (0 at y = x/3; y = 0 is 0, the original divides by 0)
Quality score S_q (eval_quality.py): six 1-5 judge dimensions; an answer the judge never scored is left
out (LongWriter writes no line for it), a dimension missing from a scored answer counts as 3; per
dimension (mean - 1) * 25, S_q = mean of the six. The paper's single number is S = (S_l + S_q) / 2.
S_l needs no judge: without one (or for LongWrite-Ruler, which has no quality judge) only S_l is reported.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rubric_jax.evaluation.results import (
    Answer,
    Benchmark,
    BenchmarkResult,
    ScatterChart,
    data_file,
    finite_or_none,
    limited,
    mean_or_none,
)
from rubric_jax.rubrics.importers import LONGBENCH_WRITE_QUALITY, RubricCase, import_longbench_write

_CJK_RE = re.compile(r"[\u4e00-\u9fff]")
_ENGLISH_WORD_RE = re.compile(r"\b[a-zA-Z]+\b")
MISSING_DIMENSION_SCORE = 3.0  # eval_quality.py: `float(score[dim]) if dim in score else 3`
# Required-length buckets of the LongWriter paper's analysis (words / characters).
LENGTH_BUCKETS = ((0, 500, "<500"), (500, 2000, "500-2k"), (2000, 4000, "2k-4k"), (4000, None, ">=4k"))


def count_words(text: str) -> int:
    """LongWriter's output length: CJK characters (U+4E00..U+9FFF) plus English words [a-zA-Z]+."""
    return len(_CJK_RE.findall(text)) + len(_ENGLISH_WORD_RE.findall(text))


def length_score(required: int, output: int) -> float:
    """S_l of one answer in [0, 100]: 100 at output == required, piecewise linear in the ratio either side."""
    if required <= 0:
        raise ValueError(f"required length must be positive, got {required}")
    if output > required:
        return 100.0 * max(0.0, 1.0 - (output / required - 1.0) / 3.0)
    if output == 0:
        return 0.0
    return 100.0 * max(0.0, 1.0 - (required / output - 1.0) / 2.0)


def quality_scores(scores_NxD: np.ndarray) -> tuple[list[float | None], float | None, int]:
    """Per-dimension (mean - 1) * 25 and S_q from 1-5 judge scores [N, 6] (NaN = missing), and the number of
    answers used (rows with no score at all are left out; a missing dimension of a kept row counts as 3)."""
    scores_NxD = np.asarray(scores_NxD, np.float64).reshape(-1, len(LONGBENCH_WRITE_QUALITY))
    kept_NxD = scores_NxD[~np.isnan(scores_NxD).all(axis=1)]
    if not len(kept_NxD):
        return [None] * scores_NxD.shape[1], None, 0
    per_dim_D = (np.where(np.isnan(kept_NxD), MISSING_DIMENSION_SCORE, kept_NxD).mean(axis=0) - 1.0) * 25.0
    return per_dim_D.tolist(), float(per_dim_D.mean()), len(kept_NxD)


def _bucket(required: int) -> str:
    return next(name for lo, hi, name in LENGTH_BUCKETS if required >= lo and (hi is None or required < hi))


def load_cases(data_dir: Path, name: str | None, limit: int | None) -> list[RubricCase]:
    """longbench_write.jsonl by default (or longbench_write_en.jsonl, longwrite_ruler.jsonl via --data_file)."""
    return limited(import_longbench_write(data_file(data_dir, name, "longbench_write.jsonl", "longbench_write")), limit)


def score(cases: Sequence[RubricCase], answers: Sequence[Answer]) -> BenchmarkResult:
    """S_l over every case (an answer not generated scores 0), S_q over judged answers, S = their mean."""
    dim_ids = [dim_id for dim_id, *_ in LONGBENCH_WRITE_QUALITY]
    records, lengths, quality_rows = [], [], []
    per_bucket: dict[str, list[float]] = {name: [] for *_, name in LENGTH_BUCKETS}
    for case, answer in zip(cases, answers):
        required = case.meta["length"]
        output = count_words(answer.judged_text or "")
        s_l = length_score(required, output)
        lengths.append(s_l)
        per_bucket[_bucket(required)].append(s_l)
        quality = None
        if answer.raw_scores is not None:
            quality_rows.append(answer.raw_scores)
            quality = {d: finite_or_none(x) for d, x in zip(dim_ids, answer.raw_scores)}
        records.append({"type": case.meta["type"], "required_length": required, "output_length": output,
                        "length_score": s_l, "quality": quality})
    s_l = mean_or_none(lengths)
    per_dim, s_q, judged = quality_scores(np.asarray(quality_rows)) if quality_rows else ([None] * 6, None, 0)
    total = None if s_l is None or s_q is None else (s_l + s_q) / 2
    summary = {"S": finite_or_none(total), "S_l": finite_or_none(s_l), "S_q": finite_or_none(s_q),
               "quality": dict(zip(dim_ids, per_dim)), "S_l_by_required_length": {
                   name: mean_or_none(v) for name, v in per_bucket.items() if v},
               "answers": len(cases), "answers_judged": judged}
    rows = [("S = (S_l + S_q) / 2", total), ("S_l (length)", s_l), ("S_q (quality)", s_q)]
    rows += [(f"  quality: {name}", x) for (_, name, *_), x in zip(LONGBENCH_WRITE_QUALITY, per_dim)]
    rows += [(f"  S_l, required {name}", mean_or_none(v)) for name, v in per_bucket.items() if v]
    notes = () if quality_rows else ("S_q not computed: no judge was given (or no answer was judged).",)
    chart = ScatterChart("LongBench-Write: output length vs required length (y = x is a perfect S_l)",
                         tuple(float(r["required_length"]) for r in records),
                         tuple(float(r["output_length"]) for r in records), "required length", "output length")
    return BenchmarkResult(summary, records, ("metric", "value (0-100)"),
                           [(name, finite_or_none(value)) for name, value in rows], chart, notes)


BENCHMARK = Benchmark("longbench_write", load_cases, score, judge_mode="all_criteria", judge_optional=True)
