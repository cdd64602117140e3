"""Two rubric versions scored on the same labels (RubricRL §3.2: rewrite a dimension's anchors, re-score,
compare; "通常迭代2-3轮"): per labelled dimension, each version's agreement with the labels and its bootstrap
interval side by side, and a paired bootstrap of the difference (B − A), which resamples the same items for
both versions, so the items' shared difficulty cancels out and the interval says whether B really agrees
better than A or the gap is noise.

Verdict per statistic: "B better" when the difference's 95% interval lies above 0, "A better" when below,
"no clear difference" when it contains 0, "undefined" when either version's statistic is undefined.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rubric_jax.calibration.agreement import CONFIDENCE, STATISTICS, agreement, dimension_seed, pair_statistics
from rubric_jax.calibration.labels import LabelledItem, dimension_info
from rubric_jax.calibration.redundancy import redundancy_report
from rubric_jax.calibration.run import CalibrationError, Settings, score_items
from rubric_jax.calibration.stats import Statistic, bootstrap_ci
from rubric_jax.judges.llm_judge import Judge
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.spec import JudgeSpec, describe

COMPARE_FORMAT = "rubric_jax.rubric_comparison"


def _rubrics(items: Sequence[LabelledItem]) -> list:
    return list({item.rubric.content_hash: item.rubric for item in items}.values())


def difference(statistic: Any) -> Any:
    """statistic(b, label) − statistic(a, label) as a Statistic of three columns (a, b, label)."""
    def diff(a_N: np.ndarray, b_N: np.ndarray, label_N: np.ndarray) -> Statistic:
        first, second = statistic(a_N, label_N), statistic(b_N, label_N)
        if not first.defined or not second.defined:
            return Statistic(None, first.undefined or second.undefined)
        return Statistic(second.value - first.value)

    return diff


def verdict(ci: list[float] | None) -> str:
    """What the difference's interval says (see the module docstring)."""
    if ci is None:
        return "undefined"
    return "B better" if ci[0] > 0 else "A better" if ci[1] < 0 else "no clear difference"


def compare_dimension(a_N: np.ndarray, b_N: np.ndarray, label_N: np.ndarray, levels: Sequence[int], *,
                      num_resamples: int, seed: Sequence[int]) -> dict[str, Any]:
    """One dimension: agreement of A and of B with the labels over the items all three score, and B − A."""
    rows = np.flatnonzero(np.isfinite(a_N) & np.isfinite(b_N) & np.isfinite(label_N))
    cols = [a_N[rows], b_N[rows], label_N[rows]]
    entry: dict[str, Any] = {"n": int(rows.size)}
    for side, col in (("a", cols[0]), ("b", cols[1])):
        entry[side] = agreement([col, cols[2]], levels, num_resamples=num_resamples, seed=seed).to_json()
    for name, statistic in pair_statistics(levels).items():
        diff = difference(statistic)
        value = diff(*cols) if rows.size else Statistic(None, "no item scored by both versions and labelled")
        interval = bootstrap_ci(diff, cols, num_resamples=num_resamples, confidence=CONFIDENCE, seed=seed)
        entry[f"{name}_difference"] = {**value.to_json(), "ci95": interval.to_json(),
                                       "verdict": verdict(interval.to_json()) if value.defined else "undefined"}
    return entry


@dataclasses.dataclass(frozen=True)
class Versions:
    """The same labelled items read with rubric A (--rubric) and with rubric B (--compare), and where each is."""

    items_a: Sequence[LabelledItem]
    items_b: Sequence[LabelledItem]
    name_a: str
    name_b: str


def compare_rubrics(versions: Versions, settings: Settings, *, judges: Sequence[Judge] = (),
                    judge_spec: JudgeSpec = JudgeSpec(), inputs: Mapping[str, Any] | None = None,
                    refiners: Sequence[Judge] = ()) -> dict[str, Any]:
    """The comparison report: each labelled dimension of both versions, A and B side by side, and B − A."""
    if len(versions.items_a) != len(versions.items_b):
        raise ValueError("compare_rubrics: the two versions must read the same items")
    info_a, info_b = dimension_info(versions.items_a), dimension_info(versions.items_b)
    shared = [d for d in info_a if d in info_b]
    changed = [d for d in shared if info_a[d] != info_b[d]]
    if changed:
        raise CalibrationError(f"--compare: dimension(s) {changed} have another kind or scale in {versions.name_b} "
                               f"than in {versions.name_a}; their scores cannot be compared on one scale")
    if not shared:
        raise CalibrationError(f"--compare: no labelled dimension is in both {versions.name_a} and {versions.name_b}")
    key = jax.random.key(settings.seed)
    scores = {}
    for side, items in (("a", versions.items_a), ("b", versions.items_b)):
        # The same key: only the rubric differs.
        reward = RubricReward(_rubrics(items), judges, judge_spec, refiners=refiners)
        scores[side] = score_items(reward, items, settings.batch_size, key,
                                   f"calibrate --compare: rubric {side.upper()}")
    labels = {d: np.array([item.labels.get(d, np.nan) for item in versions.items_a]) for d in shared}
    dims = {d: {"kind": info_a[d].kind, "scale": list(info_a[d].scale),
                **compare_dimension(scores["a"][d], scores["b"][d], labels[d], info_a[d].levels,
                                    num_resamples=settings.num_resamples, seed=dimension_seed(settings.seed, d))}
            for d in shared}
    return {
        "format": COMPARE_FORMAT, "format_version": 1, "items": len(versions.items_a),
        "rubrics": {"a": versions.name_a, "b": versions.name_b},
        "rubric_hashes": {side: sorted({i.rubric.content_hash for i in items}) for side, items in
                          (("a", versions.items_a), ("b", versions.items_b))},
        "only_in": {"a": [d for d in info_a if d not in info_b], "b": [d for d in info_b if d not in info_a]},
        "bootstrap": {"resamples": settings.num_resamples, "confidence": CONFIDENCE, "seed": settings.seed,
                      "method": "percentile; the difference resamples the same items for both versions"},
        "inputs": {**(inputs or {}), "judges": [j.name for j in judges],
                   "judge": describe(judge_spec)},
        "statistics": list(STATISTICS),
        "dimensions": dims,
        "redundancy": {side: redundancy_report(scores[side], settings.redundancy_threshold) for side in ("a", "b")},
    }
