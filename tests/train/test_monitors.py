"""Reward-hacking monitors: each value hand-computed on a small scored batch; alerts fire past (never at)
their thresholds, name the metric in the log line and land in alerts.jsonl; the windowed alerts read rolling means
(hand-computed sequences: a one-step spike does not fire, a sustained rise does, a resume continues the window);
thresholds and the window are validated by the monitor block."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from configs import common
from rubric_jax import metrics, schema
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.train import blocks, monitors

LIMITS = monitors.thresholds(blocks.MonitorBlock())

RESPONSES = ["Firstly, pay. Secondly, wait. Finally, check.", "首先，付款。其次，等待。最后，查看。",
             "first pay, then wait", "A plain answer.", "Another answer."]


def _scored(details: dict) -> RewardOutput:
    """5 rollouts, 3 dimensions; row 4's reward is not ok (left out of the correlation)."""
    scores = np.array([[1.0, 0.2, np.nan], [0.5, 0.2, np.nan], [1.0, np.nan, np.nan], [0.0, np.nan, np.nan],
                       [1.0, np.nan, np.nan]])
    return RewardOutput(scores=scores, valid=~np.isnan(scores), reward=np.array([0.1, 0.4, 0.3, 0.2, 0.0], np.float32),
                        dimension_ids=["a", "b", "c"],
                        details={"reward_ok": np.array([True, True, True, True, False]), **details})


def test_step_monitors_by_hand():
    out = monitors.step_monitors(RESPONSES, np.array([10, 40, 20, 30, 500]), _scored({}))
    assert out["monitor/template_share"] == 2 / 5  # EN and ZH templates; "first ... then" is not one
    # a: [1, .5, 1, 0, 1] -> mean .7, squared deviations .09 .04 .09 .49 .09 -> var .16; 3 of 5 at the top
    assert out["monitor/var/a"] == pytest.approx(0.16) and out["monitor/saturation/a"] == 3 / 5
    assert out["monitor/var/b"] == 0.0 and out["monitor/saturation/b"] == 0.0
    assert math.isnan(out["monitor/var/c"]) and math.isnan(out["monitor/saturation/c"])  # no valid score
    # ok rows: reward ranks 1 4 3 2, length ranks 1 4 2 3 -> sum d^2 = 2 -> rho = 1 - 6*2 / (4*15) = 0.8
    assert out["monitor/reward_length_corr"] == pytest.approx(0.8)
    assert math.isnan(out["monitor/judge_parse_failure"])  # no judge answers: undefined, not 0
    judged = monitors.step_monitors(RESPONSES, np.arange(5), _scored({"judge_prompts": 8, "judge_invalid": 2}))
    assert judged["monitor/judge_parse_failure"] == 0.25
    constant = monitors.step_monitors(RESPONSES, np.full(5, 7), _scored({}))
    assert math.isnan(constant["monitor/reward_length_corr"])  # constant length: Spearman undefined


def test_template_share_reads_the_answer_through_lookalikes():
    """Issue 24, R2: lookalike and invisible markers are templates; a template inside <think> is not the answer's."""
    responses = ["<think>t</think><answer>Fіrstly, pay. Sеcondly, wait. Fіnally, check.</answer>",
                 "Ｆｉｒｓｔｌｙ, pay. Ｓｅｃｏｎｄｌｙ, wait. Ｆｉｎａｌｌｙ, check.",
                 "Fi\u200brstly, pay. Se\u200bcondly, wait. Fi\u200bnally, check.",
                 "<think>Firstly, plan. Secondly, draft. Finally, answer.</think><answer>Pay, then wait.</answer>"]
    scored = RewardOutput(np.ones((4, 1)), np.ones((4, 1), bool), np.ones(4, np.float32), ["a"],
                          {"reward_ok": np.ones(4, bool)})
    assert monitors.step_monitors(responses, np.arange(4), scored)["monitor/template_share"] == 3 / 4


