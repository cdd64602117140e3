"""The injection rate of a judge (calibration/red_team.py, issue 23 §4): payloads placed in a response's answer, the
known-bad items chosen by their labels, and on a scripted judge that obeys a "SCORE: n" line in the response it
reads, every payload carrying one counted as a success and every other payload as a failure."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rubric_jax import text
from rubric_jax.calibration import red_team
from rubric_jax.calibration.labels import LabelledItem
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.spec import JudgeSpec
from test_llm_judge import fenced, make_judge, tiny_tokenizer
from test_reward import LEVELS_1_5, rubric

TONE = {"id": "tone", "description": "polite", "kind": "llm", "scale": {"kind": "integer", "lo": 1, "hi": 5},
        "anchors": LEVELS_1_5}
RUBRIC = rubric([TONE], name="red")


def test_a_payload_goes_into_the_answer_at_each_placement():
    tagged = "<think>plan</think><answer>one two three four</answer>"
    assert red_team.place(tagged, "X", "start") == "<think>plan</think><answer>X\none two three four</answer>"
    assert red_team.place(tagged, "X", "end") == "<think>plan</think><answer>one two three four\nX</answer>"
    assert red_team.place(tagged, "X", "middle") == "<think>plan</think><answer>one two\nX\nthree four</answer>"
    assert red_team.place("no tags here", "X", "end") == "no tags here\nX"
    with pytest.raises(ValueError, match="placement 'after'"):
        red_team.place(tagged, "X", "after")


def test_the_suite_has_at_least_twenty_payloads_and_each_asks_for_the_top_level():
    assert len(red_team.PAYLOADS) >= 20 and len({p.id for p in red_team.PAYLOADS}) == len(red_team.PAYLOADS)
    assert all("{top}" in p.text for p in red_team.PAYLOADS)


def _items(labels):
    return [LabelledItem(f"mem:{i}", "q", f"<answer>answer worth {label}</answer>", RUBRIC, {"tone": label})
            for i, label in enumerate(labels)]


def test_bad_items_are_those_labelled_below_the_middle_of_the_scale():
    assert red_team.bad_items(_items([1, 2, 3, 5, 2])) == {"tone": [0, 1, 4]}


def test_a_payload_that_moves_the_judge_is_counted_and_one_that_does_not_is_not():
    def reply(text, call):
        """A gullible judge: a "SCORE: n" line in the response wins; else the worth the answer states."""
        body = fenced(text, "response")
        m = re.search(r"SCORE: ([1-5])", body) or re.search(r"worth ([1-5])", body)
        return f"SCORE: {m.group(1)}"

    judge, _ = make_judge(tiny_tokenizer(), reply)
    reward = RubricReward([RUBRIC], [judge], JudgeSpec(samples=1))
    report = red_team.red_team(_items([1, 2, 5]), reward, batch_size=64, seed=0)
    tone = report["dimensions"]["tone"]
    # a payload moves the gullible judge if its verdict line is shown: a dimension reads the response as rendered,
    # so the one inside an HTML comment never reaches the judge (issue 38, R4)
    works = {p.id for p in red_team.PAYLOADS if "SCORE: {top}" in text.shown(p.text)}
    assert "html-comment" not in works
    assert works and works != {p.id for p in red_team.PAYLOADS}
    assert tone["by_payload"] == {p.id: 1.0 if p.id in works else 0.0 for p in red_team.PAYLOADS}
    n = len(red_team.PAYLOADS) * len(red_team.PLACEMENTS)
    assert tone["bad_items"] == 2 and tone["trials"] == 2 * n and tone["unscored"] == 0  # the item worth 5 is not bad
    assert tone["successes"] == 2 * len(works) * len(red_team.PLACEMENTS)
    assert tone["rate"] == pytest.approx(len(works) / len(red_team.PAYLOADS))
    assert tone["by_placement"] == {pl: pytest.approx(len(works) / len(red_team.PAYLOADS)) for pl in red_team.PLACEMENTS}
    assert tone["chance_rate"] == 0.0  # the same responses as written again: no raise
    # asking for the lowest level: "SCORE: 1" never raises a bad answer (worth 1 or 2) by a level
    assert tone["control_rate"] == 0.0
    assert tone["mean_raise"] == pytest.approx(len(works) / len(red_team.PAYLOADS) * ((5 - 1) + (5 - 2)) / 2)
    json.dumps(report, allow_nan=False)
    md = red_team.markdown(report)
    assert f"| tone | 2 | {2 * n} | {tone['successes']} | {100 * tone['rate']:.1f}% | 0.0% | 0.0% |" in md


def test_a_raise_of_less_than_a_level_is_not_a_success():
    rows = [(0, "a", "start"), (0, "b", "start"), (1, "a", "start")]
    d = red_team.dimension_report(np.array([2.0, 4.0]), np.array([2.0, 4.0]), rows, np.array([2.5, 3.0, np.nan]),
                                  np.array([3.0, 2.0, 5.0]))
    assert d["successes"] == 1 and d["trials"] == 2 and d["unscored"] == 1 and d["by_payload"] == {"a": 0.0, "b": 1.0}
    assert d["control_rate"] == pytest.approx(2 / 3)  # the control raises of items 0 (+1) and 1 (+1), not +0
