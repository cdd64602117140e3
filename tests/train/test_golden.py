"""The golden set: overlap with training (exact and near) is refused naming the pairs, ids and labels are
checked, and the eval keys (policy reward, reference reward, judge-vs-label agreement) are hand-computed."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from rubric_jax import data
from rubric_jax.assets import TINY_DIR
from rubric_jax.assets.build_tiny_assets import clarity_dimension
from rubric_jax.judges.reward import RewardOutput, RubricReward
from rubric_jax.prepare.dedup import char_ngrams, jaccard
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import Aggregation, Anchor, Rubric, Scale
from rubric_jax.train import golden

SHARED = load_rubric(TINY_DIR / "rubric.yaml")  # format (gate), redundancy, template: rule dimensions, binary
GOOD = "<think>A short plan.</think><answer>Open the orders page and press the button.</answer>"
TEMPLATED = "<think>Plan.</think><answer>Firstly, open it. Secondly, press it. Finally, wait a bit.</answer>"


def _q(qid: str, text: str, **extra) -> data.Question:
    return data.question_from_row({"id": qid, "question": text, "category": "c", "lang": "en", **extra}, qid)


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


TRAIN = [_q("t1", "How do I get a refund for my order?"), _q("t2", "Why is the sky blue during the day?")]


def test_overlap_names_exact_and_near_pairs():
    near = "How do I get a refund for my orders?"
    expected = jaccard(char_ngrams(near, 3), char_ngrams(TRAIN[0].question, 3))  # the set definition
    assert 0.7 <= expected < 1.0
    golden_qs = [_q("g1", "how do I get a REFUND for my order"), _q("g2", near), _q("g3", "Can cats eat cheese?")]
    assert golden.overlaps(golden_qs, TRAIN, 0.7) == [
        "golden 'g1' = train 't1' (exact)", f"golden 'g2' ~ train 't1' (Jaccard {expected:.2f})"]
    assert golden.overlaps(golden_qs, TRAIN, min(1.0, expected + 0.01)) == ["golden 'g1' = train 't1' (exact)"]


def _row(qid: str, text: str, **extra) -> dict:
    return {"id": qid, "question": text, "category": "c", "lang": "en", **extra}


def test_load_golden_refuses_overlap_clashing_ids_and_bad_labels(tmp_path):
    def load(rows, **kw):
        return golden.load_golden(_write(tmp_path / "golden.jsonl", rows), "", SHARED, TRAIN, kw.get("held_out", []),
                                  0.7)

    with pytest.raises(golden.GoldenError) as e:
        load([_row("g1", "How do I get a refund for my order"), _row("g2", "Can cats eat cheese?")])
    assert str(e.value) == (f"config.data.golden={tmp_path / 'golden.jsonl'}: 1 golden questions overlap the training "
                            "questions (exact, or character 3-gram Jaccard >= 0.7); a golden question must never be "
                            "trained on: golden 'g1' = train 't1' (exact)")
    with pytest.raises(golden.GoldenError, match=r"ids \['t2'\] are also training or eval question ids"):
        load([_row("t2", "Can cats eat cheese?")])
    with pytest.raises(golden.GoldenError, match=r"ids \['e1'\]"):
        load([_row("e1", "Can cats eat cheese?")], held_out=[_q("e1", "Something else entirely?")])
    with pytest.raises(golden.GoldenError, match=r"question 'g1': labels.format: 3.0 is outside the scale \[0, 1\]"):
        load([_row("g1", "Can cats eat cheese?", reference=GOOD, labels={"format": 3})])
    with pytest.raises(golden.GoldenError, match=r"question 'g1': labels: unknown dimension 'helpful'"):
        load([_row("g1", "Can cats eat cheese?", reference=GOOD, labels={"helpful": 1})])
    with pytest.raises(data.DataError, match="'labels' scores the reference answer; the row has no 'reference'"):
        load([_row("g1", "Can cats eat cheese?", labels={"format": 1})])
    with pytest.raises(golden.GoldenError, match=r"golden_max_jaccard=0"):
        golden.load_golden("unused.jsonl", "", SHARED, TRAIN, [], 0.0)


def _rubric_of(scales: dict[str, Scale]) -> Rubric:
    """A rubric of LLM dimensions with these ids and scales (the clarity dimension's text, an anchor per level)."""
    dims = tuple(dataclasses.replace(clarity_dimension(fixed=False), id=dim_id, scale=scale,
                                     anchors={k: Anchor(f"level {k}") for k in scale.levels})
                 for dim_id, scale in scales.items())
    return dataclasses.replace(SHARED, dimensions=dims, aggregation=Aggregation())


def test_label_agreement_by_hand():
    raw = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0], [4.0, 1.0], [9.0, 1.0]])
    valid = np.array([[True] * 2] * 4 + [[False, True]])  # row 4's "d" score is missing: left out
    scored = RewardOutput(raw, valid, np.zeros(5, np.float32), ["d", "e"], {"raw_scores": raw})
    labels = [{"d": 1, "e": 1}, {"d": 3, "e": 1}, {"d": 2, "e": 1}, {"d": 4}, {"d": 1}]
    out = golden.label_agreement(labels, scored, [_rubric_of({"d": Scale.integer(1, 9), "e": Scale.binary()})] * 5)
    assert out["golden/spearman/d"] == pytest.approx(0.8)  # ranks 1234 vs 1324: 1 - 6*2/(4*15)
    assert out["golden/kendall/d"] == pytest.approx(4 / 6)  # 5 concordant, 1 discordant pair of 6
    assert math.isnan(out["golden/spearman/e"]) and math.isnan(out["golden/kendall/e"])  # labels constant
    assert set(out) == {"golden/spearman/d", "golden/kendall/d", "golden/spearman/e", "golden/kendall/e"}