def test_missing_scores_and_judges_that_never_answer_are_alerted():
    """Issue 24, R3: a dimension whose scores went missing (here every row's c: its judge prompts were too long)
    is monitor/missing/c = 1 and alerts; rows whose rubric lacks a dimension are not missing scores; every judge
    prompt failing is a parse-failure share of 1, not NaN."""
    details = {"failures": {"a": 0, "b": 0, "c": 5}, "judge_prompts": 0, "judge_invalid": 0,
               "judge_prompt_too_long": 5}
    out = monitors.step_monitors(RESPONSES, np.arange(5), _scored(details))
    assert (out["monitor/missing/a"], out["monitor/missing/b"], out["monitor/missing/c"]) == (0.0, 0.0, 1.0)
    assert out["monitor/judge_parse_failure"] == 1.0
    half = {"failures": {"c": 1}, "judge_prompts": 4, "judge_invalid": 1, "judge_prompt_too_long": 0}
    assert monitors.step_monitors(RESPONSES, np.arange(5), _scored(half))["monitor/judge_parse_failure"] == 0.25
    messages = [a.message for a in monitors.find_alerts(3, "grpo", out, LIMITS)]
    assert messages == ["alert step 3: missing scores of c 1.00 > 0.20", "alert step 3: judge parse failures 1.00 > 0.10"]


def test_scores_too_long_to_judge_are_missing_scores():
    """Issue 38, R1: a score too long to judge is scored the minimum (valid, 0) yet still a missing score: every
    row of c is one, so monitor/missing/c is 1, not 1/2."""
    scored = _scored({"failures": {"a": 0, "b": 0, "c": 5}, "scored_minimum": {"a": 0, "b": 0, "c": 5},
                      "judge_prompts": 0, "judge_invalid": 0, "judge_prompt_too_long": 5})
    scored.scores[:, 2], scored.valid[:, 2] = 0.0, True
    assert monitors.step_monitors(RESPONSES, np.arange(5), scored)["monitor/missing/c"] == 1.0


def test_alerts_fire_past_the_threshold_only():
    row = {"monitor/template_share/window_mean": 0.61, "monitor/saturation/format/rise": 0.75,
           "monitor/saturation/format": 1.0,  # the step's own saturation: not alerted, its rise is
           "monitor/saturation/helpful/rise": 0.5, "monitor/template_share": 0.9,  # the step's own value: not alerted
           "monitor/reward_length_corr/window_mean": 0.5, "monitor/judge_parse_failure": float("nan"),
           "monitor/redundancy/clarity__quality": 0.9, "monitor/redundancy/clarity__safety": 0.89,
           "golden/spearman/helpful": 0.42, "golden/spearman/format": 0.6, "reward/mean": 0.9}
    alerts = monitors.find_alerts(120, "grpo", row, LIMITS)
    assert [a.message for a in alerts] == [
        "alert step 120: template share 0.61 > 0.40",
        "alert step 120: saturation rise of format over step 1 0.75 > 0.50",  # helpful rose exactly 0.5: no alert
        "alert step 120: redundancy: Spearman of clarity and quality 0.90 >= 0.90",  # at the threshold: fires
        "alert step 120: golden Spearman of helpful 0.42 < 0.60",  # reward-length 0.5 = its threshold: none
    ]
    assert (alerts[1].metric, alerts[1].value, alerts[1].threshold, alerts[1].op) == (
        "monitor/saturation/format/rise", 0.75, 0.5, ">")
    assert alerts[2].op == ">="
    windowed = monitors.find_alerts(28, "grpo", row, LIMITS, window=10)
    assert windowed[0].message == "alert step 28: template share, mean of steps 19-28 0.61 > 0.40"
    assert windowed[0].metric == "monitor/template_share/window_mean"
    [barely] = monitors.find_alerts(80, "grpo", {"monitor/template_share/window_mean": 0.4016}, LIMITS, window=10)
    assert barely.message == "alert step 80: template share, mean of steps 71-80 0.402 > 0.400"  # not 0.40 > 0.40


def _observe_shares(watch: monitors.Watch, shares: list[float], first_step: int = 1) -> list[dict]:
    """Rows of GRPO steps first_step, first_step + 1, ... whose template share is `shares` (length 40 tokens)."""
    return [watch.observe(step, {"stage": "grpo", "response_len/mean": 40.0, "monitor/template_share": share,
                                 "monitor/reward_length_corr": 0.0})
            for step, share in enumerate(shares, first_step)]


