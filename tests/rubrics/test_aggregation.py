"""Aggregation: hand-computed rewards for every method, gates, missing-score rules, jit == no-jit."""
import math

import jax
import numpy as np
import pytest

from rubric_jax.rubrics import Anchor, Dimension, Rubric, Scale
from rubric_jax.rubrics.aggregation import (
    LEVEL_FNS,
    aggregate,
    aggregate_jit,
    aggregate_rubric,
    healthbench_points,
    spec_from_rubric,
)
from rubric_jax.rubrics.schema import AGGREGATION_PARAMS, Aggregation, ChangelogEntry

NAN = float("nan")


def _dim(dim_id, weight=1.0, gate=False, group=None, points=None):
    scale = Scale.signed_points(points) if points is not None else Scale.binary()
    return Dimension(dim_id, dim_id, "llm", scale, {0: Anchor("no"), 1: Anchor("yes")},
                     weight=weight, gate=gate, group=group)


def _rubric(dims, method="weighted_sum", params=None, missing="renormalize"):
    return Rubric("t", "1.0.0", (ChangelogEntry("1.0.0", "c", "r"),), tuple(dims),
                  Aggregation(method, params or {}, missing))


def _agg(rubric, scores, valid=None):
    scores = np.asarray(scores, np.float32)
    valid = np.ones(scores.shape, bool) if valid is None else np.asarray(valid, bool)
    return aggregate_rubric(rubric, scores, valid)


def test_weighted_sum_normalises_weights():
    r = _rubric([_dim("a", 1), _dim("b", 2), _dim("c", 1)])
    reward, ok = _agg(r, [[1, 0.5, 0], [1, 1, 1], [0, 0, 0]])
    np.testing.assert_allclose(reward, [0.5, 1.0, 0.0], rtol=1e-6)
    assert ok.all()


def test_weighted_geometric_mean_and_eps_floor():
    r = _rubric([_dim("a", 1), _dim("b", 3)], "weighted_geometric_mean", {"eps": 0.01})
    reward, _ = _agg(r, [[0.25, 1.0], [1.0, 0.5], [0.0, 1.0], [0.0, 0.0]])
    expected = [0.25 ** 0.25, 0.5 ** 0.75, 0.01 ** 0.25, 0.01]
    np.testing.assert_allclose(reward, expected, rtol=1e-5)
    # More sensitive to a low dimension than the weighted sum (RubricRL 5.2).
    ws, _ = _agg(_rubric([_dim("a", 1), _dim("b", 3)]), [[0.0, 1.0]])
    assert reward[2] < ws[0]


def test_min():
    r = _rubric([_dim("a", 1), _dim("b", 5)], "min")
    reward, _ = _agg(r, [[0.2, 0.9], [1.0, 0.6]])
    np.testing.assert_allclose(reward, [0.2, 0.6], rtol=1e-6)


def test_gate_zeroes_reward_whatever_the_method():
    for method, params in (("weighted_sum", {}), ("min", {}), ("weighted_geometric_mean", {})):
        r = _rubric([_dim("safety", 1, gate=True), _dim("a", 1), _dim("b", 1)], method, params)
        reward, ok = _agg(r, [[0, 1, 1], [1, 1, 0.5], [1, 0.5, 0.5]])
        assert reward[0] == 0.0 and ok.all(), method
        assert reward[2] == pytest.approx(0.5), method  # the gate itself does not enter the method
    r = _rubric([_dim("safety", 1, gate=True), _dim("a", 1)])
    reward, _ = _agg(r, [[1, 0.75]])
    assert reward[0] == pytest.approx(0.75)


def test_hierarchical_within_then_across():
    dims = [_dim("a", 1, group="quality"), _dim("b", 3, group="quality"), _dim("c", 2, group="style")]
    r = _rubric(dims, "hierarchical", {"within": "weighted_sum", "across": "min"})
    reward, _ = _agg(r, [[1.0, 0.6, 0.9], [0.0, 0.2, 0.1]])
    # quality = (1*1 + 3*0.6)/4 = 0.7, style = 0.9 -> min 0.7; row 2: quality 0.15, style 0.1 -> 0.1.
    np.testing.assert_allclose(reward, [0.7, 0.1], rtol=1e-6)
    # Default group weights are the sums of member weights (4 and 2): across weighted_sum = (4*0.7 + 2*0.9)/6.
    r = _rubric(dims, "hierarchical", {"within": "weighted_sum", "across": "weighted_sum"})
    np.testing.assert_allclose(_agg(r, [[1.0, 0.6, 0.9]])[0], [(4 * 0.7 + 2 * 0.9) / 6], rtol=1e-6)
    r = _rubric(dims, "hierarchical", {"within": "min", "across": "weighted_sum", "group_weights": {"style": 4.0}})
    # quality min 0.6 with weight 4 (default), style 0.9 with explicit weight 4 -> 0.75.
    np.testing.assert_allclose(_agg(r, [[1.0, 0.6, 0.9]])[0], [0.75], rtol=1e-6)
    # A whole group missing: renormalised away across groups.
    reward, ok = _agg(r, [[NAN, NAN, 0.9]])
    assert ok[0] and reward[0] == pytest.approx(0.9)


