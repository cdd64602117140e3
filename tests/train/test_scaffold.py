"""RuscaRL's rubric-scaffolded rollouts (rl.rubric_hints, train/scaffold.py; arXiv 2508.16949): the schedule decays as
configured, the hints fit the prompt budget, the keys are checked and off by default, and GRPO steps of the tiny
default log the schedule and update on the plain prompts."""

import dataclasses
import math
import re

import jax
import numpy as np
import pytest
from transformers import AutoTokenizer

from configs import tiny
from rubric_jax import config_boundary, data
from rubric_jax.rubrics.schema import Anchor, ChangelogEntry, Dimension, Rubric, Scale
from rubric_jax.train import grpo_stage, loop, scaffold, settings
from tiny_config import absolute_tiny_config


def _schedule(**changes):
    return dataclasses.replace(scaffold.HintSchedule(share=1.0, decay="sigmoid", midpoint=0.2, steepness=125.0,
                                                     steps=60, max_chars=300), **changes)


def test_the_step_factor_decays_as_configured():
    """RuscaRL's step_sigmoid: 1/(1 + exp(steepness (x - midpoint))) at x = (step-1)/(steps-1); linear 1 - x."""
    sigmoid = _schedule(steepness=10.0, midpoint=0.3)
    for step in (1, 10, 30, 60):
        x = (step - 1) / 59
        assert sigmoid.step_factor(step) == pytest.approx(1 / (1 + math.exp(10 * (x - 0.3))))
    factors = [_schedule().step_factor(s) for s in range(1, 61)]
    assert factors[0] > 0.99999 and factors[-1] < 1e-40 and all(a >= b for a, b in zip(factors, factors[1:]))
    assert _schedule(midpoint=0.5, steps=3).step_factor(2) == 0.5  # halved at the midpoint
    assert [_schedule(decay="linear", steps=5).step_factor(s) for s in range(1, 6)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert _schedule(decay="none").step_factor(60) == 1.0
    assert _schedule(steps=1).step_factor(1) > 0.99  # one step: progress 0


def test_each_group_row_gets_its_share():
    """Intra-group differentiation: row j of G sees share x (G-1-j)/(G-1) x the step factor of its criteria."""
    hints = _schedule(share=0.5, decay="linear", steps=3)
    np.testing.assert_allclose(hints.row_shares(1, 5), [0.5, 0.375, 0.25, 0.125, 0.0])
    np.testing.assert_allclose(hints.row_shares(2, 5), [0.25, 0.1875, 0.125, 0.0625, 0.0])
    np.testing.assert_allclose(hints.row_shares(3, 5), 0.0)


def _rubric(descriptions):
    return Rubric("r", "1.0.0", (ChangelogEntry("1.0.0", "first", "test"),), tuple(
        Dimension(f"d{i}", d, "rule", Scale.binary(), {0: Anchor("no"), 1: Anchor("yes")}, rule="length",
                  params={"unit": "chars", "max": 10})
        for i, d in enumerate(descriptions)))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(absolute_tiny_config().model.tokenizer)


def test_hinted_prompts_show_the_planned_criteria_within_the_budget(tokenizer):
    """Sample 0 sees every criterion, the next ones fewer, the last the plain prompt; criteria are cut at max_chars
    and the list at the prompt budget (counted); the plain prompt is data.encode_prompts'."""
    rubric = _rubric(["Short.", "Thanks the user.", "x" * 500, "Names the topic."])
    plan = scaffold.StepHints(np.array([1.0, 0.5, 0.0]), 1.0, max_chars=20)
    plain = data.encode_prompts(tokenizer, ["Where is my order?"])[0]
    out = scaffold.hinted_prompts(tokenizer, ["Where is my order?"], [rubric], plan, 10_000, np.random.default_rng(0))
    assert out.shown_N.tolist() == [4, 2, 0] and out.criteria_N.tolist() == [4, 4, 4]
    assert out.trimmed_N.tolist() == [0, 0, 0] and out.ids[2] == plain
    assert out.shown_ids[0] == ("d0", "d1", "d2", "d3") and len(out.shown_ids[1]) == 2 and out.shown_ids[2] == ()
    assert list(out.shown_ids[1]) == sorted(out.shown_ids[1])  # rubric order
    text = tokenizer.decode(out.ids[0])
    assert scaffold.HINT_HEADER in text and "- " + "x" * 20 + "\n" in text and "x" * 21 not in text
    assert text.index("Short.") < text.index("Thanks the user.") < text.index("Names the topic.")  # rubric order
    budget = len(out.ids[1]) + 3  # room for 2 of the criteria sample 1 drew, not all 4 of sample 0's
    fitted = scaffold.hinted_prompts(tokenizer, ["Where is my order?"], [rubric], plan, budget,
                                     np.random.default_rng(0))
    assert all(len(ids) <= budget for ids in fitted.ids)
    assert fitted.shown_N[0] < 4 and fitted.trimmed_N[0] == 4 - fitted.shown_N[0]
    assert fitted.shown_ids[0] == ("d0", "d1", "d2", "d3")[:fitted.shown_N[0]]  # the criteria cut are not named
    assert scaffold.sample_fields(fitted.shown_ids[2]) == {"hinted": False, "hint_criteria": []}
    metrics = scaffold.hint_metrics(plan, out.shown_N, out.criteria_N, out.trimmed_N)
    assert metrics == {"hints/step_factor": 1.0, "hints/planned_share": 0.5, "hints/rows": 2.0,
                       "hints/row_share": pytest.approx(2 / 3), "hints/criteria_share": 0.5, "hints/trimmed": 0.0}


def test_regrouping_lays_one_row_per_sample_out_as_n_per_prompt():
    """Each process block's real rows kept in order, its padding re-cut (2 processes of 3 real rows in 4 slots ->
    blocks of 6 slots)."""
    x = np.arange(8 * 2).reshape(8, 2)
    out = np.asarray(scaffold._regrouped(x, processes=2, real=3, padded=6,
                                         sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])))
    np.testing.assert_array_equal(out[:3], x[:3])
    np.testing.assert_array_equal(out[6:9], x[4:7])
    assert out.shape == (12, 2) and not out[3:6].any() and not out[9:].any()