def test_a_one_step_spike_does_not_fire_the_template_alert(tmp_path):
    """Window 3, threshold 0.4: shares .1 .1 .9 .1 .1 have window means nan nan .3667 .3667 .3667 (the per-step
    check fired at .9)."""
    logged = []
    rows = _observe_shares(monitors.Watch(LIMITS, tmp_path, window=3, log=logged.append), [0.1, 0.1, 0.9, 0.1, 0.1])
    means = [row["monitor/template_share/window_mean"] for row in rows]
    assert math.isnan(means[0]) and math.isnan(means[1])  # fewer than 3 steps: no mean, no alert
    assert means[2:] == pytest.approx([1.1 / 3] * 3)
    assert logged == [] and not (tmp_path / metrics.ALERTS_FILE).exists()
    assert monitors.find_alerts(3, "grpo", {"monitor/template_share/window_mean": 0.9}, LIMITS)  # per step: fired


def test_a_sustained_rise_fires_naming_the_step_the_window_mean_and_the_threshold(tmp_path):
    """Window 3, shares .3 .4 .5 .6 .6: means nan nan .4 (= the threshold: no alert) .5 .5667 -> steps 4 and 5."""
    logged = []
    _observe_shares(monitors.Watch(LIMITS, tmp_path, window=3, log=logged.append), [0.3, 0.4, 0.5, 0.6, 0.6])
    assert logged == ["alert step 4: template share, mean of steps 2-4 0.50 > 0.40",
                      "alert step 5: template share, mean of steps 3-5 0.57 > 0.40"]
    lines = [json.loads(line) for line in (tmp_path / metrics.ALERTS_FILE).read_text().splitlines()]
    assert [(a["step"], a["metric"], a["threshold"]) for a in lines] == [
        (4, "monitor/template_share/window_mean", 0.4), (5, "monitor/template_share/window_mean", 0.4)]
    assert [a["value"] for a in lines] == pytest.approx([0.5, 1.7 / 3])


def test_a_resumed_watch_continues_the_window_from_metrics_jsonl(tmp_path):
    """Steps 1-3 logged (shares .2 .5 .5), then a new Watch at step 4 (.5): its window is steps 2-4 = .5 > .4; a
    NaN reward-length Spearman (a constant step) is left out of that mean, not counted as 0."""
    first = monitors.Watch(LIMITS, tmp_path, window=3)
    with metrics.MetricsWriter(tmp_path, tensorboard=False) as writer:
        for step, row in enumerate(_observe_shares(first, [0.2, 0.5, 0.5]), 1):
            writer.write(step, {**row, "monitor/reward_length_corr": [0.9, float("nan"), 0.6][step - 1]})
    logged = []
    [row] = _observe_shares(monitors.Watch(LIMITS, tmp_path, window=3, log=logged.append), [0.5], first_step=4)
    assert row["monitor/template_share/window_mean"] == pytest.approx(0.5)
    assert row["monitor/reward_length_corr/window_mean"] == pytest.approx(0.3)  # (nan, .6, 0): mean of .6 and 0
    assert logged == ["alert step 4: template share, mean of steps 2-4 0.50 > 0.40"]


def test_watch_measures_length_drift_from_the_first_step_and_appends_alerts(tmp_path):
    logged = []
    watch = monitors.Watch(LIMITS, tmp_path, log=logged.append)
    first = watch.observe(1, {"stage": "grpo", "response_len/mean": 40.0})
    assert first["monitor/length_drift"] == 0.0 and not (tmp_path / metrics.ALERTS_FILE).exists()
    with metrics.MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(1, first)
    second = watch.observe(2, {"stage": "grpo", "response_len/mean": 100.0, "monitor/template_share": 0.1})
    assert second["monitor/length_drift"] == 1.5  # 100 / 40 - 1
    assert logged == ["alert step 2: length drift 1.50 > 1.00"]
    resumed = monitors.Watch(LIMITS, tmp_path, log=logged.append)  # the first length comes back from metrics.jsonl
    assert resumed.observe(3, {"stage": "grpo", "response_len/mean": 20.0})["monitor/length_drift"] == -0.5
    resumed.observe(4, {"stage": "eval", "golden/spearman/format": 0.1})
    lines = [json.loads(line) for line in (tmp_path / metrics.ALERTS_FILE).read_text().splitlines()]
    assert [{k: v for k, v in line.items() if k != "time"} for line in lines] == [
        {"step": 2, "stage": "grpo", "metric": "monitor/length_drift", "value": 1.5, "threshold": 1.0, "op": ">",
         "message": "alert step 2: length drift 1.50 > 1.00"},
        {"step": 4, "stage": "eval", "metric": "golden/spearman/format", "value": 0.1, "threshold": 0.6, "op": "<",
         "message": "alert step 4: golden Spearman of format 0.10 < 0.60"}]