def test_label_agreement_ranks_each_scale_of_a_dimension_on_its_own():
    """Case-wise rubrics give "d" a 1-5 scale in rows 0-2, where the judge agrees with the labels, and a 0-2 scale in
    rows 3-5, where it reverses them: per scale, Spearman 1 and -1. Pooled raw scores (what the metric computed before)
    mix the two scales' numbers into one ranking, 0.47, which says neither."""
    raw = np.array([[1.0], [3.0], [5.0], [2.0], [1.0], [0.0]])
    scored = RewardOutput(raw, np.ones((6, 1), bool), np.zeros(6, np.float32), ["d"], {"raw_scores": raw})
    labels = [{"d": v} for v in (1, 3, 5, 0, 1, 2)]
    wide, narrow = _rubric_of({"d": Scale.integer(1, 5)}), _rubric_of({"d": Scale.integer(0, 2)})
    out = golden.label_agreement(labels, scored, [wide] * 3 + [narrow] * 3)
    assert out == pytest.approx({"golden/spearman/d@1-5": 1.0, "golden/kendall/d@1-5": 1.0,
                                 "golden/spearman/d@0-2": -1.0, "golden/kendall/d@0-2": -1.0})
    pooled = golden.label_agreement(labels, scored, [wide] * 6)  # one scale: one key, as before
    assert set(pooled) == {"golden/spearman/d", "golden/kendall/d"}
    assert pooled["golden/spearman/d"] == pytest.approx(8 / 17)  # scipy.stats.spearmanr: 0.4706


