"""The judge audit on policy outputs (train/audit.py, issue 23 §1): agreement and gap on hand-built verdicts, the gap
rise over a window of audits, the alerts they raise on hand-built series, config.audit's validation, and an eval of
the tiny default that writes the audit metrics to metrics.jsonl and plots them."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest

from configs.common import base_config
from rubric_jax import config_boundary, plots
from rubric_jax.train import audit, blocks, monitors, settings
from tiny_config import absolute_tiny_config

LEVELS = (1, 2, 3, 4, 5)


def _norm(raw):
    return (np.asarray(raw, np.float64) - 1) / 4


def test_agreement_and_gap_of_hand_built_verdicts():
    """Rows both judges scored only (the NaN row is left out): Spearman of ranks with ties averaged, kappa with
    quadratic weights, and the gap training minus audit in normalised units (worked by hand in the comments)."""
    train = np.array([1, 2, 3, 4, 5, np.nan])
    audited = np.array([1, 1, 3, 5, 4, 3])
    out = audit.dimension_metrics("clarity", LEVELS, train, audited, _norm(train), _norm(audited))
    # ranks 1..5 vs 1.5,1.5,3,5,4: cov 8.5, variances 10 and 9.5
    assert out["audit/spearman/clarity"] == pytest.approx(8.5 / math.sqrt(95))
    # observed weighted disagreement 1+1+1 = 3; expected by chance (2*30 + 10 + 15 + 30) / 5 = 23
    assert out["audit/kappa/clarity"] == pytest.approx(1 - 3 / 23)
    assert out["audit/gap/clarity"] == pytest.approx((0 + 0.25 + 0 - 0.25 + 0.25) / 5)  # the training judge pays more
    assert out["audit/n/clarity"] == 5


def test_a_statistic_that_does_not_exist_is_nan():
    constant = np.full(5, 3.0)
    out = audit.dimension_metrics("clarity", LEVELS, np.arange(1.0, 6.0), constant, _norm(np.arange(1.0, 6.0)),
                                  _norm(constant))
    assert math.isnan(out["audit/spearman/clarity"]) and out["audit/kappa/clarity"] == 0.0  # kappa exists: chance level
    both = audit.dimension_metrics("clarity", LEVELS, constant, constant, _norm(constant), _norm(constant))
    assert math.isnan(both["audit/kappa/clarity"]) and both["audit/gap/clarity"] == 0.0
    none = audit.dimension_metrics("clarity", LEVELS, np.full(4, np.nan), constant[:4], np.full(4, np.nan),
                                   _norm(constant[:4]))
    assert math.isnan(none["audit/gap/clarity"]) and none["audit/n/clarity"] == 0


def test_the_gap_rise_is_measured_from_the_smallest_gap_of_the_window():
    assert math.isnan(audit.gap_rise([], 0.3, 5))  # the first audit
    assert audit.gap_rise([0.05, 0.02, 0.04], 0.15, 5) == pytest.approx(0.13)
    assert audit.gap_rise([0.05, 0.02, 0.04], 0.15, 1) == pytest.approx(0.11)  # only the last audit
    assert audit.gap_rise([0.0, math.nan], 0.15, 2) == pytest.approx(0.15)  # a NaN gap is skipped
    assert audit.gap_rise([0.3, 0.3], 0.3, 5) == 0.0  # a gap that starts high and stays there does not rise


def test_earlier_gaps_are_read_from_the_logged_eval_rows_before_the_step():
    rows = [{"stage": "eval", "step": 10, "audit/gap/clarity": 0.2, "audit/gap/clarity/rise": 0.1},
            {"stage": "grpo", "step": 10, "audit/gap/clarity": 9.0},
            {"stage": "eval", "step": 0, "audit/gap/clarity": "nan"},
            {"stage": "eval", "step": 20, "audit/gap/clarity": 0.5}]
    gaps = audit.previous_gaps(rows, 20)
    assert list(gaps) == ["audit/gap/clarity"]
    assert math.isnan(gaps["audit/gap/clarity"][0]) and gaps["audit/gap/clarity"][1:] == [0.2]


def test_the_audited_rows_are_a_fixed_seeded_subset():
    rows = audit.sample_rows(40, 8)
    assert len(set(rows)) == 8 and list(rows) == sorted(rows) and rows.max() < 40
    assert (audit.sample_rows(40, 8) == rows).all() and list(audit.sample_rows(5, 8)) == [0, 1, 2, 3, 4]


def _replay(tmp_path: Path, gaps, agreements) -> list[dict]:
    """Eval rows every 10 steps with these gaps and Spearmans (kappa 0.9), their rises computed from the rows logged
    before them, observed by monitors.Watch with the default thresholds; the alerts it wrote."""
    limits = monitors.thresholds(blocks.MonitorBlock())
    tmp_path.mkdir()
    watch, logged = monitors.Watch(limits, tmp_path, window=10, log=lambda line: None), []
    window = base_config().audit.window
    for i, (gap, rho) in enumerate(zip(gaps, agreements)):
        step = 10 * i
        earlier = audit.previous_gaps(logged, step).get("audit/gap/clarity", [])
        row = {"stage": "eval", "step": step, "audit/gap/clarity": gap, "audit/spearman/clarity": rho,
               "audit/kappa/clarity": 0.9, "audit/gap/clarity/rise": audit.gap_rise(earlier, gap, window)}
        logged.append(watch.observe(step, row))
    path = tmp_path / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_growing_gap_and_a_falling_agreement_alert_and_flat_ones_do_not(tmp_path):
    grows = _replay(tmp_path / "grows", [0.02, 0.04, 0.08, 0.14, 0.2], [0.8, 0.75, 0.7, 0.62, 0.55])
    assert [(a["step"], a["metric"]) for a in grows] == [
        (30, "audit/gap/clarity/rise"), (40, "audit/spearman/clarity"), (40, "audit/gap/clarity/rise")]
    assert grows[0]["value"] == pytest.approx(0.12) and grows[0]["threshold"] == 0.1
    assert grows[1]["message"] == "alert step 40: audit spearman of clarity (training vs audit judge) 0.55 < 0.60"
    # a gap that is large from the start but does not grow, noise under the threshold, agreement above the floor
    assert _replay(tmp_path / "flat", [0.3, 0.33, 0.27, 0.35, 0.3, 0.36], [0.7, 0.65, 0.8, 0.61, 0.7, 0.9]) == []


@pytest.mark.parametrize("key, value, message", [
    ("sample_size", 2, "config.audit.sample_size=2: expected an integer >= 3"),
    ("window", 0, "config.audit.window=0: expected an integer >= 1"),
    ("rubric", "r.yaml", "config.audit.rubric='r.yaml': there is no audit judge to read it"),
])
def test_a_bad_audit_value_is_one_line_naming_it(key, value, message):
    config = absolute_tiny_config()
    config.audit[key] = value
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        settings.validate(config_boundary.experiment(config))


def test_the_audit_judge_is_a_judge_spec_validated_as_config_judge_is():
    config = absolute_tiny_config()
    assert settings.validate(config_boundary.experiment(config)).audit is None  # no audit judge: no audit
    config.audit.judge.checkpoint = config.judge.checkpoint
    config.audit.judge.samples = 0
    with pytest.raises(ValueError, match=r"config.audit.judge.samples=0: expected an integer >= 1"):
        settings.validate(config_boundary.experiment(config))


def _clarity_rubric(name: str, lo: int, hi: int):
    """A case-wise rubric `name` whose one LLM dimension 'clarity' is on the scale lo..hi."""
    from rubric_jax.rubrics.schema import rubric_from_dict

    return rubric_from_dict({
        "name": name, "version": "1.0.0", "changelog": [{"version": "1.0.0", "change": "first", "reason": "test"}],
        "dimensions": [{"id": "clarity", "description": "clear", "kind": "llm", "scale": {"kind": "integer", "lo": lo,
                        "hi": hi}, "anchors": {str(k): {"description": f"level {k}"} for k in range(lo, hi + 1)}}]})


def _scored(raw, rubrics):
    """A RewardOutput with these raw 'clarity' scores, normalised on each row's own rubric's scale."""
    from rubric_jax.judges.reward import RewardOutput

    lo_hi = np.array([r.dimension("clarity").scale.raw_range for r in rubrics], np.float64)
    raw_N = np.asarray(raw, np.float64)
    norm_N = (raw_N - lo_hi[:, 0]) / (lo_hi[:, 1] - lo_hi[:, 0])
    return RewardOutput(norm_N[:, None], np.ones((len(raw_N), 1), bool), norm_N, ["clarity"],
                        {"raw_scores": raw_N[:, None], "reward_ok": np.ones(len(raw_N), bool)})


def test_case_wise_rubrics_that_give_one_id_two_scales_are_audited_each_on_its_own():
    """'clarity' on 1..5 in one question's rubric and on 0..2 in another's: the audit reads each row on its own
    rubric's scale, per scale ('clarity@1-5', 'clarity@0-2'), never one rubric's levels for every row (there a
    5 on the 1..5 scale was read as the 0..2 scale's 2 and two agreeing judges got a kappa below 1)."""
    wide, narrow = _clarity_rubric("q_wide", 1, 5), _clarity_rubric("q_narrow", 0, 2)
    rubrics, raw = [wide] * 3 + [narrow] * 3, [1, 3, 5, 0, 2, 1]
    samples = [{"question": f"q{i}", "response": str(v)} for i, v in enumerate(raw)]

    def agreeing_judge(questions, responses, rows_rubrics, key=None):
        return _scored([float(r) for r in responses], rows_rubrics)

    settings_ = audit.AuditSettings(judge=None, rubric="", sample_size=8, window=3)
    judged = audit.Audit(settings_, agreeing_judge, None)
    out = judged(0, samples, rubrics, _scored(raw, rubrics), None, [])
    for name in ("clarity@1-5", "clarity@0-2"):
        assert out[f"audit/kappa/{name}"] == 1.0 and out[f"audit/spearman/{name}"] == pytest.approx(1.0)
        assert out[f"audit/gap/{name}"] == 0.0 and out[f"audit/n/{name}"] == 3
    assert not any(k.endswith("/clarity") for k in out)
    one_scale = judged(0, samples[:3], rubrics[:3], _scored(raw[:3], rubrics[:3]), None, [])
    assert one_scale["audit/kappa/clarity"] == 1.0 and one_scale["audit/n/clarity"] == 3  # the name stays plain


def test_an_audit_rubric_is_checked_against_every_run_rubric_with_its_dimension(monkeypatch):
    """Each case-wise rubric is compared, not one standing for all: the 0..2 'clarity' of the first question's
    rubric is found though a later one has the audit rubric's 1..5 (judges not loaded: the check is the rubrics')."""
    from rubric_jax.judges.spec import JudgeSpec

    wide, narrow = _clarity_rubric("q_wide", 1, 5), _clarity_rubric("q_narrow", 0, 2)
    monkeypatch.setattr(audit, "load_judges", lambda *args, **kwargs: ())
    monkeypatch.setattr(audit, "load_cascade", lambda *args, **kwargs: ())
    monkeypatch.setattr(audit, "load_rubric", lambda path: wide)
    settings_ = audit.AuditSettings(judge=JudgeSpec(), rubric="a.yaml", sample_size=8, window=3)
    with pytest.raises(ValueError, match=r"config.audit.rubric=a.yaml: dimension 'clarity' has levels \[1, 2, 3, 4, "
                                         r"5\], the run's rubric 'q_narrow' version 1.0.0 \[0, 1, 2\]: agreement needs "
                                         r"one scale"):
        audit.build_audit(settings_, None, [narrow, wide])
    assert audit.build_audit(settings_, None, [wide, _clarity_rubric("q_other", 1, 5)]).rubric == wide


def test_a_run_plots_the_audit_metrics_with_their_thresholds(tmp_path):
    rows = [{"stage": "eval", "step": step, "audit/spearman/clarity": rho, "audit/kappa/clarity": rho - 0.1,
             "audit/gap/clarity": gap, "audit/gap/clarity/rise": rise, "audit/n/clarity": 32.0}
            for step, rho, gap, rise in ((0, 0.9, 0.0, math.nan), (10, 0.7, 0.1, 0.1), (20, 0.5, 0.2, 0.2))]
    written = plots.plot_metrics(rows, tmp_path, base_config().monitor.to_dict())
    assert {"audit_agreement.png", "audit_gap.png", "audit_gap_rise.png"} <= {Path(p).name for p in written}


def test_an_eval_writes_the_audit_metrics_to_metrics_jsonl(tmp_path):
    """The tiny default audited by its own judge (gates off, so every eval answer of the random policy is judged on
    politeness; no golden set, to keep it short): the eval row in metrics.jsonl carries audit/* for the LLM
    dimension, and the second audit a rise from the first."""
    from rubric_jax.train import grpo_stage, loop

    config = absolute_tiny_config()
    with config.unlocked():
        config.audit.judge = config.judge.copy_and_resolve_references()
        config.audit.sample_size = 6
        config.reward.gates_first = False
        config.data.golden = ""
        config.eval.max_questions, config.eval.max_new_tokens = 8, 16
    run_ = loop.build(config, tmp_path)
    params = run_.initial_params()
    state = types.SimpleNamespace(params=params, model_params=lambda: params)  # a TrainState's reads
    first = grpo_stage.evaluate(run_, state, 0)
    second = grpo_stage.evaluate(run_, state, 10)
    run_.log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("stage") == "eval"]
    assert [r["step"] for r in evals] == [0, 10]
    llm = {d.id for q in run_.eval_questions for d in run_.rubric_of[q.id].dimensions if d.kind == "llm"}
    assert llm and {k.split("/")[2] for k in evals[0] if k.startswith("audit/")} == llm
    for dim in llm:
        assert 3 <= first[f"audit/n/{dim}"] <= 6 and math.isfinite(first[f"audit/gap/{dim}"])
        assert math.isnan(first[f"audit/gap/{dim}/rise"])
        assert second[f"audit/gap/{dim}/rise"] == pytest.approx(second[f"audit/gap/{dim}"] - first[f"audit/gap/{dim}"])
