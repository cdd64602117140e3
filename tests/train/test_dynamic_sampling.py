"""DAPO's dynamic sampling (rl.dynamic_sampling, train/dynamic.py): group spreads, which groups fill the batch,
the settings' checks, and one GRPO iteration of the tiny default that runs its extra rounds."""

import re

import jax
import numpy as np
import pytest

from configs import tiny
from rubric_jax import config_boundary
from rubric_jax.train import dynamic, settings
from first_grpo_step import first_grpo_step
from tiny_config import absolute_tiny_config


def test_group_spreads_hand_computed():
    reward = np.array([0.2, 0.5, 0.9, 0.9, 0.3, 0.0, 0.7, 0.7])
    ok = np.array([True, True, True, True, True, False, False, True])
    # Group 0: 0.5 - 0.2; group 1: equal; group 2: one scorable row; group 3: 0.7 and an unscorable row: one row.
    np.testing.assert_allclose(dynamic.group_spreads(reward, ok, 2), [0.3, 0.0, 0.0, 0.0])


def test_kept_groups_first_then_the_least_flat_dropped_ones():
    spreads = [np.array([0.0, 0.4, 0.02]), np.array([0.3, 0.05, 0.0])]
    assert dynamic.select_groups(spreads, 3, dynamic.DynamicSampling(0.1)) == [(0, 1), (1, 0), (1, 1)]  # two kept, then the widest dropped
    assert dynamic.select_groups(spreads, 2, dynamic.DynamicSampling(0.0)) == [(0, 1), (0, 2)]  # enough kept in sampling order
    with pytest.raises(ValueError, match="6 groups sampled, 7 needed"):
        dynamic.select_groups(spreads, 7, dynamic.DynamicSampling(0.1))


def test_settings_are_checked_and_off_by_default():
    assert settings.validate(config_boundary.experiment(tiny.get_config())).dynamic_sampling is None
    config = tiny.get_config()
    with config.unlocked():
        config.rl.dynamic_sampling, config.rl.dynamic_sampling_max_rounds = True, 0
    with pytest.raises(ValueError, match=re.escape("config.rl.dynamic_sampling_max_rounds=0: expected an integer >= 1")):
        settings.validate(config_boundary.experiment(config))


def test_a_grpo_iteration_samples_extra_rounds_and_keeps_the_batch_shape(tmp_path):
    """A spread no group can exceed (rewards lie in [0, 1]): every extra round runs, each drawing a batch of
    questions, and the batch still holds questions_per_step groups (the widest-spread dropped ones)."""
    from rubric_jax.train import grpo_stage, loop

    config = absolute_tiny_config()
    with config.unlocked():
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens, config.rl.micro_batches = 2, 4, 8, 1
        config.rl.dynamic_sampling, config.rl.dynamic_sampling_min_spread, config.rl.dynamic_sampling_max_rounds = (
            True, 1.0, 2)
    run_ = loop.build(config, tmp_path / "run")
    extra = iter([run_.train_questions[2:4], run_.train_questions[4:6]])
    drawn = []

    def draw():
        drawn.append(next(extra))
        return drawn[-1]

    _, out = first_grpo_step(run_, run_.train_questions[:2], jax.random.key(0), draw)
    row = grpo_stage.grpo_row(out)
    assert len(drawn) == 2 and row["dynamic/rounds"] == 3.0
    assert row["dynamic/kept_groups"] == 0.0 and row["dynamic/dropped_groups"] == 6.0
    assert np.isfinite(row["loss"]) and row["skipped"] == 0.0
    with pytest.raises(ValueError, match="need `draw`"):
        first_grpo_step(run_, run_.train_questions[:2], jax.random.key(0))
