"""Calibration library: judge-vs-label and judge-vs-judge reports equal to scipy/sklearn on the scores the
training reward produces, LLM dimensions through a scripted judge, bias and position probes, fitted
corrections (applied exactly as their coefficients say, changing the rubric-set hash), labels errors."""

import json
import re

import jax
import numpy as np
import pytest
import scipy.stats
from sklearn.metrics import cohen_kappa_score

from rubric_jax.calibration import bias
from rubric_jax.calibration.correction import fit_correction
from rubric_jax.calibration.labels import DimensionInfo, LabelledItem, LabelsError, read_items
from rubric_jax.calibration.report import markdown, write_calibration
from rubric_jax.calibration import run
from rubric_jax.calibration.run import CalibrationError, Settings, calibrate
from rubric_jax.judges import llm_judge as lj
from rubric_jax.judges.features import response_features
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.rubrics.correction import Correction, DimensionCorrection, correction_from_dict, load_correction
from rubric_jax.rubrics.schema import RubricError
from rubric_jax.train.experiment import rubric_set_hash
from test_llm_judge import criteria_ids, fenced, make_judge, tiny_tokenizer
from test_reward import ACCURACY, LENGTH, LEVELS_1_5, SAFETY, rubric

FAST = Settings(num_resamples=50)
TONE = {"id": "tone", "description": "polite", "kind": "llm", "scale": {"kind": "integer", "lo": 1, "hi": 5},
        "anchors": LEVELS_1_5}
LLM_RUBRIC = rubric([ACCURACY, TONE], name="llm")
RULE_RUBRIC = rubric([LENGTH, SAFETY], name="rules")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def digit_judge(tok, **kwargs):
    """A content-reading judge: every dimension gets the first digit of the response (1 when there is none)."""
    def reply(text, call):
        m = re.search(r"[1-5]", fenced(text, "response"))
        return f"Read it.\nSCORE: {m.group(0) if m else 1}"

    return make_judge(tok, reply, **kwargs)


def items_for(rubric_, responses, labels):
    return [LabelledItem(f"mem:{i + 1}", "q", r, rubric_, lab) for i, (r, lab) in enumerate(zip(responses, labels))]


def scipy_stats(x, y, levels):
    return {"spearman": scipy.stats.spearmanr(x, y).statistic, "kendall": scipy.stats.kendalltau(x, y).statistic,
            "kappa_quadratic": cohen_kappa_score(np.floor(np.asarray(x) + 0.5).astype(int),
                                                 np.floor(np.asarray(y) + 0.5).astype(int), weights="quadratic",
                                                 labels=list(levels))}


def test_llm_dimensions_scored_by_a_scripted_judge_match_scipy_and_flag_the_weak_one(tok):
    rng = np.random.default_rng(0)
    digits = rng.integers(1, 6, 16)
    responses = [f"answer worth {d}" for d in digits]
    accuracy = np.clip(digits + rng.integers(-1, 2, 16), 1, 5)  # people agree with the judge, roughly
    tone = rng.integers(1, 6, 16)  # people see something the judge does not read at all
    items = items_for(LLM_RUBRIC, responses, [{"accuracy": int(a), "tone": int(t)} for a, t in zip(accuracy, tone)])
    judge, stub = digit_judge(tok)
    result = calibrate(items, FAST, judges=[judge], judge_spec=JudgeSpec(samples=1))
    dims = result.report["dimensions"]
    for dim_id, labels in (("accuracy", accuracy), ("tone", tone)):
        expected = scipy_stats(digits, labels, range(1, 6))
        for name, value in expected.items():
            assert dims[dim_id][name]["value"] == pytest.approx(value, abs=1e-6), (dim_id, name)
        assert dims[dim_id]["n"] == 16 and dims[dim_id]["kind"] == "llm"
    assert expected["spearman"] < 0.6 and dims["tone"]["flagged"] and result.report["flagged"] == ["tone"]
    assert not dims["accuracy"]["flagged"] and dims["accuracy"]["spearman"]["value"] > 0.6
    lo, hi = dims["accuracy"]["spearman"]["ci95"]
    assert lo <= dims["accuracy"]["spearman"]["value"] <= hi
    # One batched judge call per scoring pass: calibration, then the position probe's two fixed orders.
    assert len(stub.calls) == 3 and stub.calls[0]["batch"] == 32
    assert result.report["position_probe"]["accuracy"]["mean_abs_shift"] == 0.0  # a content judge ignores order