def test_keys_are_checked_and_off_by_default():
    assert scaffold.schedule(settings.validate(config_boundary.experiment(tiny.get_config())).config.rl) is None
    for changes, match in (
            ({"rubric_hints": 0.5}, "config.rl.rubric_hints=0.5: a hinted sample's update reads the plain prompt"),
            ({"rubric_hints": 0.5, "recompute_old_logprobs": True, "behaviour_correction_cap": 2.0},
             "config.rl.rubric_hints=0.5: the behaviour correction"),
            ({"rubric_hints": 1.5}, "config.rl.rubric_hints=1.5"),
            ({"rubric_hints_decay": "cosine"}, "config.rl.rubric_hints_decay='cosine'"),
            ({"rubric_hints_max_chars": 4}, "config.rl.rubric_hints_max_chars=4")):
        config = tiny.get_config()
        with config.unlocked():
            config.rl.update(changes)
        with pytest.raises(ValueError, match=re.escape(match)):
            settings.validate(config_boundary.experiment(config))


class _Runner:
    """What GRPOStage.step asks of the runner: none (no dynamic sampling)."""

    next_rows = None


def test_a_grpo_step_logs_the_schedule_and_updates_on_the_plain_prompt(tmp_path):
    """Step 1 of 3 with a linear decay: rows 0-2 of each group of 4 are planned hinted, the step's row (what the
    runner writes to metrics.jsonl) holds the schedule, and each sample (samples.jsonl) says whether its prompt
    showed criteria and which. The update reads the plain prompts, so the old log-probs
    recomputed there differ from the hinted sampler's: `logprob_gap/mean` is far above the float error it is
    without hints (below 1e-4: tests/train/test_loop.py)."""
    config = absolute_tiny_config()
    with config.unlocked():
        config.rl.questions_per_step, config.rl.group_size, config.rl.max_new_tokens, config.rl.micro_batches = 2, 4, 8, 1
        config.rl.steps, config.rl.beta = 3, 0.0
        config.rl.rubric_hints, config.rl.rubric_hints_decay, config.rl.recompute_old_logprobs = 1.0, "linear", True
        config.log.samples_per_step = 8
    exp = loop.build(config, tmp_path / "run")
    stage = grpo_stage.GRPOStage(exp, exp.initial_params())
    _, out = stage.step(stage.state, exp.train_questions[:2], 1, _Runner())
    row = stage.read_row(out)
    assert row["hints/step_factor"] == 1.0 and row["hints/planned_share"] == pytest.approx(0.5)
    assert 0 < row["hints/rows"] <= 6 and row["hints/criteria_share"] > 0  # rows 3 and 7 are plain
    assert row["logprob_gap/mean"] > 1e-3 and np.isfinite(row["loss"]) and row["skipped"] == 0.0
    hinted = [s["hinted"] for s in out.samples]
    assert len(hinted) == 8 and sum(hinted) == row["hints/rows"] and not hinted[3] and not hinted[7]
    ids = {d.id for d in exp.rubric_of[exp.train_questions[0].id].dimensions}
    assert all(s["hinted"] == bool(s["hint_criteria"]) and set(s["hint_criteria"]) <= ids for s in out.samples)
