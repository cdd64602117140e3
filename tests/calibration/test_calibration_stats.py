"""Calibration statistics against scipy and scikit-learn on the same data, hand-computed cases, and the
'undefined' results for constant or too-short columns."""

import numpy as np
import pytest
import scipy.stats
from sklearn.metrics import cohen_kappa_score

from rubric_jax.calibration import stats as S

LEVELS = (1, 2, 3, 4, 5)


def _rated_pairs(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two correlated 1-5 ratings with many ties, as a judge and a person produce them."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 6, n).astype(np.float64)
    b = np.clip(a + rng.integers(-2, 3, n), 1, 5).astype(np.float64)
    return a, b


@pytest.mark.parametrize("seed,n", [(0, 3), (1, 7), (2, 40), (3, 320), (4, 1100)])
def test_statistics_equal_scipy_and_sklearn(seed, n):
    a, b = _rated_pairs(seed, n)
    assert S.spearman(a, b).value == pytest.approx(scipy.stats.spearmanr(a, b).statistic, abs=1e-12)
    assert S.kendall_tau_b(a, b).value == pytest.approx(scipy.stats.kendalltau(a, b).statistic, abs=1e-12)
    expected = cohen_kappa_score(a.astype(int), b.astype(int), weights="quadratic", labels=list(LEVELS))
    assert S.quadratic_kappa(a, b, LEVELS).value == pytest.approx(expected, abs=1e-12)


def test_continuous_scores_and_levels_that_are_not_1_to_n():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=50), rng.normal(size=50)
    y[:10] = x[:10]  # ties between but not within columns; continuous values
    assert S.spearman(x, y).value == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=1e-12)
    assert S.kendall_tau_b(x, y).value == pytest.approx(scipy.stats.kendalltau(x, y).statistic, abs=1e-12)
    np.testing.assert_allclose(S.rankdata(np.round(x, 1)), scipy.stats.rankdata(np.round(x, 1)))
    a, b = rng.integers(0, 2, 30), rng.integers(0, 2, 30)  # binary dimension
    assert S.quadratic_kappa(a, b, (0, 1)).value == pytest.approx(
        cohen_kappa_score(a, b, weights="quadratic", labels=[0, 1]), abs=1e-12)
    # kappa weights follow positions in the level list (sklearn's convention), so levels 0, 2, 7 weigh like 0, 1, 2
    a, b = rng.choice([0, 2, 7], 30), rng.choice([0, 2, 7], 30)
    assert S.quadratic_kappa(a, b, (0, 2, 7)).value == pytest.approx(
        cohen_kappa_score(a, b, weights="quadratic", labels=[0, 2, 7]), abs=1e-12)


@pytest.mark.parametrize("kind", ["ratings", "continuous with ties"])
def test_both_concordance_paths_equal_a_double_loop(kind):
    rng = np.random.default_rng(6)
    if kind == "ratings":
        x, y = _rated_pairs(6, 80)
    else:
        x, y = rng.normal(size=80).round(1), rng.normal(size=80)
        y[:20] = y[20:40]
    brute = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i in range(80) for j in range(i + 1, 80))
    assert S._concordance_pairs(x, y) == S._concordance_table(x, y) == brute


def test_hand_computed_cases():
    # Perfect agreement; perfect reversal; one swapped pair out of three (tau = (2 - 1) / 3).
    assert S.spearman([1, 2, 3], [1, 2, 3]).value == 1.0 and S.spearman([1, 2, 3], [3, 2, 1]).value == -1.0
    assert S.kendall_tau_b([1, 2, 3], [1, 3, 2]).value == pytest.approx(1 / 3)
    assert S.spearman([1, 2, 3], [1, 3, 2]).value == pytest.approx(0.5)  # 1 - 6 * 2 / (3 * 8)
    # Ties averaged: ranks of [1, 1, 2] are [1.5, 1.5, 3].
    np.testing.assert_array_equal(S.rankdata([1, 1, 2]), [1.5, 1.5, 3])
    # Kappa by hand on levels 1-3: O = [[1,0,0],[0,0,1],[0,1,0]], marginals all 1, E = 1/3 everywhere.
    # sum W*O = 1 + 1 = 2; sum W*E = (0+1+4+1+0+1+4+1+0)/3 = 4; kappa = 1 - 2/4.
    assert S.quadratic_kappa([1, 2, 3], [1, 3, 2], (1, 2, 3)).value == pytest.approx(0.5)


