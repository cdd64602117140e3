"""Group selection (rl.group_selection, train/dynamic.py): the start-up checks, the statistic the groups are ranked by
(hand-computed, per-dimension included), which groups the rules keep (ties, the cut, refill order), and a GRPO
iteration of the tiny default whose refill round and batch are worked out here from the rounds' own rewards."""

import dataclasses
import os
import re
import signal
import time

import jax
import numpy as np
import pytest

from configs import tiny
from first_grpo_step import first_grpo_step
from rubric_jax import config_boundary, grpo
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.train import collect, dynamic, grpo_stage, rollout, scaffold, settings
from test_grpo_recipe import _LOG, _dim, _scored
from test_overlap import experiment, varied_rubric  # noqa: F401 (the fixture: rewards that vary)
from tiny_config import absolute_tiny_config

TOP_HALF = dynamic.DynamicSampling(rule="top_variance", fraction=0.5)
ZERO_STD = dynamic.DynamicSampling(rule="zero_std")


def _validate(**rl):
    config = tiny.get_config()
    with config.unlocked():
        config.rl.update(rl)
    return settings.validate(config_boundary.experiment(config)).dynamic_sampling


def test_the_rule_is_parsed_checked_at_start_up_and_off_by_default():
    assert tiny.get_config().rl.group_selection == "none" and _validate() is None
    assert _validate(group_selection="zero_std") == dynamic.DynamicSampling(rule="zero_std")
    assert _validate(group_selection=" top_variance( 0.5 ) ", dynamic_sampling_max_rounds=3) == (
        dynamic.DynamicSampling(max_rounds=3, rule="top_variance", fraction=0.5))
    usage = "expected 'none', 'zero_std' or 'top_variance(p)' with 0 < p < 1"
    for value, why in (("top_k", usage), ("top_variance", usage), ("zero_std(0.5)", usage),
                       ("top_variance(x)", f"p must be a number; {usage}"),
                       ("top_variance(1)", f"p=1.0 is not in (0, 1); {usage}"),
                       ("top_variance(nan)", f"p=nan is not in (0, 1); {usage}")):
        with pytest.raises(ValueError, match=re.escape(f"config.rl.group_selection={value!r}: {why}")):
            _validate(group_selection=value)
    with pytest.raises(ValueError, match=re.escape(usage)):
        dynamic.parse_group_selection(0.5)  # a config file's key keeps its type; a caller's may not
    with pytest.raises(ValueError, match=re.escape(
            "config.rl.group_selection='zero_std': rl.dynamic_sampling=True selects groups by its spread threshold: "
            "set one of the two")):
        _validate(group_selection="zero_std", dynamic_sampling=True)
    with pytest.raises(ValueError, match=re.escape(
            "config.rl.group_selection='top_variance(0.25)': keeping that top fraction takes 4 sampling rounds a step, "
            "rl.dynamic_sampling_max_rounds=2 allows 3: set rl.dynamic_sampling_max_rounds=3 (it bounds "
            "group_selection's refill rounds too)")):
        _validate(group_selection="top_variance(0.25)")
    assert _validate(group_selection="top_variance(0.25)", dynamic_sampling_max_rounds=3).max_rounds == 3
    with pytest.raises(ValueError, match=re.escape(  # DAPO's threshold would be ignored: one shared key is enough
            "config.rl.dynamic_sampling_min_spread=0.05: it is rl.dynamic_sampling's spread threshold; "
            "rl.group_selection='zero_std' keeps groups by their std and would ignore it")):
        _validate(group_selection="zero_std", dynamic_sampling_min_spread=0.05)


