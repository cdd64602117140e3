"""Agreement of one dimension's scores between a judge and labels, or among several raters.

For two columns a, b [N] on a dimension with raw score levels L: Spearman's rho, Kendall's tau-b and
the quadratic-weighted kappa on L (scores rounded half up to a level first: a median of two judge
samples or a mean of raters can fall between levels), each with a seeded percentile bootstrap interval
from the same paired resamples. For R raters [R, N], each statistic is the mean over the R(R-1)/2 rater
pairs, bootstrapped as a whole.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from rubric_jax.calibration.stats import (
    Interval,
    Statistic,
    bootstrap_ci,
    kendall_tau_b,
    nearest_level,
    quadratic_kappa,
    spearman,
)

CONFIDENCE = 0.95
STATISTICS = ("spearman", "kendall", "kappa_quadratic")
PairStatistic = Callable[[np.ndarray, np.ndarray], Statistic]


@dataclasses.dataclass(frozen=True)
class Agreement:
    """n items and, per name in STATISTICS, the statistic and its bootstrap interval."""

    n: int
    values: dict[str, Statistic]
    intervals: dict[str, Interval]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"n": self.n}
        for name in STATISTICS:
            entry: dict[str, object] = {**self.values[name].to_json(), "ci95": self.intervals[name].to_json()}
            if self.values[name].defined and self.intervals[name].undefined is not None:
                entry["ci95_undefined"] = self.intervals[name].undefined
            out[name] = entry
        return out


def pair_statistics(levels: Sequence[int]) -> dict[str, PairStatistic]:
    """The three statistics of a pair of score columns on a dimension with these levels."""
    def kappa(a: np.ndarray, b: np.ndarray) -> Statistic:
        return quadratic_kappa(nearest_level(a, levels), nearest_level(b, levels), levels)

    return {"spearman": spearman, "kendall": kendall_tau_b, "kappa_quadratic": kappa}


def mean_over_pairs(statistic: PairStatistic) -> Callable[..., Statistic]:
    """statistic(*columns) = mean of `statistic` over every pair of columns; undefined if any pair is."""
    def over_pairs(*columns: np.ndarray) -> Statistic:
        values = []
        for i, j in itertools.combinations(range(len(columns)), 2):
            result = statistic(columns[i], columns[j])
            if not result.defined:
                return Statistic(None, f"raters {i + 1} and {j + 1}: {result.undefined}")
            values.append(result.value)
        return Statistic(float(np.mean(values)))

    return over_pairs


def dimension_seed(seed: int, dim_id: str) -> list[int]:
    """A bootstrap seed per dimension that does not depend on which other dimensions are reported."""
    return [seed, zlib.crc32(dim_id.encode("utf-8"))]


def agreement(columns: Sequence[np.ndarray], levels: Sequence[int], *, num_resamples: int,
              seed: int | Sequence[int]) -> Agreement:
    """Agreement of two columns (judge, label), or the mean pairwise agreement of R > 2 rater columns."""
    if len(columns) < 2:
        raise ValueError(f"agreement: need at least two score columns, got {len(columns)}")
    cols = [np.asarray(c, dtype=np.float64) for c in columns]
    values, intervals = {}, {}
    for name, pair_stat in pair_statistics(levels).items():
        statistic = pair_stat if len(cols) == 2 else mean_over_pairs(pair_stat)
        values[name] = statistic(*cols)
        intervals[name] = bootstrap_ci(statistic, cols, num_resamples=num_resamples, confidence=CONFIDENCE, seed=seed)
    return Agreement(int(cols[0].shape[0]), values, intervals)