def test_position_probe_reverses_anchors_and_measures_the_shift(tok):
    def reply(text, call):
        """Scores `accuracy` by the first anchor level listed (pure position bias); `tone` by content."""
        if criteria_ids(text) == ["accuracy"]:
            return "SCORE: " + re.search(r"  Level (\d+):", text).group(1)
        return "SCORE: 3"

    judge, stub = make_judge(tok, reply)
    items = items_for(LLM_RUBRIC, ["a", "b", "c", "d"], [{"accuracy": 3}] * 4)
    probe = calibrate(items, FAST, judges=[judge], judge_spec=JudgeSpec(samples=1)).report["position_probe"]
    assert probe["accuracy"] == {"n": 4, "unscored": 0, "mean_shift": 4.0, "mean_shift_ci95": [4.0, 4.0],
                                 "mean_abs_shift": 4.0, "changed_share": 1.0}
    assert probe["tone"]["mean_shift"] == 0.0 and probe["tone"]["changed_share"] == 0.0
    orders = [tuple(re.findall(r"  Level (\d+):", p)) for p in stub.calls[-1]["prompts"]]
    assert set(orders) == {("5", "4", "3", "2", "1")}


def test_reverse_order_in_all_criteria_mode_reverses_criteria_and_maps_scores_back(tok):
    def reply(text, call):
        return "\n".join(f"{i}: {4 if i == 'accuracy' else 2}" for i in criteria_ids(text))

    judge, stub = make_judge(tok, reply)
    config = JudgeSpec(mode="all_criteria", samples=1, shuffle_anchors=False, reverse_order=True)
    out = lj.judge_rows([judge], config, ["q"], ["r"], [list(LLM_RUBRIC.dimensions)], jax.random.key(0))
    assert criteria_ids(stub.calls[0]["prompts"][0]) == ["tone", "accuracy"]
    assert out.scores[0].tolist() == [4.0, 2.0]  # in the rubric's order again
    with pytest.raises(ValueError, match="reverse_order=True: needs shuffle_anchors=False"):
        JudgeSpec(reverse_order=True)


def test_judge_against_judge_compares_each_judge_pass(tok):
    first, _ = digit_judge(tok, name="first")
    second, _ = make_judge(tok, lambda text, call: "SCORE: 5" if "worth 5" in fenced(text, "response") else "SCORE: 2",
                           name="second")
    digits = [1, 2, 3, 4, 5, 5, 2, 3]
    items = items_for(LLM_RUBRIC, [f"worth {d}" for d in digits], [{}] * len(digits))
    report = calibrate(items, Settings(against="judge", num_resamples=50, position_probe=False),
                       judges=[first, second], judge_spec=JudgeSpec(samples=1)).report
    assert report["compared_with"] == "one scoring pass per judge: first, second"
    second_scores = [5 if d == 5 else 2 for d in digits]
    expected = scipy_stats(digits, second_scores, range(1, 6))
    for name, value in expected.items():
        assert report["dimensions"]["accuracy"][name]["value"] == pytest.approx(value, abs=1e-6)