def test_top_variance_samples_one_over_p_rounds_and_keeps_no_group_outside_the_top_p():
    rounds = {p: dynamic.DynamicSampling(rule="top_variance", fraction=p).rounds_needed()
              for p in (0.5, 0.9, 0.34, 0.3, 0.25, 0.1, 1 / 3)}
    assert rounds == {0.5: 2, 0.9: 2, 0.34: 3, 0.3: 4, 0.25: 4, 0.1: 10, 1 / 3: 4}  # 0.3333333333333333 < 1/3
    assert dynamic.DynamicSampling(rule="top_variance", fraction=0.29).kept_count(100) == 29  # float: 28.999999999999996
    assert TOP_HALF.kept_count(7) == 3 and ZERO_STD.rounds_needed() is None


def test_the_std_is_the_one_the_advantages_divide_by():
    """Groups of 3 (sample std, ddof 1, over the trainable rows), checked against the zero-std groups of GRPO's own
    advantages: 0.1 three times has a float64 std of 1.7e-17, which a plain `std > 0` would keep."""
    reward = np.array([0.2, 0.5, 0.8, 0.1, 0.1, 0.1, 0.4, 0.4, 0.9, 0.1, 0.3, 0.9])
    trainable = np.array([True, True, True, True, True, True, True, True, False, True, True, False])
    std = dynamic.group_std(reward[:, None], trainable[:, None], np.ones((12, 1)), 3)
    np.testing.assert_allclose(std, [0.3, 0.0, 0.0, np.sqrt(0.02)], rtol=1e-6)
    assert std[1] == 0.0 == std[2]
    advantages, _ = grpo.group_advantages(reward.astype(np.float32), 3, valid_N=trainable)
    has_signal = np.abs(np.asarray(advantages)).reshape(4, 3).max(1) > 0
    np.testing.assert_array_equal(std > 0, has_signal)
    assert ZERO_STD.kept([std], 4) == [(0, 0), (0, 3)]


def test_the_per_dimension_statistic_is_the_weighted_mean_of_each_dimensions_std():
    """Weights 3 and 1, groups of 2. Group 0: d0 spreads (std √½), d1 does not: (3·√½ + 0) / 4. Group 1: the two
    dimensions trade off (1, 0) against (0, 1), equally weighted aggregate constant: the aggregate's spread is 0 but
    GDPO trains on it, and so does zero_std here. Group 2: one row's reward not ok, nothing left to spread."""
    rubric = Rubric("r", "1.0.0", _LOG, (_dim("d0", 3.0), _dim("d1", 1.0)))
    equal = Rubric("e", "1.0.0", _LOG, (_dim("d0", 1.0), _dim("d1", 1.0)))
    scores = np.array([[0, 1], [1, 1], [1, 0], [0, 1], [0, 0], [1, 1]])
    scored = _scored(scores)
    scored = RewardOutput(scored.scores, scored.valid, np.array([0.25, 1, 0.5, 0.5, 0, 1], np.float32), ["d0", "d1"],
                          {"reward_ok": np.array([True, True, True, True, True, False])})
    inputs = rollout.advantage_inputs(scored, "renormalize", rollout.Shaping("per_dimension"),
                                      rubrics=[rubric, rubric, equal, equal, rubric, rubric])
    std = dynamic.group_std(inputs.values_NxC, inputs.counted_NxC(), inputs.weights_NxC, 2)
    np.testing.assert_allclose(std, [3 * np.sqrt(0.5) / 4, np.sqrt(0.5), 0.0], rtol=1e-6)
    assert dynamic.group_spreads(scored.reward, scored.details["reward_ok"], 2)[1] == 0.0  # the spread rule drops it
    cfg = grpo.GRPOConfig(group_size=2)
    signal = rollout.rollout_advantages(scored, cfg, "renormalize", rollout.Shaping("per_dimension"),
                                        rubrics=[rubric, rubric, equal, equal, rubric, rubric])
    assert signal.zero_std_frac == pytest.approx(1 / 3)  # only group 2 is GDPO's zero-std group