@pytest.mark.parametrize("field, value, message", [
    ("max_template_share", 1.5, "config.monitor.max_template_share=1.5: expected a number in [0, 1]"),
    ("max_length_drift", -1.0, "config.monitor.max_length_drift=-1.0: expected a number in [0, inf]"),
    ("min_golden_spearman", float("nan"), "config.monitor.min_golden_spearman=nan"),
    ("max_judge_parse_failure", True, "config.monitor.max_judge_parse_failure=True"),
    ("max_missing_share", 1.5, "config.monitor.max_missing_share=1.5: expected a number in [0, 1]"),
    ("window_steps", 0, "config.monitor.window_steps=0: expected an integer >= 1"),
    ("window_steps", 2.5, "config.monitor.window_steps=2.5: expected an integer >= 1"),
    ("window_steps", True, "config.monitor.window_steps=True: expected an integer >= 1"),
])
def test_thresholds_are_validated(field, value, message):
    """The monitor block checks each threshold against its bounds when it is made (once, at the boundary)."""
    monitor = common.base_config().monitor.to_dict()
    monitor[field] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        schema.from_mapping(blocks.MonitorBlock, monitor, "config.monitor")
    good = {"max_length_drift": float("inf"), "window_steps": 3}.get(field, 0.5)
    assert monitors.thresholds(schema.from_mapping(blocks.MonitorBlock, {**monitor, field: good}, "config.monitor"))


def _observe(watch: monitors.Watch, rows: list[dict], first_step: int = 1) -> list[dict]:
    """GRPO rows at steps first_step, first_step + 1, ... (length 40 tokens)."""
    return [watch.observe(step, {"stage": "grpo", "response_len/mean": 40.0, **row})
            for step, row in enumerate(rows, first_step)]


def test_saturation_alerts_on_a_rise_so_penalties_at_the_top_from_step_1_stay_silent(tmp_path):
    """Window 2. `penalty` sits at 1.0 from step 1 (as the template penalty does): rise 0, never an alert. `helpful`
    climbs .2 .2 .4 .9 1.0: first window mean .2; window means .2 .3 .65 .95 -> rises 0 .1 .45 .75 (> .5 at step 5).
    A resumed Watch reads the first window back from metrics.jsonl."""
    logged = []
    sat = [{"monitor/saturation/penalty": 1.0, "monitor/saturation/helpful": h} for h in (0.2, 0.2, 0.4, 0.9, 1.0)]
    rows = _observe(monitors.Watch(LIMITS, tmp_path, window=2, log=logged.append), sat)
    assert math.isnan(rows[0]["monitor/saturation/helpful/rise"])  # one step: no window mean yet
    assert [r["monitor/saturation/helpful/rise"] for r in rows[1:]] == pytest.approx([0.0, 0.1, 0.45, 0.75])
    assert all(r["monitor/saturation/penalty/rise"] == 0.0 for r in rows[1:])
    assert logged == ["alert step 5: saturation rise of helpful, mean of steps 4-5 over steps 1-2 0.75 > 0.50"]
    with metrics.MetricsWriter(tmp_path / "resumed", tensorboard=False) as writer:
        for step, row in enumerate(rows[:4], 1):
            writer.write(step, row)
    [again] = _observe(monitors.Watch(LIMITS, tmp_path / "resumed", window=2), sat[4:], first_step=5)
    assert again["monitor/saturation/helpful/rise"] == pytest.approx(0.75)


def test_zero_std_share_alerts_on_its_window_mean(tmp_path):
    logged = []
    rows = _observe(monitors.Watch(LIMITS, tmp_path, window=3, log=logged.append),
                    [{"zero_std_frac": z} for z in (1.0, 0.5, 0.9, 1.0, 1.0)])
    assert [r["zero_std_frac/window_mean"] for r in rows[2:]] == pytest.approx([0.8, 0.8, 2.9 / 3])
    assert logged == ["alert step 5: zero-std group share, mean of steps 3-5 0.97 > 0.90"]


