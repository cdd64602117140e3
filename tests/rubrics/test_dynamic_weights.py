"""Dynamic weights: saturated dimensions lose weight within bounds; totals, floors and gates are preserved."""
import jax
import numpy as np
import pytest

from rubric_jax.rubrics.dynamic_weights import (
    DimensionWeights,
    DynamicWeightsConfig,
    init_dynamic_weights,
    update_dynamic_weights,
    update_dynamic_weights_jit,
    window_variance,
)

WINDOW = 4
CFG = DynamicWeightsConfig(enabled=True, var_threshold=0.01, min_samples=16, max_delta=0.05, min_fraction=0.2)


def _batch(rng, n=32):
    """Dim 0 saturated (always 1), dims 1-2 discriminating, dim 3 discriminating."""
    scores = rng.uniform(size=(n, 4)).astype(np.float32)
    scores[:, 0] = 1.0
    return scores, np.ones((n, 4), bool)


def _run(cfg, steps, weights=(1.0, 2.0, 1.0, 4.0), adjustable=None, jit=True):
    rng = np.random.default_rng(0)
    state = init_dynamic_weights(np.array(weights), WINDOW, adjustable)
    update = update_dynamic_weights_jit if jit else update_dynamic_weights
    history = [np.asarray(state.weights_D)]
    for _ in range(steps):
        state, metrics = update(state, *_batch(rng), cfg)
        history.append(np.asarray(metrics["weights"]))
    return state, metrics, np.stack(history)


def test_saturated_dimension_loses_weight_to_discriminating_ones():
    state, metrics, hist = _run(CFG, 30)
    w0 = hist[0]
    assert np.asarray(metrics["saturated"]).tolist() == [True, False, False, False]
    assert hist[-1][0] == pytest.approx(CFG.min_fraction * w0[0], rel=1e-5)  # driven to its floor
    assert (hist[-1][1:] > w0[1:]).all()
    # Freed weight goes to live dimensions in proportion to their original weights.
    gained = hist[-1][1:] - w0[1:]
    np.testing.assert_allclose(gained / gained.sum(), w0[1:] / w0[1:].sum(), rtol=1e-4)


def test_bounds_sum_and_positivity_hold_every_step():
    _, _, hist = _run(CFG, 30)
    total = hist[0].sum()
    steps = np.abs(np.diff(hist, axis=0))
    assert steps.max() <= CFG.max_delta * total + 1e-5
    assert steps.max() > 0.9 * CFG.max_delta * total  # the bound is reached, so it is what limits the move
    np.testing.assert_allclose(hist.sum(1), total, rtol=1e-5)
    assert (hist >= CFG.min_fraction * hist[0] - 1e-6).all()


def test_disabled_leaves_weights_unchanged_but_tracks_variance():
    cfg = DynamicWeightsConfig(enabled=False, var_threshold=0.01, min_samples=16)
    state, metrics, hist = _run(cfg, 6)
    assert (hist == hist[0]).all()
    assert np.asarray(metrics["saturated"])[0] and float(metrics["variance"][0]) == 0.0


def test_gates_never_move_and_warmup_waits_for_samples():
    state, _, hist = _run(CFG, 20, adjustable=np.array([True, True, True, False]))
    assert (hist[:, 3] == hist[0, 3]).all()
    np.testing.assert_allclose(hist.sum(1), hist[0].sum(), rtol=1e-5)
    cfg = DynamicWeightsConfig(enabled=True, var_threshold=0.01, min_samples=100)
    _, metrics, hist = _run(cfg, 3)  # 3 steps x 32 = 96 < 100 samples
    assert not np.asarray(metrics["saturated"]).any() and (hist == hist[0]).all()


def test_window_variance_is_pooled_over_the_ring_buffer_and_ignores_missing():
    state = init_dynamic_weights(np.ones(2), window=2)
    a = np.array([[0.0, np.nan], [1.0, 0.5]], np.float32)
    b = np.array([[1.0, 0.5], [1.0, 0.5]], np.float32)
    c = np.array([[0.0, 0.0], [0.0, 1.0]], np.float32)
    for batch in (a, b, c):  # window 2: only b and c remain
        state, _ = update_dynamic_weights(state, batch, np.ones((2, 2), bool), CFG)
    var, n = window_variance(state)
    np.testing.assert_allclose(np.asarray(n), [4, 4])
    np.testing.assert_allclose(np.asarray(var), [np.var([1, 1, 0, 0]), np.var([0.5, 0.5, 0, 1])], rtol=1e-6)
    state = init_dynamic_weights(np.ones(2), window=3)
    state, _ = update_dynamic_weights(state, a, np.array([[True, True], [True, False]]), CFG)
    np.testing.assert_allclose(np.asarray(window_variance(state)[1]), [2, 0])