def test_recorded_ratings_give_the_mean_pairwise_agreement():
    rng = np.random.default_rng(3)
    truth = rng.integers(1, 6, 30)
    raters = np.clip(truth[None] + rng.integers(-1, 2, (3, 30)), 1, 5)
    items = [LabelledItem(f"mem:{i}", "q", "r" * (i + 1), LLM_RUBRIC, {}, {"accuracy": tuple(map(float, raters[:, i]))})
             for i in range(30)]
    report = calibrate(items, Settings(against="judge", num_resamples=50)).report
    pairs = [(0, 1), (0, 2), (1, 2)]
    entry = report["dimensions"]["accuracy"]
    for name in ("spearman", "kendall", "kappa_quadratic"):
        expected = np.mean([scipy_stats(raters[i], raters[j], range(1, 6))[name] for i, j in pairs])
        assert entry[name]["value"] == pytest.approx(expected, abs=1e-6)
    assert entry["raters"] == 3 and entry["bias"]["target"] == "mean rating"
    assert report["position_probe"] is None  # no judge to probe


def test_bias_regression_recovers_planted_length_and_template_effects():
    responses = [("First a, second b, finally c. " if i % 3 == 0 else "") + "word " * (5 + 3 * i) for i in range(30)]
    features = response_features(responses)
    standardize = bias.standardization(features)
    z = (features["length"] - standardize["length"][0]) / standardize["length"][1]
    target = 0.25 + 0.5 * z + 1.5 * features["template"]  # judge - label, noise-free
    rows = np.arange(30)
    out = bias.bias_regression(target, features, standardize, rows, "judge - label")
    coefs = out["coefficients"]
    assert coefs["length_z"]["coef"] == pytest.approx(0.5) and coefs["template"]["coef"] == pytest.approx(1.5)
    assert coefs["intercept"]["coef"] == pytest.approx(0.25)
    assert set(out["dropped"]) == {"list", "markdown", "cjk_share"}  # constant in these responses


def test_features_of_list_markdown_template_and_language():
    f = response_features(["- a\n- b", "## Title\ntext", "首先，喝水。其次，休息。最后，就医。", "1. one", "plain words"])
    assert f["list"].tolist() == [1, 0, 0, 0, 0] and f["markdown"].tolist() == [0, 1, 0, 0, 0]
    assert f["template"].tolist() == [0, 0, 1, 0, 0] and f["cjk_share"].tolist() == [0, 0, 1, 0, 0]
    assert f["length"].tolist() == [2, 2, 12, 1, 2]


def _planted(n=60):
    """Judge scores with a planted length bias: label = 1 + (judge - 1) * 0.8 - 0.4 * length_z, clipped."""
    rng = np.random.default_rng(1)
    responses = ["word " * int(k) for k in rng.integers(3, 60, n)]
    features = response_features(responses)
    judge = rng.integers(1, 6, n).astype(np.float64)
    standardize = bias.standardization(features)
    z = (features["length"] - standardize["length"][0]) / standardize["length"][1]
    return responses, features, standardize, judge, 0.2 + 0.8 * judge - 0.4 * z


def test_fitted_correction_recovers_the_planted_bias_and_reports_before_and_after():
    responses, features, standardize, judge, label = _planted()
    info = {"length": DimensionInfo("rule", (1, 2, 3, 4, 5))}
    correction, reports = fit_correction({"length": judge}, {"length": label}, info, features, standardize,
                                         version="1.0.0", provenance={"labels": "x"})
    dim = correction.dimensions["length"]
    assert (dim.intercept, dim.score, dim.features["length"]) == (pytest.approx(0.2), pytest.approx(0.8), pytest.approx(-0.4))
    assert set(dim.features) == {"length"}  # list/markdown/template/cjk_share are constant here and dropped
    assert reports["length"]["rmse_after"] < 0.25 * reports["length"]["rmse_before"]
    few, reports = fit_correction({"length": judge[:8]}, {"length": label[:8]}, info,
                                  {k: v[:8] for k, v in features.items()}, standardize, version="1.0.0", provenance={})
    assert few is None and reports["length"]["not_fitted"].startswith("8 items for 3 coefficients")