def test_healthbench_own_example():
    dims = [_dim(f"c{i}", abs(p), points=p) for i, p in enumerate([7, 5, 10, -6])]
    r = _rubric(dims, "healthbench_points")
    met = np.array([[1, 0, 1, 1]], float)
    goodness = np.where(r.points > 0, met, 1 - met)  # schema.normalize_scores convention
    reward, ok = _agg(r, goodness)
    assert reward[0] == pytest.approx((7 + 10 - 6) / (7 + 5 + 10)) == pytest.approx(0.5)
    # Only the bad criterion met -> negative raw score, clipped to 0; all good met, bad avoided -> 1.
    reward, _ = _agg(r, [[0, 0, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_allclose(reward, [0.0, 1.0])
    # The raw function on met indicators directly.
    raw, _ = healthbench_points(np.asarray(goodness, np.float32), np.ones((1, 4), bool), np.asarray(r.points))
    assert float(raw[0]) == pytest.approx(0.5)


def test_missing_scores_renormalize_vs_drop():
    dims = [_dim("a", 1), _dim("b", 1), _dim("c", 2)]
    scores = [[1.0, NAN, 0.0], [1.0, 0.5, 0.5], [NAN, NAN, NAN]]
    reward, ok = _agg(_rubric(dims), scores)
    np.testing.assert_allclose(reward, [1 / 3, 0.625, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(ok, [True, True, False])
    reward, ok = _agg(_rubric(dims, missing="drop"), scores)
    np.testing.assert_array_equal(ok, [False, True, False])
    np.testing.assert_allclose(reward, [0.0, 0.625, 0.0], rtol=1e-6)
    # valid=False counts as missing even when a number is present.
    reward, ok = _agg(_rubric(dims), [[1.0, 0.0, 0.0]], [[True, False, True]])
    assert reward[0] == pytest.approx(1 / 3) and ok[0]
    # A missing gate is never assumed passed.
    gated = _rubric([_dim("safety", gate=True), _dim("a")])
    reward, ok = _agg(gated, [[NAN, 1.0], [1.0, NAN]])
    np.testing.assert_array_equal(ok, [False, False])
    # healthbench_points renormalises over present criteria; no positive criterion left -> not ok.
    hb = _rubric([_dim("p", 4, points=4), _dim("q", 6, points=6), _dim("n", 2, points=-2)], "healthbench_points")
    reward, ok = _agg(hb, [[1.0, NAN, 0.0], [NAN, NAN, 1.0]])
    np.testing.assert_allclose(reward, [(4 - 2) / 4, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(ok, [True, False])


@pytest.mark.parametrize("method, params, groups", [
    ("weighted_sum", {}, False), ("weighted_geometric_mean", {"eps": 0.05}, False), ("min", {}, False),
    ("hierarchical", {"within": "weighted_geometric_mean", "across": "min"}, True),
    ("healthbench_points", {}, False),
])
def test_jit_matches_eager_and_rewards_in_unit_interval(method, params, groups):
    rng = np.random.default_rng(0)
    points = [5, -3, 2, 8, -1] if method == "healthbench_points" else [None] * 5
    dims = [_dim(f"d{i}", float(i + 1), gate=(i == 0 and method != "healthbench_points"),
                 group=("g" + str(i % 2)) if groups else None, points=points[i]) for i in range(5)]
    r = _rubric(dims, method, params)
    scores = rng.uniform(size=(16, 5)).astype(np.float32)
    scores[rng.uniform(size=scores.shape) < 0.2] = NAN
    valid = rng.uniform(size=scores.shape) > 0.1
    spec = spec_from_rubric(r)
    with jax.disable_jit():
        eager = aggregate(scores, valid, spec)
    jitted = aggregate_jit(scores, valid, spec)
    for e, j in zip(eager, jitted):
        np.testing.assert_allclose(np.asarray(e), np.asarray(j), rtol=1e-6)
    reward, ok = map(np.asarray, jitted)
    assert ((reward >= 0) & (reward <= 1)).all() and not np.isnan(reward).any()
    assert (reward[~ok] == 0).all()


def test_weights_override_and_registry_matches_schema():
    r = _rubric([_dim("a", 1), _dim("b", 1)])
    reward, _ = aggregate_rubric(r, np.array([[1.0, 0.0]], np.float32), np.ones((1, 2), bool),
                                 weights_D=np.array([3.0, 1.0]))
    assert reward[0] == pytest.approx(0.75)
    with pytest.raises(ValueError, match=r"weights: expected shape \(2,\)"):
        spec_from_rubric(r, np.ones(3))
    with pytest.raises(ValueError, match=r"scores: expected shape \[N, 2\]"):
        aggregate_rubric(r, np.ones((1, 3)), np.ones((1, 3), bool))
    assert set(LEVEL_FNS) | {"hierarchical", "healthbench_points"} == set(AGGREGATION_PARAMS)
    assert math.isclose(float(spec_from_rubric(r).eps), 1e-3)


def test_a_non_finite_reward_is_never_ok():
    """Weights outside the schema's range (here from a hand-built spec) overflow float32: not ok, reward 0."""
    r = _rubric([_dim("a"), _dim("b")])
    scores, valid = jax.numpy.asarray([[1.0, 0.5], [0.0, 1.0]]), jax.numpy.ones((2, 2), bool)
    for weights in ([np.inf, 1.0], [3e38, 3e38], [np.nan, 1.0]):
        reward, ok = aggregate_jit(scores, valid, spec_from_rubric(r, np.asarray(weights, np.float32)))
        np.testing.assert_array_equal(ok, [False, False])
        np.testing.assert_array_equal(reward, [0.0, 0.0])
