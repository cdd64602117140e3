"""Redundancy check of a rubric's dimensions (RubricRL §2.1, MECE): two dimensions whose scores rank the same
items alike measure one thing twice ("回答质量高" and "信息准确" scored almost perfectly correlated).

`redundant_pairs` is the pairwise Spearman of score columns (one per dimension, NaN = not scored) over the
items both score; a pair where either column is constant on those items has no Spearman and is skipped
(reported with the reason, never a NaN that could pass for a value). Used by experiments.calibrate (on the
labels and on the judge's scores) and by the run monitor monitor/redundancy/<a>__<b> (train/monitors.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

import numpy as np

from rubric_jax.calibration.stats import spearman

PAIR_SEPARATOR = "__"  # monitor/redundancy/<a>__<b>


@dataclasses.dataclass(frozen=True)
class PairSpearman:
    """Spearman of dimensions `a` and `b` over `n` items both scored, or the reason it is undefined."""

    a: str
    b: str
    n: int
    value: float | None
    undefined: str | None = None

    def flagged(self, threshold: float) -> bool:
        """True when the pair's scores rank alike: Spearman at or above `threshold`."""
        return self.value is not None and self.value >= threshold

    def to_json(self, threshold: float) -> dict[str, object]:
        return {"a": self.a, "b": self.b, "n": self.n, "spearman": self.value,
                **({"undefined": self.undefined} if self.undefined else {}), "flagged": self.flagged(threshold)}


def pairwise_spearman(columns: Mapping[str, np.ndarray]) -> list[PairSpearman]:
    """Every pair of columns (in the mapping's order): Spearman over the rows where both are finite."""
    pairs = []
    for a, b in itertools.combinations(columns, 2):
        x_N, y_N = np.asarray(columns[a], np.float64), np.asarray(columns[b], np.float64)
        both_N = np.isfinite(x_N) & np.isfinite(y_N)
        result = spearman(x_N[both_N], y_N[both_N])
        pairs.append(PairSpearman(a, b, int(both_N.sum()), result.value, result.undefined))
    return pairs


def redundancy_report(columns: Mapping[str, np.ndarray], threshold: float) -> dict[str, object]:
    """JSON: every pair's Spearman and the flagged pairs (Spearman >= threshold), for calibration reports."""
    pairs = pairwise_spearman(columns)
    return {"threshold": threshold, "pairs": [p.to_json(threshold) for p in pairs],
            "flagged": [[p.a, p.b] for p in pairs if p.flagged(threshold)]}