def test_jit_matches_eager_and_config_validation():
    _, m_jit, h_jit = _run(CFG, 8, jit=True)
    with jax.disable_jit():
        _, m_eager, h_eager = _run(CFG, 8, jit=False)
    np.testing.assert_allclose(h_jit, h_eager, rtol=1e-5)
    for bad, field in (({"max_delta": 0.0}, "max_delta"),
                       ({"min_fraction": 1.5}, "min_fraction"), ({"var_threshold": 0.5}, "var_threshold"),
                       ({"enabled": 1}, "enabled"), ({"min_samples": 1}, "min_samples")):
        with pytest.raises(ValueError, match=f"dynamic_weights.{field}"):
            DynamicWeightsConfig(**bad)
    with pytest.raises(ValueError, match="positive weights"):
        init_dynamic_weights(np.array([1.0, 0.0]), 4)
    with pytest.raises(ValueError, match="dynamic_weights.window"):
        init_dynamic_weights(np.array([1.0, 1.0]), 0)
    assert not DynamicWeightsConfig().enabled


def test_dimension_that_discriminates_again_recovers_its_weight():
    rng = np.random.default_rng(1)
    state = init_dynamic_weights(np.array([1.0, 2.0, 1.0, 4.0]), WINDOW)
    for _ in range(10):
        state, _ = update_dynamic_weights_jit(state, *_batch(rng), CFG)
    low = float(state.weights_D[0])
    assert low == pytest.approx(0.2, rel=1e-5)
    for _ in range(30):  # dim 0 varies again; once the window forgets the saturated steps it climbs back
        scores, valid = _batch(rng)
        scores[:, 0] = rng.uniform(size=len(scores))
        state, metrics = update_dynamic_weights_jit(state, scores, valid, CFG)
    assert not np.asarray(metrics["saturated"]).any()
    np.testing.assert_allclose(np.asarray(state.weights_D), [1.0, 2.0, 1.0, 4.0], rtol=1e-4)


def _rubric(name, dims):
    """What for_rubrics reads of a Rubric: its name, version and its dimensions' id, weight and gate."""
    from types import SimpleNamespace

    return SimpleNamespace(name=name, version="1.0.0",
                           dimensions=[SimpleNamespace(id=d, weight=w, gate=g) for d, w, g in dims])


def test_two_rubrics_giving_one_dimension_id_different_weights_or_gates_are_refused():
    """One dynamic weight per dimension id replaces every rubric's own: case-wise rubrics giving 'x' weights 2 and
    9 had the first rubric's 2 stand for both (the second question's author weighting silently lost); a gate in one
    rubric only would have moved or not by the first. Refused at start-up naming the id, both rubrics and the field."""
    with pytest.raises(ValueError, match=r"config.rl.dynamic_weights=True: dimension 'x' has weight 9.0 in rubric 'b' "
                                         r"version 1.0.0 but 2.0 in rubric 'a' version 1.0.0: one dynamic weight per "
                                         r"dimension id replaces every rubric's own"):
        DimensionWeights.for_rubrics([_rubric("a", [("x", 2.0, False)]), _rubric("b", [("x", 9.0, False)])], 2)
    with pytest.raises(ValueError, match=r"dimension 'x' has gate True in rubric 'b' version 1.0.0 but False"):
        DimensionWeights.for_rubrics([_rubric("a", [("x", 2.0, False)]), _rubric("b", [("x", 2.0, True)])], 2)
    agreeing = DimensionWeights.for_rubrics([_rubric("a", [("x", 2.0, False)]), _rubric("b", [("x", 2.0, False)])], 2)
    assert agreeing.current() == {"x": 2.0}


def test_dimension_weights_map_each_steps_columns_by_id_and_round_trip_through_json():
    """The trainer's weights span every dimension id of a run; a step's scores come in any column order
    (or lack a dimension: it gets no statistics); the state survives a checkpoint's JSON exactly."""
    weights = DimensionWeights.for_rubrics([_rubric("a", [("fmt", 1.0, True), ("x", 2.0, False)]),
                                            _rubric("b", [("x", 2.0, False), ("y", 3.0, False)])], window=2)
    assert weights.ids == ["fmt", "x", "y"] and weights.current() == {"fmt": 1.0, "x": 2.0, "y": 3.0}
    scores = np.array([[0.5, 1.0], [0.25, 1.0]], np.float32)  # columns y, fmt
    logged = weights.update(["y", "fmt"], scores, np.ones((2, 2), bool))
    assert set(logged) == {"weight/fmt", "weight/x", "weight/y"}
    np.testing.assert_array_equal(np.asarray(weights.state.count_WxD)[0], [2, 0, 2])  # x had no scores
    np.testing.assert_allclose(np.asarray(weights.state.sum_WxD)[0], [2.0, 0.0, 0.75])
    again = DimensionWeights.for_rubrics([_rubric("b", [("fmt", 1.0, True), ("x", 2.0, False), ("y", 3.0, False)])], 2)
    again.load_json(weights.to_json())
    jax.tree.map(np.testing.assert_array_equal, again.state, weights.state)
