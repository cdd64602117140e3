"""Agreement statistics: Spearman, Kendall tau-b, quadratic-weighted kappa, percentile bootstrap intervals, and
ordinary least squares with t intervals.

Each agrees with its reference library on the same data (tests/calibration/test_calibration_stats.py):
  spearman         scipy.stats.spearmanr         (Pearson correlation of ranks, ties averaged)
  kendall_tau_b    scipy.stats.kendalltau        (tau-b: concordance corrected for ties on both sides)
  quadratic_kappa  sklearn cohen_kappa_score(weights="quadratic", labels=levels)
  ols              numpy lstsq / the closed form (X'X)^-1 X'y, scipy.stats.linregress's standard errors; its t
                   quantile is scipy.special.stdtrit (scipy is installed with jax; scipy.special imports in
                   ~0.2 s)

Why the first three are numpy here and not calls into scipy.stats / sklearn (measured on the 2-core CPU machine,
scipy 1.17.1, scikit-learn 1.9.1, best of 5 fresh processes that had imported jax; absolute times were inflated by
other jobs, the ratios held):
  - import: scipy.stats 1.1-1.4 s, sklearn.metrics 1.4 s, this module 7 ms. The trainer imports this module (the
    reward-length monitor, golden agreement, the judge audit) and nothing else of scipy.stats or sklearn.
  - speed: bootstrap_ci calls a statistic once per resample (1000 by default). Per call on n = 50 / 200 / 2000
    rating pairs: spearman 0.19 / 0.17 / 0.35 ms here against scipy.stats.spearmanr 0.91 / 0.72 / 1.10 ms;
    kendall_tau_b 0.29 / 0.25 / 0.87 ms against scipy.stats.kendalltau 0.60 / 0.73 / 1.00 ms: an interval costs
    2-5x more through scipy.
  - install: sklearn is not a runtime dependency (a 9.3 MB wheel plus joblib, threadpoolctl and narwhals) for a
    kappa that is ten lines of numpy.
The values are the libraries' up to the last bit or two (identical tie handling: average ranks, tau-b).

A statistic that does not exist on the data (a constant column, fewer than MIN_PAIRS pairs, no
expected disagreement) is a `Statistic` with `value=None` and a reason, never a NaN posing as a number.
Arrays are 1-D [N] (one entry per rated item) unless a suffix says otherwise: X_NxP is N items by P
regressors; B is the number of bootstrap resamples.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import scipy.special

MIN_PAIRS = 3  # fewer pairs than this: a rank correlation says nothing (scipy gives +-1 for two points)
MAX_UNDEFINED_SHARE = 0.1  # a bootstrap interval is undefined when more resamples than this lack the statistic


@dataclasses.dataclass(frozen=True)
class Statistic:
    """A statistic's finite value, or None and the reason it is undefined on this data."""

    value: float | None
    undefined: str | None = None

    def __post_init__(self) -> None:
        if (self.value is None) == (self.undefined is None):
            raise ValueError(f"Statistic: give a value or a reason, not both or neither "
                             f"({self.value!r}, {self.undefined!r})")
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"Statistic: value must be finite, got {self.value!r}")

    @property
    def defined(self) -> bool:
        return self.value is not None

    def to_json(self) -> dict[str, float | str | None]:
        """{"value": v} or {"value": null, "undefined": reason}."""
        return {"value": self.value} if self.defined else {"value": None, "undefined": self.undefined}


def _undefined(reason: str) -> Statistic:
    return Statistic(None, reason)