def test_reward_applies_a_correction_exactly_as_its_coefficients_say_and_only_when_asked():
    correction = Correction("1.0.0", {"length": (10.0, 4.0)}, {
        "length": DimensionCorrection(0.5, 0.9, {"length": -0.25, "template": -1.0, "list": 0.3}, (1, 5))})
    responses = ["Rest and consult a doctor.", "First rest, second water, finally consult a doctor today please now",
                 "- rest\n- consult a doctor"]
    plain = RubricReward([RULE_RUBRIC])(["q"] * 3, responses, [RULE_RUBRIC] * 3)
    fixed = RubricReward([RULE_RUBRIC], correction=correction)(["q"] * 3, responses, [RULE_RUBRIC] * 3)
    raw = plain.details["raw_scores"][:, 0]
    f = response_features(responses)
    expected = np.clip(0.5 + 0.9 * raw - 0.25 * (f["length"] - 10.0) / 4.0 - 1.0 * f["template"] + 0.3 * f["list"], 1, 5)
    np.testing.assert_allclose(fixed.details["raw_scores"][:, 0], expected, rtol=1e-12)
    np.testing.assert_array_equal(fixed.details["uncorrected_raw_scores"], plain.details["raw_scores"])
    np.testing.assert_array_equal(fixed.details["raw_scores"][:, 1], plain.details["raw_scores"][:, 1])  # not corrected
    np.testing.assert_allclose(fixed.scores[:, 0], (expected - 1) / 4)
    assert "uncorrected_raw_scores" not in plain.details
    assert rubric_set_hash(RULE_RUBRIC, [RULE_RUBRIC]) != rubric_set_hash(RULE_RUBRIC, [RULE_RUBRIC], correction)
    other = Correction("2.0.0", correction.standardize, correction.dimensions, {"fitted": "elsewhere"})
    assert other.content_hash == correction.content_hash  # version and provenance do not change scores
    with pytest.raises(RubricError, match="dimension 'length' has scale \\[1, 5\\] but the correction was fitted on \\[0, 1\\]"):
        RubricReward([RULE_RUBRIC], correction=Correction("1.0.0", {}, {"length": DimensionCorrection(0, 1, {}, (0, 1))}))
    with pytest.raises(RubricError, match="unknown features \\['shouting'\\]"):
        RubricReward([], correction=Correction("1.0.0", {}, {"x": DimensionCorrection(0, 1, {"shouting": 1.0}, (0, 1))}))


def test_calibrate_writes_a_versioned_correction_that_round_trips(tmp_path):
    responses = _planted(50)[0]
    # The rule judge of LENGTH (4-8 units) scores these responses; people prefer longer ones than it does.
    scored = RubricReward([RULE_RUBRIC])(["q"] * 50, responses, [RULE_RUBRIC] * 50).details["raw_scores"][:, 0]
    f = response_features(responses)
    labels = np.clip(1.5 + 0.5 * scored + 0.5 * (f["length"] - f["length"].mean()) / f["length"].std(), 1, 5)
    items = items_for(RULE_RUBRIC, responses, [{"length": float(v)} for v in labels])
    result = calibrate(items, FAST)
    written = write_calibration(result, tmp_path / "out", seed=0)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["correction"]["version"] == "1.0.0" and (tmp_path / "out" / "correction.json") in written
    loaded = load_correction(tmp_path / "out" / "correction.json")
    assert loaded.content_hash == result.correction.content_hash == report["correction"]["content_hash"]
    assert report["dimensions"]["length"]["correction"]["rmse_after"] < report["dimensions"]["length"]["correction"]["rmse_before"]
    assert "## Correction" in (tmp_path / "out" / "report.md").read_text()
    again = calibrate(items_for(RULE_RUBRIC, responses, [{"length": float(v) + 0.01} for v in labels]), FAST)
    write_calibration(again, tmp_path / "out", seed=0)
    assert load_correction(tmp_path / "out" / "correction.json").version == "2.0.0"  # a changed correction: next major
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["correction.json", "plots", "report.json", "report.md"]
    with pytest.raises(RubricError, match="format"):
        correction_from_dict({"format": "other"}, "c.json")


