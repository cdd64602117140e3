"""Judge-output parser: exact format accepted, everything else invalid with a reason (never a default score)."""

import numpy as np
import pytest

from rubric_jax.judges.parser import parse_single, parse_verdict


@pytest.mark.parametrize(
    "text, expected",
    [
        ("SCORE: 4", 4.0),
        ("The answer is accurate but terse.\nSCORE: 3", 3.0),
        ("分析：回答准确。\n\nSCORE: 5\n\n", 5.0),
        ("reasoning\r\nSCORE:1\r\n", 1.0),
        ("  SCORE :  2  ", 2.0),
        ("It mentions 'Score: 5' in passing.\nSCORE: 2", 2.0),
    ],
)
def test_single_accepts_final_score_line(text, expected):
    verdict = parse_single(text, 1, 5)
    assert verdict.valid and verdict.reason == ""
    np.testing.assert_array_equal(verdict.scores, [expected])


@pytest.mark.parametrize(
    "text, reason_fragment",
    [
        ("", "expected 1 verdict line"),
        ("The response is good.", "should be 'SCORE: <int>'"),
        ("SCORE: 4\nThanks!", "also appears before the final block"),
        ("SCORE: 3.5", "expected an integer"),
        ("SCORE: 4/5", "expected an integer"),
        ("SCORE: -1", "expected an integer"),
        ("SCORE: four", "expected an integer"),
        ("SCORE: 6", "outside [1, 5]"),
        ("SCORE: 0", "outside [1, 5]"),
        ("score: 4", "should be 'SCORE: <int>'"),
        ("[RESULT] 5", "should be 'SCORE: <int>'"),
        ("Score: 5", "should be 'SCORE: <int>'"),
        ("**SCORE**: 5", "should be 'SCORE: <int>'"),
        ("SCORE: 5\nSCORE: 4", "also appears before the final block"),
        ("SCORE: 99999999999", "expected an integer"),
    ],
)
def test_single_rejects_everything_else(text, reason_fragment):
    verdict = parse_single(text, 1, 5)
    assert not verdict.valid
    assert reason_fragment in verdict.reason
    assert np.isnan(verdict.scores).all() and verdict.scores.shape == (1,)


def test_binary_scale_range():
    assert parse_single("SCORE: 0", 0, 1).scores[0] == 0.0
    assert parse_single("SCORE: 1", 0, 1).scores[0] == 1.0
    assert not parse_single("SCORE: 2", 0, 1).valid


def test_multi_criterion_block_in_order():
    keys, ranges = ("accuracy", "clarity", "safety"), ((1, 5), (1, 5), (0, 1))
    text = "accuracy is fine; clarity: decent.\naccuracy: 4\nclarity: 3\nsafety: 1\n"
    verdict = parse_verdict(text, keys, ranges)
    assert verdict.valid
    np.testing.assert_array_equal(verdict.scores, [4, 3, 1])


@pytest.mark.parametrize(
    "text, reason_fragment",
    [
        ("accuracy: 4\nclarity: 3", "expected 3 verdict line"),
        ("accuracy: 4\nsafety: 1\nclarity: 3", "line 2 of the verdict block should be 'clarity: <int>'"),
        ("intro\naccuracy: 4\nclarity: 3\nsafety: 2", "safety: 2 outside [0, 1]"),
        ("accuracy: 4\naccuracy: 4\nclarity: 3\nsafety: 1", "'accuracy' also appears before"),
        ("accuracy: 4\nclarity: 3\nsafety: 1\nextra: 2", "also appears before the final block"),
    ],
)
def test_multi_criterion_rejects_partial_or_disordered_blocks(text, reason_fragment):
    verdict = parse_verdict(text, ("accuracy", "clarity", "safety"), ((1, 5), (1, 5), (0, 1)))
    assert not verdict.valid and reason_fragment in verdict.reason
    assert np.isnan(verdict.scores).all() and verdict.scores.shape == (3,)


def test_parser_is_deterministic_and_mismatched_ranges_are_a_caller_error():
    text = "ok\nSCORE: 3"
    first = parse_single(text, 1, 5)
    for _ in range(3):
        again = parse_single(text, 1, 5)
        assert again.valid == first.valid and (again.scores == first.scores).all()
    with pytest.raises(ValueError, match="one \\(low, high\\) range per key"):
        parse_verdict(text, ("a", "b"), ((1, 5),))
