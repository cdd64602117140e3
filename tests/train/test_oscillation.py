"""The learning-rate drop on an oscillating reward (rl.lr_on_oscillation, RubricRL §4.3): the oscillation measure
by hand, the replayed drops, the optimizer factor equal to a lower learning rate, and resume == uninterrupted."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import tiny
from rubric_jax import config_boundary
from rubric_jax.train import oscillation, settings, state as train_state

RULE = oscillation.OscillationRule(window=5, ratio=4.0, min_swing=0.02, factor=0.5, min_factor=0.25)


def test_oscillation_hand_computed():
    assert oscillation.oscillation([0.0, 0.1, 0.2, 0.3]) == pytest.approx((1.0, 0.1))  # a steady rise
    ratio, swing = oscillation.oscillation([0.4, 0.5, 0.4, 0.5, 0.45])
    assert ratio == pytest.approx(0.35 / 0.05) and swing == pytest.approx(0.35 / 4)
    assert oscillation.oscillation([0.4, 0.5, 0.4]) == (math.inf, pytest.approx(0.1))  # back where it started
    assert oscillation.oscillation([0.3, 0.3, 0.3]) == (0.0, 0.0)


def test_drops_replayed_from_the_logged_rewards():
    zigzag = {s: 0.4 + 0.1 * (s % 2) for s in range(1, 41)}
    # Steps 1..5 fill the first window (it oscillates); the update of step 7 reads rewards <= 5: the first drop.
    assert oscillation.lr_factor_at(zigzag, 6, RULE) == (1.0, [])
    assert oscillation.lr_factor_at(zigzag, 7, RULE) == (0.5, [5])
    # The next drop needs a full window after the first; then the floor (0.25) stops further drops.
    assert oscillation.lr_factor_at(zigzag, 12, RULE) == (0.25, [5, 10])
    assert oscillation.lr_factor_at(zigzag, 40, RULE) == (0.25, [5, 10])
    rising = {s: 0.01 * s for s in range(1, 41)}
    quiet = {s: 0.5 + 0.001 * (s % 2) for s in range(1, 41)}  # flips, but swings below min_swing
    assert oscillation.lr_factor_at(rising, 40, RULE) == (1.0, [])
    assert oscillation.lr_factor_at(quiet, 40, RULE) == (1.0, [])
    with_nan = {**zigzag, 3: float("nan")}  # a step without a reward is skipped, as if never logged
    without = {s: r for s, r in zigzag.items() if s != 3}
    assert oscillation.lr_factor_at(with_nan, 20, RULE) == oscillation.lr_factor_at(without, 20, RULE)


def test_a_resumed_controller_decides_what_the_uninterrupted_one_did():
    rewards = [0.4 + 0.1 * (s % 2) + 0.002 * s for s in range(1, 31)]
    params = {"w": jnp.ones((2,))}
    tx = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=1e-3), adjustable_lr=True)

    def run(steps, controller, opt_state):
        factors = []
        for step in steps:
            opt_state = controller.before_step(opt_state, step)
            factors.append(float(train_state.lr_factor(opt_state)))
            controller.observe(step, {"reward/mean": rewards[step - 1]})
        return factors, opt_state

    whole, _ = run(range(1, 31), oscillation.LearningRateDrop(RULE), tx.init(params))
    first, opt_state = run(range(1, 16), oscillation.LearningRateDrop(RULE), tx.init(params))
    resumed = oscillation.LearningRateDrop(RULE)
    resumed.restore([{"stage": "grpo", "step": s, "reward/mean": rewards[s - 1]} for s in range(1, 16)],
                    float(train_state.lr_factor(opt_state)))
    second, _ = run(range(16, 31), resumed, opt_state)
    assert first + second == whole and min(whole) < 1.0


def test_the_factor_is_the_learning_rate_times_it_exactly():
    """AdamW with weight decay, factor 0.5 == learning rate halved, update for update; current_lr reports it."""
    params = {"w": jnp.array([[0.5, -1.0], [2.0, 0.3]]), "bias": jnp.array([0.1, -0.2])}
    grads = jax.tree.map(lambda p: 0.3 * p + 0.1, params)
    cfg = train_state.OptimizerConfig(learning_rate=1e-2, weight_decay=0.1)
    halved = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=5e-3, weight_decay=0.1))
    adjustable = train_state.make_optimizer(cfg, adjustable_lr=True)
    state_h, state_a = halved.init(params), train_state.set_lr_factor(adjustable.init(params), 0.5)
    for _ in range(3):
        up_h, state_h = halved.update(grads, state_h, params)
        up_a, state_a = adjustable.update(grads, state_a, params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), up_a, up_h)
    assert float(train_state.current_lr(state_a)) == pytest.approx(5e-3)
    assert train_state.lr_factor(train_state.make_optimizer(cfg).init(params)) is None  # default: no factor
    with pytest.raises(ValueError, match="no learning-rate factor"):
        train_state.set_lr_factor(train_state.make_optimizer(cfg).init(params), 0.5)
    assert isinstance(optax.tree_utils.tree_get(state_a, "lr_factor"), jax.Array)


def _config(**rl):
    config = tiny.get_config()
    with config.unlocked():
        for key, value in rl.items():
            config.rl[key] = value
    return config


def test_the_rule_is_validated_and_off_by_default():
    assert settings.validate(config_boundary.experiment(tiny.get_config())).oscillation is None
    checked = settings.validate(config_boundary.experiment(_config(lr_on_oscillation=True, oscillation_window=10)))
    assert checked.oscillation == oscillation.OscillationRule(window=10)
    for key, value, message in (("oscillation_window", 2, "config.rl.oscillation_window=2: expected an integer >= 3"),
                                ("lr_drop_factor", 1.5, "config.rl.lr_drop_factor=1.5: expected in (0, 1)"),
                                ("oscillation_ratio", 0.5, "config.rl.oscillation_ratio=0.5")):
        with pytest.raises(ValueError, match=re.escape(message)):
            settings.validate(config_boundary.experiment(_config(lr_on_oscillation=True, **{key: value})))