def test_top_variance_keeps_the_top_fraction_ties_in_sampling_order():
    """Two rounds of 4 (S = 8): p = 0.5 keeps 4. 0.5 ties across rounds and 0.2 ties at the cut: the earlier
    sampled wins; the batch lists the kept groups in sampling order, round 0's first."""
    stats = [np.array([0.3, 0.0, 0.5, 0.2]), np.array([0.5, 0.2, 0.0, 0.1])]
    assert TOP_HALF.kept(stats, 4) == [(0, 0), (0, 2), (0, 3), (1, 0)]
    assert sorted(dynamic.select_groups(stats, 4, TOP_HALF)) == [(0, 0), (0, 2), (0, 3), (1, 0)]
    # Round 0 alone (the rounds ran out): ⌊0.5·4⌋ = 2 kept, then the widest dropped, ties in sampling order.
    assert dynamic.select_groups(stats[:1], 4, TOP_HALF) == [(0, 0), (0, 2), (0, 3), (0, 1)]
    zero = dynamic.DynamicSampling(rule="zero_std")
    assert zero.kept(stats, 4) == [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1), (1, 3)]
    assert dynamic.select_groups(stats, 4, zero) == [(0, 0), (0, 2), (0, 3), (1, 0)]  # the first 4 kept, not the top


def test_a_grpo_iteration_refills_one_round_and_trains_on_the_top_half(experiment, monkeypatch):
    """The overlap tests' tiny default (16 questions of 2 samples, rewards that vary): round 1's questions come from
    `draw`; the batch is the 16 groups of the 32 sampled whose rewards' sample std is largest (worked out here with
    numpy from each round's rewards; ties in sampling order), in sampling order, with their own rewards."""
    rounds = []
    sample_and_score = collect.sample_and_score

    def recorded(*args, **kwargs):
        rounds.append(sample_and_score(*args, **kwargs))
        return rounds[-1]

    monkeypatch.setattr(collect, "sample_and_score", recorded)
    questions, drawn = experiment.train_questions, []
    config = experiment.settings.config
    config = dataclasses.replace(config, log=dataclasses.replace(config.log, samples_per_step=32))
    exp = dataclasses.replace(experiment, settings=dataclasses.replace(experiment.settings, dynamic_sampling=TOP_HALF,
                                                                       config=config))
    _, out = first_grpo_step(exp, questions[:16], jax.random.key(5), lambda: drawn.append(questions[16:32]) or drawn[-1])
    row = grpo_stage.grpo_row(out)
    assert len(drawn) == 1 and [local.questions for local in rounds] == [questions[:16], questions[16:32]]
    seen = [(r, g) for r in range(2) for g in range(16)]
    std = {(r, g): float(np.std(rounds[r].scored.reward[2 * g:2 * g + 2].astype(np.float64), ddof=1)) for r, g in seen}
    top = sorted(sorted(seen, key=lambda rg: (-std[rg], rg))[:16])
    assert {r for r, _ in top} == {0, 1} and std[top[-1]] > 0  # both rounds give groups, none of them flat
    assert [s["question"] for s in out.samples] == [rounds[r].questions[g].question for r, g in top for _ in range(2)]
    np.testing.assert_array_equal([s["reward"] for s in out.samples],
                                  np.concatenate([rounds[r].scored.reward[2 * g:2 * g + 2] for r, g in top]))
    assert {k: row[k] for k in row if k.startswith("dynamic/")} == {
        "dynamic/seen_groups": 32.0, "dynamic/kept_groups": 16.0, "dynamic/dropped_groups": 16.0,
        "dynamic/rounds": 2.0, "dynamic/threshold_reached": pytest.approx(min(std[rg] for rg in top), rel=1e-6)}
    assert row["zero_std_frac"] == 0.0 and np.isfinite(row["loss"]) and row["skipped"] == 0.0


