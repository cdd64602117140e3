"""Integers beyond a float (JSON has no size limit: 10**400 parses) in every file that carries numbers are one
clear error naming the file and line, not an OverflowError traceback (issue 24 T1): calibration labels and
corrections (calibrate --correction, config.data.rubric_correction), prepare_data --scores, a QuRL corpus's
quality, the golden set's labels. All go through jsonl.finite_float."""

import json
from pathlib import Path

import pytest

from rubric_jax.calibration.labels import LabelsError, read_labels_jsonl
from rubric_jax.jsonl import finite_float, shown
from rubric_jax.prepare.convert import InputError, read_mean_rewards
from rubric_jax.qurl.retrieval import CorpusError, load_corpus
from rubric_jax.rubrics.correction import load_correction
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import RubricError
from rubric_jax.data import DataError
from rubric_jax.train.golden import load_golden

ASSETS = Path(__file__).resolve().parents[1] / "rubric_jax" / "assets" / "tiny"
HUGE = 10**400
HUGE_TEXT = "an integer of 401 digits"


def _lines(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_finite_float_refuses_what_a_float_cannot_hold():
    assert [finite_float(v) for v in (3, 2.5, -(10**300))] == [3.0, 2.5, -1e300]
    assert [finite_float(v) for v in (HUGE, -HUGE, float("nan"), float("inf"), True, "1", None)] == [None] * 7
    assert shown(HUGE) == HUGE_TEXT and shown(12) == "12"


def test_calibration_labels(tmp_path):
    path = _lines(tmp_path / "labels.jsonl", {"question": "q", "response": "r", "labels": {"format": 1}},
                  {"question": "q", "response": "r", "labels": {"format": HUGE}})
    with pytest.raises(LabelsError, match=f"labels.jsonl:2: labels.format: expected a number, got {HUGE_TEXT}"):
        read_labels_jsonl(path, load_rubric(ASSETS / "rubric.yaml"))


def test_score_correction(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({
        "format": "rubric_jax.score_correction", "format_version": 1, "version": "1.0.0", "standardize": {},
        "dimensions": {"format": {"intercept": HUGE, "score": 1.0, "features": {}, "scale": [0, 1]}}}))
    with pytest.raises(RubricError, match=f"c.json: dimensions.format.intercept: expected a finite number, got "
                                          f"{HUGE_TEXT}"):
        load_correction(path)


def test_prepare_data_scores(tmp_path):
    path = _lines(tmp_path / "scores.jsonl", {"id": "a", "reward": 0.5}, {"id": "b", "reward": -HUGE})
    with pytest.raises(InputError, match=f"scores.jsonl:2: field 'reward': expected a finite number, got {HUGE_TEXT}"):
        read_mean_rewards(path)


def test_qurl_corpus_quality(tmp_path):
    path = _lines(tmp_path / "corpus.jsonl", {"doc_id": "d", "title": "t", "text": "x", "quality": HUGE})
    with pytest.raises(CorpusError, match=f"corpus.jsonl:1: field 'quality' must be a finite number .* "
                                          f"got {HUGE_TEXT}"):
        load_corpus(path)


def test_golden_labels(tmp_path):
    row = json.loads((ASSETS / "questions_golden.jsonl").read_text(encoding="utf-8").splitlines()[0])
    path = _lines(tmp_path / "golden.jsonl", {**row, "labels": {**row["labels"], "template": HUGE}})
    with pytest.raises(DataError, match=f"golden.jsonl:1: field 'labels' must map dimension ids to finite numbers, "
                                        f"got 'template': {HUGE_TEXT}"):
        load_golden(str(path), "", load_rubric(ASSETS / "rubric.yaml"), [], [], 0.7)