def test_undefined_results_are_named_never_nan():
    constant = S.spearman([3, 3, 3, 3], [1, 2, 3, 4])
    assert constant.value is None and constant.undefined == "x is constant (every value 3)"
    assert S.kendall_tau_b([1, 2, 3, 4], [2, 2, 2, 2]).undefined == "y is constant (every value 2)"
    assert S.spearman([1, 2], [1, 2]).undefined == "fewer than 3 pairs (n=2)"
    assert S.quadratic_kappa([4, 4, 4], [4, 4, 4], LEVELS).undefined.startswith("no disagreement is expected")
    assert S.quadratic_kappa([4, 4, 4], [1, 2, 3], LEVELS).defined  # one constant rater still has chance disagreement
    assert S.Statistic(None, "why").to_json() == {"value": None, "undefined": "why"}
    with pytest.raises(ValueError, match="finite"):
        S.Statistic(float("nan"))
    with pytest.raises(ValueError, match="outside the levels"):
        S.quadratic_kappa([1, 2, 6], [1, 2, 3], LEVELS)
    with pytest.raises(ValueError, match="inputs must be finite"):
        S.spearman([1, 2, np.nan], [1, 2, 3])
    np.testing.assert_array_equal(S.nearest_level([1.5, 2.49, 4.5], LEVELS), [2, 2, 5])  # half up


def test_bootstrap_is_the_percentile_of_the_statistic_over_seeded_paired_resamples():
    a, b = _rated_pairs(7, 60)
    interval = S.bootstrap_ci(S.spearman, [a, b], num_resamples=200, seed=[3, 4])
    rng = np.random.default_rng([3, 4])
    values = []
    for _ in range(200):
        index = rng.integers(0, 60, 60)
        values.append(scipy.stats.spearmanr(a[index], b[index]).statistic)
    low, high = np.percentile(values, [2.5, 97.5])
    assert (interval.low, interval.high) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    assert interval.undefined_resamples == 0 and interval.to_json() == [interval.low, interval.high]
    again = S.bootstrap_ci(S.spearman, [a, b], num_resamples=200, seed=[3, 4])
    assert (again.low, again.high) == (interval.low, interval.high)
    # The same interval as scipy's own percentile bootstrap, up to Monte Carlo error.
    reference = scipy.stats.bootstrap((a, b), lambda x, y: scipy.stats.spearmanr(x, y).statistic, paired=True,
                                      vectorized=False, n_resamples=1000, method="percentile",
                                      rng=np.random.default_rng(0)).confidence_interval
    wide = S.bootstrap_ci(S.spearman, [a, b], num_resamples=1000, seed=1)
    assert wide.low == pytest.approx(reference.low, abs=0.05) and wide.high == pytest.approx(reference.high, abs=0.05)


def test_bootstrap_is_undefined_when_too_many_resamples_lack_the_statistic():
    a = np.array([1.0] * 19 + [5.0])  # most resamples of 20 items draw the rare 5 at most... or not at all
    b = np.arange(20, dtype=np.float64)
    interval = S.bootstrap_ci(S.spearman, [a, b], num_resamples=300, seed=0)
    # P(no 5 among 20 draws) = 0.95^20 = 0.36 > MAX_UNDEFINED_SHARE
    assert interval.low is None and interval.to_json() is None
    assert interval.undefined_resamples > 0.3 * 300 and "undefined in" in interval.undefined


def test_ols_equals_the_closed_form_and_linregress():
    rng = np.random.default_rng(2)
    X = np.column_stack([np.ones(40), rng.normal(size=40), rng.integers(0, 2, 40)])
    y = X @ np.array([0.5, -1.0, 2.0]) + rng.normal(scale=0.3, size=40)
    fit = S.ols(X, y)
    coef = np.linalg.inv(X.T @ X) @ X.T @ y
    s2 = ((y - X @ coef) ** 2).sum() / (40 - 3)
    stderr = np.sqrt(np.diag(s2 * np.linalg.inv(X.T @ X)))
    np.testing.assert_allclose(fit.coef, coef, rtol=1e-10)
    np.testing.assert_allclose(fit.stderr, stderr, rtol=1e-10)
    np.testing.assert_allclose(fit.high - fit.coef, scipy.stats.t.ppf(0.975, 37) * stderr, rtol=1e-10)
    np.testing.assert_allclose(S.ols(X[:5], y[:5], confidence=0.9).high - S.ols(X[:5], y[:5]).coef,
                               scipy.stats.t.ppf(0.95, 2) * S.ols(X[:5], y[:5]).stderr, rtol=1e-10)  # df = 2
    # One regressor: slope and intercept standard errors as scipy.stats.linregress reports them.
    line = scipy.stats.linregress(X[:, 1], y)
    simple = S.ols(X[:, :2], y)
    np.testing.assert_allclose(simple.coef, [line.intercept, line.slope], rtol=1e-10)
    np.testing.assert_allclose(simple.stderr, [line.intercept_stderr, line.stderr], rtol=1e-10)
    assert S.ols(X[:3], y[:3]).undefined.startswith("3 items for 3 coefficients")
    assert S.ols(np.column_stack([X, X[:, 1] * 2]), y).undefined == "the regressors are collinear (X'X is singular)"
