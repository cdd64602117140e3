"""QuRL filter and merge: hand-computed discrimination, drop reasons, single-link groups, support, representatives."""

import numpy as np
import pytest

from rubric_jax.qurl import filtering as F
from rubric_jax.qurl.construction import Candidate
from rubric_jax.rubrics.schema import Anchor, ChangelogEntry, Dimension, Rubric, Scale

DESCRIPTIONS = {
    "coverage": "Covers warm-up, rest days and a gradual increase in weekly distance.",
    "coverage_plan": "Covers the warm-up, rest days and a gradual increase of the weekly distance.",
    "flow": "Reasons follow each other with clear transitions.",
    "tone": "Uses a friendly, encouraging tone.",
    "reading_mood": "说明家庭阅读氛围的作用，例如父母自己读书。",
    "family_mood": "说明家庭阅读氛围的作用，例如父母经常读书。",
}


def dim(dim_id, description=None, points=2):
    anchors = {level: Anchor(f"{dim_id} {level}") for level in range(points + 1)}
    return Dimension(dim_id, description or DESCRIPTIONS[dim_id], "llm", Scale.integer(0, points), anchors,
                     weight=points)


def candidate(*dims, cites=None):
    rubric = Rubric("qurl/q/candidate", "1.0.0", (ChangelogEntry("1.0.0", "c", "r"),), tuple(dims))
    return Candidate(rubric, {d.id: tuple((cites or {}).get(d.id, (1,))) for d in dims})


def test_discrimination_statistics_and_reasons():
    d = F.discrimination(np.asarray([0.2, np.nan, 0.6, 1.0]))
    assert d.valid == 3 and d.spread == pytest.approx(0.8)
    assert d.std == pytest.approx(np.sqrt(((0.2 - 0.6) ** 2 + 0 + 0.4 ** 2) / 3))  # population std
    assert F.filter_reason(d, min_valid_answers=3, min_std=0.05, min_spread=0.1) is None
    assert "only 3 answer(s)" in F.filter_reason(d, min_valid_answers=4, min_std=0.05, min_spread=0.1)
    flat = F.discrimination(np.asarray([0.5, 0.5, 0.5]))
    assert (flat.std, flat.spread) == (0.0, 0.0)
    assert F.filter_reason(flat, min_valid_answers=2, min_std=0.05, min_spread=0.1).startswith(
        "does not discriminate: std 0.0000 < min_std 0.05")
    narrow = F.discrimination(np.asarray([0.5, 0.58, 0.5, 0.58]))  # std 0.04, spread 0.08
    assert "spread 0.0800 < min_spread 0.1" in F.filter_reason(narrow, min_valid_answers=2, min_std=0.0, min_spread=0.1)
    assert F.discrimination(np.asarray([np.nan, np.nan])).valid == 0


def test_same_criterion_by_id_or_description_in_english_and_chinese():
    assert F.same_criterion(dim("coverage"), dim("coverage_plan"), 0.5)
    assert not F.same_criterion(dim("coverage"), dim("coverage_plan"), 0.95)
    assert F.same_criterion(dim("flow"), dim("FLOW", "Something else entirely."), 0.9)  # ids equal ignoring case
    assert not F.same_criterion(dim("flow"), dim("tone"), 0.5)
    assert F.same_criterion(dim("reading_mood"), dim("family_mood"), 0.5)


def test_a_recurring_criterion_is_kept_once_and_singletons_are_dropped():
    sets = [candidate(dim("coverage"), dim("flow"), cites={"coverage": (1,)}),
            candidate(dim("tone"), dim("coverage_plan"), cites={"coverage_plan": (2, 3)})]
    merged = F.merge_criteria(sets, [0.1, 0.3], threshold=0.5, min_support=2, max_criteria=7)
    assert [m.dimension.id for m in merged.criteria] == ["coverage_plan"]  # from the set with the larger std
    (only,) = merged.criteria
    assert only.members == ((0, "coverage"), (1, "coverage_plan")) and only.support == 2 and only.cites == (1, 2, 3)
    assert (merged.groups, merged.unsupported, merged.capped) == (3, 2, 0)
    merged = F.merge_criteria(sets, [0.3, 0.1], threshold=0.5, min_support=2, max_criteria=7)
    assert merged.criteria[0].dimension.id == "coverage"


def test_groups_are_connected_components_so_equal_ids_always_merge():
    # 'bridge' matches set 0's criterion by description and set 2's by id: one group of three.
    sets = [candidate(dim("coverage")), candidate(dim("bridge", DESCRIPTIONS["coverage_plan"])),
            candidate(dim("bridge", "Unrelated words here."))]
    assert F.group_criteria(sets, 0.5) == [[(0, 0), (1, 0), (2, 0)]]
    merged = F.merge_criteria(sets, [0.2, 0.2, 0.2], threshold=0.5, min_support=3, max_criteria=7)
    assert [m.support for m in merged.criteria] == [3] and merged.criteria[0].dimension.id == "coverage"


def test_support_is_counted_per_set_and_capped_by_the_kept_count_and_max_criteria():
    one = [candidate(dim("coverage"), dim("coverage_plan"), dim("flow"))]  # two similar criteria in ONE set
    merged = F.merge_criteria(one, [0.2], threshold=0.5, min_support=2, max_criteria=7)
    assert [(m.dimension.id, m.support) for m in merged.criteria] == [("coverage", 1), ("flow", 1)]
    three = [candidate(dim("coverage"), dim("flow"), dim("tone")), candidate(dim("flow"), dim("tone")),
             candidate(dim("tone"))]
    merged = F.merge_criteria(three, [0.2, 0.2, 0.2], threshold=0.5, min_support=1, max_criteria=2)
    assert [(m.dimension.id, m.support) for m in merged.criteria] == [("flow", 2), ("tone", 3)]  # first-seen order
    assert merged.capped == 1 and merged.unsupported == 0
    with pytest.raises(ValueError, match="1 candidates and 2 stds"):
        F.merge_criteria(one, [0.1, 0.2], threshold=0.5, min_support=1, max_criteria=2)