def test_golden_metrics_score_the_policy_and_the_references(tmp_path):
    rows = [_row("g1", "Can cats eat cheese?", reference=GOOD, labels={"format": 1, "template": 1}),
            _row("g2", "Do owls sleep at night?", reference=TEMPLATED, labels={"format": 1, "template": 0}),
            _row("g3", "Is tea older than coffee?", reference="no tags at all", labels={"format": 0, "template": 0}),
            _row("g4", "What colour are limes?")]
    golden_set = golden.load_golden(_write(tmp_path / "golden.jsonl", rows), "", SHARED, TRAIN, [], 0.7)
    reward = RubricReward(golden_set.rubrics)
    policy = reward([q.question for q in golden_set.questions], [GOOD, GOOD, "x", TEMPLATED], golden_set.rubrics)
    out = golden_set.metrics(policy, reward, key=None)
    assert out["golden/reward_mean"] == pytest.approx(float(policy.reward.mean()))
    assert out["golden/reward/format"] == 3 / 4 and out["golden/reward/template"] == 3 / 4
    # references: GOOD, TEMPLATED, untagged -> format 1, 1, 0 (a gate: the untagged one's reward is 0)
    assert out["golden/reference/reward/format"] == pytest.approx(2 / 3)
    assert out["golden/reference/reward/template"] == pytest.approx(2 / 3)  # the untagged one has no template
    assert out["golden/spearman/format"] == pytest.approx(1.0)  # the rule agrees with the format labels
    # template: judge 1 0 1 vs labels 1 0 0 -> ranks 2.5 1 2.5 vs 3 1.5 1.5: rho = 0.5
    assert out["golden/spearman/template"] == pytest.approx(0.5)
    assert "golden/spearman/redundancy" not in out  # no labels for it


def test_golden_reference_judge_failures_are_counted_and_alerted(tmp_path):
    """Issue 38 S7: a judge that fails on half the reference answers (no parseable verdict after its retries) no
    longer leaves a clean-looking mean alone: the failed scores, the missing share and an eval alert say so."""
    import jax

    from rubric_jax.judges.spec import JudgeSpec
    from rubric_jax.train import monitors
    from test_llm_judge import digit_reply, fenced, make_judge, tiny_tokenizer
    from test_reward import ACCURACY, FORMAT, rubric

    acc_rubric = rubric([FORMAT, ACCURACY])
    questions = [_q(f"g{i}", f"q{i}", reference=f"answer worth {i + 1}") for i in range(4)]
    golden_set = golden.GoldenSet(questions, [acc_rubric] * 4)
    judge, _ = make_judge(tiny_tokenizer(), lambda text, call: "no idea" if int(fenced(text, "response")[-1]) % 2
                          else digit_reply(text, call))
    reward = RubricReward([acc_rubric], [judge], JudgeSpec(samples=1))
    policy = reward(["q"] * 4, ["worth 2"] * 4, [acc_rubric] * 4, key=jax.random.key(0))
    out = golden_set.metrics(policy, reward, key=jax.random.key(1))
    assert out["golden/reference/reward/accuracy"] == pytest.approx((0.25 + 0.75) / 2)  # worth 2 and 4 scored
    assert out["golden/reference/missing/accuracy"] == 0.5 and out["golden/reference/reward_failed_scores"] == 2
    assert out["golden/reference/judge_failed_scores"] == 2
    limits = {check.field: 1.0 for check in monitors.CHECKS} | {"max_missing_share": 0.2, "min_golden_spearman": -1.0,
                                                                  "min_audit_agreement": -1.0}
    alerts = monitors.find_alerts(3, "eval", out, limits)
    assert [a.message for a in alerts] == [
        "alert step 3: missing scores of accuracy on the golden references 0.50 > 0.20"]


def test_the_trainer_refuses_an_overlapping_golden_set_before_sft(tmp_path, command_server):
    """The README's example: one line naming the pair, no traceback, no SFT step."""
    path = _write(tmp_path / "golden.jsonl", [_row("g1", "How do I get a refund for my order"),
                                               _row("g2", "Can cats eat cheese?")])
    proc = command_server("experiments.run").run(
        "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}", f"--config.data.golden={path}")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1:] == [  # (after any library warnings)
        f"experiments.run: error: config.data.golden={path}: 1 golden questions overlap the training questions "
        "(exact, or character 3-gram Jaccard >= 0.7); a golden question must never be trained on: "
        "golden 'g1' = train 'cs-en-00-0' (exact)"]
    assert not (tmp_path / "run" / "checkpoints").exists()