def test_the_kept_hinted_samples_keep_their_hint_marks(experiment, monkeypatch):
    """rl.rubric_hints with a refill (train/scaffold.py): each sample of the batch, whichever round it came from,
    carries in samples.jsonl the hint marks of the row that sampled it (row 0 of each group of 2 hinted, row 1
    plain)."""
    rounds = []
    sample_and_score = collect.sample_and_score
    monkeypatch.setattr(collect, "sample_and_score", lambda *a, **k: rounds.append(sample_and_score(*a, **k)) or
                        rounds[-1])
    questions, plan = experiment.train_questions, scaffold.StepHints(np.array([1.0, 0.0]), 1.0, 300)
    out, _ = collect.dynamic_rollout(experiment, experiment.initial_params(), questions[:16],
                                     experiment.settings.train_rollout, jax.random.key(5), lambda: questions[16:32],
                                     TOP_HALF, grpo_stage._group_statistic(experiment, TOP_HALF), hints=plan)
    marks = {}
    for local in rounds:
        for i, ids in enumerate(local.hint_ids_N):
            marks.setdefault((local.questions[i // 2].question, local.responses[i]), []).append(list(ids))
    assert len(rounds) == 2 and len(out.samples) == 32 and all(rounds[r].hint_ids_N[1::2] == ((),) * 16 for r in (0, 1))
    assert all(s["hint_criteria"] in marks[s["question"], s["response"]] and s["hinted"] == bool(s["hint_criteria"])
               for s in out.samples)
    assert sum(s["hinted"] for s in out.samples) == int((out.hint_counts_Nx3[:, 0] > 0).sum()) > 0


def test_a_run_killed_mid_way_resumes_to_the_rows_it_had_written(tmp_path, command_server):
    """experiments.run of the tiny default (GRPO only, 6 steps of 2 questions, checkpoints at steps 3 and 6; the
    overlap tests' rubric, whose rewards vary, so the drawn questions show in the batch) keeping the top half: every step draws a second batch of questions, which the checkpointed iterator position must
    include. SIGKILLed once step 4's row and step 3's checkpoint are written (the next save is two steps away), then rerun
    from step 3: it rewrites step 4 (and 5, if written) exactly as the uninterrupted process had, and samples.jsonl
    too (test_loop's comparison, wall-clock times aside). Two runs, not test_loop's three."""
    from test_loop import _rows, _wait_for_row

    rubric = varied_rubric(absolute_tiny_config().data.rubric, tmp_path)
    flags = ["--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}", f"--config.data.rubric={rubric}",
             "--config.data.golden=", "--config.stages=('grpo',)", "--config.rl.steps=6",
             "--config.rl.questions_per_step=2", "--config.rl.group_size=2", "--config.rl.micro_batches=1",
             "--config.rl.max_new_tokens=8", "--config.rl.group_selection=top_variance(0.5)",
             "--config.eval.max_questions=2", "--config.eval.max_new_tokens=4", "--config.eval.every_steps=6",
             "--config.checkpoint.every_steps=3", "--config.checkpoint.keep=1", "--config.export.at_end=False",
             "--config.export.which=latest", "--config.log.samples_per_step=4"]
    run = command_server("experiments.run")
    killed = run.start(*flags)
    _wait_for_row(tmp_path / "run", "grpo", 4, killed.running, lambda: killed.wait().stderr)
    while not (tmp_path / "run" / "checkpoints" / "grpo" / "3").is_dir():  # orbax saves asynchronously
        assert killed.running(), killed.wait().stderr[-3000:]
        time.sleep(0.1)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait().returncode == -signal.SIGKILL
    written, samples = _rows(tmp_path / "run"), _rows(tmp_path / "run", "samples.jsonl")
    resumed = run.run(*flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {tmp_path / 'run' / 'checkpoints' / 'grpo'} step 3" in resumed.stdout
    rows = _rows(tmp_path / "run")
    assert [row["step"] for row in rows if row["stage"] == "grpo"] == [1, 2, 3, 4, 5, 6]
    assert all(row["dynamic/rounds"] == 2.0 and row["dynamic/seen_groups"] == 4.0 for row in rows
               if row["stage"] == "grpo")
    assert rows[:len(written)] == written and any(row["step"] == 4 and row["stage"] == "grpo" for row in written)
    assert _rows(tmp_path / "run", "samples.jsonl")[:len(samples)] == samples