def _paired(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two equally long 1-D float64 arrays of finite numbers (a programming error otherwise)."""
    x_N, y_N = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x_N.ndim != 1 or x_N.shape != y_N.shape:
        raise ValueError(f"paired statistic: expected two 1-D arrays of one length, got {x_N.shape}, {y_N.shape}")
    if not (np.isfinite(x_N).all() and np.isfinite(y_N).all()):
        raise ValueError("paired statistic: inputs must be finite (drop missing scores first)")
    return x_N, y_N


def _too_short_or_constant(x_N: np.ndarray, y_N: np.ndarray) -> Statistic | None:
    """The reason a correlation of x and y is undefined, or None when it is defined."""
    if x_N.shape[0] < MIN_PAIRS:
        return _undefined(f"fewer than {MIN_PAIRS} pairs (n={x_N.shape[0]})")
    for name, col in (("x", x_N), ("y", y_N)):
        if (col == col[0]).all():
            return _undefined(f"{name} is constant (every value {col[0]:g})")
    return None


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..N of x, tied values sharing the average of their ranks (scipy.stats.rankdata 'average')."""
    x_N = np.asarray(x, dtype=np.float64)
    order_N = np.argsort(x_N, kind="stable")
    sorted_N = x_N[order_N]
    starts = np.flatnonzero(np.r_[True, sorted_N[1:] != sorted_N[:-1]])  # first index of each tie group
    ends = np.r_[starts[1:], x_N.shape[0]]
    ranks_N = np.empty_like(x_N)
    ranks_N[order_N] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # mean of positions start+1..end
    return ranks_N


def spearman(x: np.ndarray, y: np.ndarray) -> Statistic:
    """Spearman's rho: the Pearson correlation of the average ranks of x and y."""
    x_N, y_N = _paired(x, y)
    bad = _too_short_or_constant(x_N, y_N)
    if bad is not None:
        return bad
    rx_N, ry_N = rankdata(x_N), rankdata(y_N)
    rx_N -= rx_N.mean()
    ry_N -= ry_N.mean()
    rho = float(rx_N @ ry_N / math.sqrt(float(rx_N @ rx_N) * float(ry_N @ ry_N)))
    return Statistic(min(1.0, max(-1.0, rho)))


def _tied_pairs(x_N: np.ndarray) -> int:
    """Pairs (i < j) with x_i == x_j: the sum over tie groups of t(t-1)/2."""
    _, counts = np.unique(x_N, return_counts=True)
    return int((counts * (counts - 1) // 2).sum())


def _concordance_pairs(x_N: np.ndarray, y_N: np.ndarray, chunk: int = 512) -> int:
    """Sum over pairs i < j of sign(x_i - x_j) * sign(y_i - y_j), in row chunks of [chunk, N] sign products."""
    total = 0
    for start in range(0, x_N.shape[0], chunk):
        sx_CxN = np.sign(x_N[start : start + chunk, None] - x_N[None, :]).astype(np.int64)
        sy_CxN = np.sign(y_N[start : start + chunk, None] - y_N[None, :]).astype(np.int64)
        total += int((sx_CxN * sy_CxN).sum())
    return total // 2  # every unordered pair was counted twice, the diagonal contributes 0


def _concordance_table(x_N: np.ndarray, y_N: np.ndarray) -> int:
    """The same sum from the [A, B] table of counts over the distinct values of x and y (A, B distinct values):
    concordant pairs sum T[a, b] * #(x > a and y > b); discordant pairs sum T[a, b] * #(x > a and y < b)."""
    _, a_N = np.unique(x_N, return_inverse=True)
    _, b_N = np.unique(y_N, return_inverse=True)
    num_a, num_b = int(a_N.max()) + 1, int(b_N.max()) + 1
    table_AxB = np.bincount(a_N * num_b + b_N, minlength=num_a * num_b).reshape(num_a, num_b).astype(np.int64)
    # at_least_AxB[a, b] = count of items with x >= a and y >= b (suffix sums); pad so "a + 1" is valid.
    at_least_AxB = np.zeros((num_a + 1, num_b + 1), dtype=np.int64)
    at_least_AxB[:num_a, :num_b] = table_AxB[::-1, ::-1].cumsum(axis=0).cumsum(axis=1)[::-1, ::-1]
    above_A = at_least_AxB[1:, 0]  # items with x > a, any y
    higher_AxB = at_least_AxB[1:, 1:]  # x > a and y > b
    not_lower_AxB = at_least_AxB[1:, :num_b]  # x > a and y >= b
    concordant = int((table_AxB * higher_AxB).sum())
    discordant = int((table_AxB * (above_A[:, None] - not_lower_AxB)).sum())
    return concordant - discordant


MAX_TABLE_CELLS = 1 << 20  # ratings take a few distinct values: their table is tiny and O(N) to fill


def _concordance(x_N: np.ndarray, y_N: np.ndarray) -> int:
    """Sum over pairs i < j of sign(x_i - x_j) * sign(y_i - y_j): by the table of distinct values when it is
    small (ratings), else by chunked pairwise signs (memory O(512 N))."""
    if np.unique(x_N).shape[0] * np.unique(y_N).shape[0] <= MAX_TABLE_CELLS:
        return _concordance_table(x_N, y_N)
    return _concordance_pairs(x_N, y_N)


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> Statistic:
    """Kendall's tau-b: (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)), n0 = N(N-1)/2."""
    x_N, y_N = _paired(x, y)
    bad = _too_short_or_constant(x_N, y_N)
    if bad is not None:
        return bad
    n0 = x_N.shape[0] * (x_N.shape[0] - 1) // 2
    denominator = math.sqrt(float(n0 - _tied_pairs(x_N)) * float(n0 - _tied_pairs(y_N)))
    tau = _concordance(x_N, y_N) / denominator
    return Statistic(min(1.0, max(-1.0, tau)))


def scale_groups(items: Iterable[tuple[str, Sequence[int], int]]) -> dict[str, tuple[str, tuple[int, ...], list[int]]]:
    """(dimension id, its levels, position) per scored item -> name -> (id, levels, positions), first seen first: the
    name is the id when all its items share one scale, else '<id>@<lo>-<hi>' per scale. Case-wise rubrics may give
    one id several scales, and statistics on levels (nearest level, kappa) need each item's own."""
    grouped: dict[str, dict[tuple[int, ...], list[int]]] = {}
    for dim_id, levels, position in items:
        grouped.setdefault(dim_id, {}).setdefault(tuple(levels), []).append(position)
    return {(dim_id if len(scales) == 1 else f"{dim_id}@{levels[0]}-{levels[-1]}"): (dim_id, levels, positions)
            for dim_id, scales in grouped.items() for levels, positions in scales.items()}


def nearest_level(x: np.ndarray, levels: Sequence[int]) -> np.ndarray:
    """Each value rounded half up to an integer, which must be one of `levels` (kappa needs categories)."""
    rounded_N = np.floor(np.asarray(x, dtype=np.float64) + 0.5)
    outside = ~np.isin(rounded_N, np.asarray(levels, dtype=np.float64))
    if outside.any():
        raise ValueError(f"value {float(np.asarray(x)[outside][0])!r} is not near any level of {list(levels)}")
    return rounded_N.astype(np.int64)


def quadratic_kappa(a: np.ndarray, b: np.ndarray, levels: Sequence[int]) -> Statistic:
    """Cohen's kappa with weights (i - j)^2 over the positions i, j of the ratings in `levels`.

    kappa = 1 - sum(W * O) / sum(W * E): O is the confusion matrix of the two ratings and E the one
    expected by chance (outer product of the marginals / N). Ratings must be values of `levels`.
    """
    a_N, b_N = _paired(a, b)
    levels_L = np.asarray(sorted(set(levels)), dtype=np.float64)
    if levels_L.shape[0] < 2:
        raise ValueError(f"quadratic_kappa: need at least two levels, got {list(levels)}")
    if a_N.shape[0] < MIN_PAIRS:
        return _undefined(f"fewer than {MIN_PAIRS} pairs (n={a_N.shape[0]})")
    index_a_N, index_b_N = np.searchsorted(levels_L, a_N), np.searchsorted(levels_L, b_N)
    for name, values_N, index_N in (("a", a_N, index_a_N), ("b", b_N, index_b_N)):
        off = (index_N >= levels_L.shape[0]) | (levels_L[np.minimum(index_N, levels_L.shape[0] - 1)] != values_N)
        if off.any():
            raise ValueError(f"quadratic_kappa: {name} has value {values_N[off][0]!r} outside the levels "
                             f"{list(levels)}")
    num_levels = levels_L.shape[0]
    observed_LxL = np.bincount(index_a_N * num_levels + index_b_N, minlength=num_levels**2)
    observed_LxL = observed_LxL.reshape(num_levels, num_levels)
    expected_LxL = np.outer(observed_LxL.sum(axis=1), observed_LxL.sum(axis=0)) / a_N.shape[0]
    positions_L = np.arange(num_levels, dtype=np.float64)
    weights_LxL = (positions_L[:, None] - positions_L[None, :]) ** 2
    chance = float((weights_LxL * expected_LxL).sum())
    if chance == 0.0:
        return _undefined(f"no disagreement is expected by chance (both ratings constant at {a_N[0]:g})")
    return Statistic(1.0 - float((weights_LxL * observed_LxL).sum()) / chance)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval, or None bounds and the reason; counts resamples lacking the statistic."""

    low: float | None
    high: float | None
    confidence: float
    resamples: int
    undefined_resamples: int
    undefined: str | None = None

    def to_json(self) -> list[float] | None:
        return None if self.undefined is not None else [self.low, self.high]


def bootstrap_ci(
    statistic: Callable[..., Statistic],
    columns: Sequence[np.ndarray],
    *,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | Sequence[int] = 0,
) -> Interval:
    """Percentile interval of `statistic(*columns)` over `num_resamples` paired resamples of the N items.

    Resample b draws N item indices with replacement (`np.random.default_rng(seed).integers(0, N, N)`,
    one draw per resample in order) and applies them to every column. The bounds are numpy's linear
    percentiles at (1 -+ confidence) / 2 of the defined values. More than MAX_UNDEFINED_SHARE undefined
    resamples (e.g. a rare label drawn out) makes the whole interval undefined rather than biased.
    """
    cols = [np.asarray(c) for c in columns]
    if not cols or any(c.shape[:1] != cols[0].shape[:1] for c in cols):
        raise ValueError(f"bootstrap_ci: need columns of one length, got {[c.shape for c in cols]}")
    if not 0.0 < confidence < 1.0 or num_resamples < 1:
        raise ValueError(f"bootstrap_ci: need 0 < confidence < 1 and num_resamples >= 1, got {confidence}, "
                         f"{num_resamples}")
    n = cols[0].shape[0]
    if n == 0:
        return Interval(None, None, confidence, num_resamples, num_resamples, "no items to resample")
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(num_resamples):
        index_N = rng.integers(0, n, n)
        result = statistic(*(c[index_N] for c in cols))
        if result.defined:
            values.append(result.value)
    missing = num_resamples - len(values)
    if missing > MAX_UNDEFINED_SHARE * num_resamples:
        return Interval(None, None, confidence, num_resamples, missing,
                        f"the statistic is undefined in {missing} of {num_resamples} resamples")
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(np.asarray(values), [tail, 100.0 - tail])
    return Interval(float(low), float(high), confidence, num_resamples, missing)


@dataclasses.dataclass(frozen=True)
class OLSFit:
    """Least-squares coefficients [P] with standard errors and t intervals; None and a reason when not identified."""

    coef: np.ndarray | None
    stderr: np.ndarray | None
    low: np.ndarray | None
    high: np.ndarray | None
    df: int
    rss: float | None
    undefined: str | None = None


def ols(X_NxP: np.ndarray, y_N: np.ndarray, confidence: float = 0.95) -> OLSFit:
    """y = X b + e by least squares; stderr = sqrt(diag(s^2 (X'X)^-1)), s^2 = RSS / (N - P); b +- t * stderr."""
    X = np.asarray(X_NxP, dtype=np.float64)
    y = np.asarray(y_N, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],) or not (np.isfinite(X).all() and np.isfinite(y).all()):
        raise ValueError(f"ols: expected finite X [N, P] and y [N], got shapes {X.shape}, {y.shape}")
    n, p = X.shape
    df = n - p
    if df < 1:
        return OLSFit(None, None, None, None, df, None,
                      f"{n} items for {p} coefficients leave no residual degrees of freedom")
    if np.linalg.matrix_rank(X) < p:
        return OLSFit(None, None, None, None, df, None, "the regressors are collinear (X'X is singular)")
    coef_P, *_ = np.linalg.lstsq(X, y, rcond=None)
    rss = float(((y - X @ coef_P) ** 2).sum())
    stderr_P = np.sqrt(np.diag(rss / df * np.linalg.inv(X.T @ X)))
    half_P = float(scipy.special.stdtrit(df, 0.5 + confidence / 2.0)) * stderr_P  # Student's t quantile
    return OLSFit(coef_P, stderr_P, coef_P - half_P, coef_P + half_P, df, rss)