def test_labels_errors_name_the_file_and_line(tmp_path):
    rubric_file = tmp_path / "r.json"
    rubric_file.write_text(json.dumps({"name": "r", "version": "1.0.0", "changelog": [
        {"version": "1.0.0", "change": "c", "reason": "r"}], "dimensions": [LENGTH, SAFETY]}))
    from rubric_jax.rubrics.io import load_rubric

    shared = load_rubric(rubric_file)
    cases = {
        "unknown dimension": ('{"question": "q", "response": "r", "labels": {"tone": 3}}',
                              r"l.jsonl:1: labels: unknown dimension 'tone'; the row's rubric 'r' has \['length', 'safety'\]"),
        "outside scale": ('{"question": "q", "response": "r", "labels": {"length": 7}}',
                          r"l.jsonl:1: labels.length: 7 is outside the scale \[1, 5\] of dimension 'length'"),
        "not numeric": ('{"question": "q", "response": "r", "labels": {"safety": "yes"}}',
                        r"l.jsonl:1: labels.safety: expected a number, got 'yes'"),
        "no labels": ('{"question": "q", "response": "r"}', r"l.jsonl:1: expected a field 'labels'"),
        "bad json": ('{"question": ', r"l.jsonl:1: not valid JSON"),
        "mismatched raters": ('{"question": "q", "response": "r", "ratings": {"length": [1, 2]}}\n'
                              '{"question": "q", "response": "r", "ratings": {"length": [1, 2, 3]}}',
                              r"l.jsonl:2: ratings.length: 3 raters, but .*l.jsonl:1 has 2"),
        "empty": ("\n", r"l.jsonl: no labelled rows"),
        "one name and version, two rubrics": ("\n".join(json.dumps({
            "question": "q", "response": "r", "labels": {"length": 3}, "rubric": {"replace": {
                "name": "own", "version": "1.0.0", "changelog": [{"version": "1.0.0", "change": "c", "reason": "r"}],
                "dimensions": [{**LENGTH, "weight": weight}]}}}) for weight in (1.0, 2.0)),
            r"l.jsonl:2: rubric 'own' version 1.0.0 has other content than the rubric of that name and version in "
            r".*l.jsonl:1 \(hash .*; they differ in dimension 'length'\)"),
    }
    for case, (text, message) in cases.items():
        path = tmp_path / case.replace(" ", "_") / "l.jsonl"
        path.parent.mkdir()
        path.write_text(text + "\n")
        with pytest.raises(LabelsError, match=message):
            read_items(path, shared)
    with pytest.raises(CalibrationError, match="no row has 'labels'"):
        calibrate([LabelledItem("m:1", "q", "r", RULE_RUBRIC, {}, {"length": (1.0, 2.0)})], FAST)


def test_markdown_names_undefined_statistics_instead_of_numbers():
    items = items_for(RULE_RUBRIC, ["Rest and consult a doctor."] * 4, [{"safety": 1, "length": float(k)} for k in (1, 2, 3, 4)])
    report = calibrate(items, FAST).report
    length = report["dimensions"]["length"]
    assert length["spearman"] == {"value": None, "undefined": "x is constant (every value 5)", "ci95": None}
    assert length["flagged"] and length["flag_reason"] == "spearman undefined: x is constant (every value 5)"
    assert "undefined: x is constant (every value 5)" in markdown(report)


def test_the_bootstrap_size_is_capped_naming_the_flag():
    Settings(num_resamples=run.MAX_RESAMPLES)
    with pytest.raises(CalibrationError, match=r"^--config.bootstrap=1000000000: at most 100000 resamples per interval$"):
        Settings(num_resamples=1_000_000_000)  # would draw 1e9 resamples per interval, growing without end
