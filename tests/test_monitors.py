"""Reward-hacking monitors: each value hand-computed on a small scored batch; alerts fire past (never at)
their thresholds, name the metric in the log line and land in alerts.jsonl; thresholds are validated."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from configs import common
from rubric_jax import metrics
from rubric_jax.judges.reward import RewardOutput
from rubric_jax.train import monitors

LIMITS = monitors.thresholds(common.base_config().monitor)

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


def test_alerts_fire_past_the_threshold_only():
    row = {"monitor/template_share": 0.61, "monitor/saturation/format": 1.0, "monitor/saturation/helpful": 0.5,
           "monitor/reward_length_corr": 0.5, "monitor/judge_parse_failure": float("nan"),
           "golden/spearman/helpful": 0.42, "golden/spearman/format": 0.6, "reward/mean": 0.9}
    limits = {**LIMITS, "max_saturation": 0.5}
    alerts = monitors.find_alerts(120, "grpo", row, limits)
    assert [a.message for a in alerts] == [
        "alert step 120: template share 0.61 > 0.40",
        "alert step 120: saturation of format 1.00 > 0.50",  # helpful sits exactly at 0.5: no alert
        "alert step 120: golden Spearman of helpful 0.42 < 0.60",  # reward-length 0.5 = its threshold: none
    ]
    assert (alerts[1].metric, alerts[1].value, alerts[1].threshold, alerts[1].op) == (
        "monitor/saturation/format", 1.0, 0.5, ">")


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
])
def test_thresholds_are_validated(field, value, message):
    monitor = common.base_config().monitor.to_dict()
    monitor[field] = value
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        monitors.thresholds(monitor)
    assert monitors.thresholds({**monitor, field: float("inf") if field == "max_length_drift" else 0.5})