def test_redundancy_over_the_window_skips_constant_pairs_and_survives_a_checkpoint(tmp_path):
    """Window 2, 12 rollouts a step: `clarity` and `quality` rank the rollouts alike (Spearman 1 over both steps),
    `length` does not, `format` is constant (skipped, not NaN); nothing before the window is full; the window saved
    in a checkpoint's metadata gives a restored Watch the same values."""
    rng = np.random.default_rng(0)

    def step_scores(offset):
        clarity = rng.permutation(12) / 12 + offset
        return np.stack([clarity, clarity ** 2, rng.uniform(size=12), np.ones(12)], axis=1)

    ids = ["clarity", "quality", "length", "format"]
    watch = monitors.Watch(LIMITS, tmp_path, window=2)
    first = step_scores(0.0)
    assert watch.redundancy(ids, first, np.ones_like(first, bool)) == {}
    restored = monitors.Watch(LIMITS, tmp_path, window=2)
    restored.load_scores_json(json.loads(json.dumps(watch.scores_to_json())))
    second = step_scores(1.0)
    valid = np.ones_like(second, bool)
    valid[0, 2] = False  # a missing length score: left out of its pairs
    out = watch.redundancy(ids, second, valid)

    assert set(out) == {"monitor/redundancy/clarity__quality", "monitor/redundancy/clarity__length",
                        "monitor/redundancy/quality__length"}
    assert out["monitor/redundancy/clarity__quality"] == pytest.approx(1.0)
    assert abs(out["monitor/redundancy/clarity__length"]) < 0.9
    assert restored.redundancy(ids, second, valid) == out
    [alert] = monitors.find_alerts(2, "grpo", out, LIMITS, window=2)
    assert alert.message == "alert step 2: redundancy: Spearman of clarity and quality, mean of steps 1-2 1.00 >= 0.90"


TINY_DEFAULT = Path(__file__).resolve().parents[1] / "fixtures" / "monitors" / "tiny_default_grpo.jsonl"


def test_the_defaults_stay_silent_on_the_tiny_default_and_fire_on_a_collapsed_reward(tmp_path):
    """The 60 GRPO rows of a tiny-default run (./launch.sh, 2026-12-01, commit 78323f5; the monitors step_monitors
    writes) replayed through a Watch with every default: no alert. The same run's first 10 steps, then 30 steps
    where every response gets one score (saturation 1.0 everywhere, zero_std_frac 1.0): the zero-std window mean
    passes 0.9 at the 9th
    collapsed step (.9 = 9 of 10) and fires at the 10th (step 20); politeness, 0.401 at the top over steps 1-10, rises
    past 0.5 at step 19; topic_keyword (.57) and disclaimer (.52) can rise .43 and .48 only, under the threshold;
    the format gate and the template penalty (0.93 at the top from the start) never fire."""
    config = common.base_config().monitor
    rows = [json.loads(line) for line in TINY_DEFAULT.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 61))
    silent = []
    (tmp_path / "tiny").mkdir()
    watch = monitors.Watch(LIMITS, tmp_path / "tiny", config.window_steps, log=silent.append)
    replayed = [watch.observe(r["step"], r) for r in rows]
    assert silent == []
    assert max(r["zero_std_frac/window_mean"] for r in replayed[9:]) == pytest.approx(0.1)
    assert max(r["monitor/saturation/disclaimer/rise"] for r in replayed[9:]) < 0.4  # the largest climb

    collapsed = rows[:10]
    dims = [k for k in rows[0] if k.startswith("monitor/saturation/")]
    collapsed += [{"step": s, "stage": "grpo", "response_len/mean": 60.0, "zero_std_frac": 1.0,
                   "monitor/template_share": 0.0, "monitor/reward_length_corr": float("nan"),
                   **dict.fromkeys(dims, 1.0)} for s in range(11, 41)]
    (tmp_path / "collapsed").mkdir()
    watch = monitors.Watch(LIMITS, tmp_path / "collapsed", config.window_steps, log=lambda _: None)
    for r in collapsed:
        watch.observe(r["step"], r)
    first: dict[str, int] = {}
    for alert in (json.loads(line) for line in (tmp_path / "collapsed" / metrics.ALERTS_FILE).read_text().splitlines()):
        first.setdefault(alert["metric"], alert["step"])
    assert first == {"zero_std_frac/window_mean": 20, "monitor/saturation/politeness/rise": 19}
