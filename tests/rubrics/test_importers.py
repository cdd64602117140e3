"""Importers: small fixtures in each public schema (unit) and the real files under ../shared/data (integration)."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.rubrics import RubricError, normalize_scores, rubric_from_dict, rubric_to_dict
from rubric_jax.rubrics.aggregation import aggregate_rubric
from rubric_jax.rubrics.importers import (
    HELLOBENCH_TASKS,
    hellobench_rubrics,
    import_biggen_bench,
    import_healthbench,
    import_hellobench,
    import_longbench_write,
    import_rar,
    import_vicuna_eval,
    parse_prometheus_rubric_text,
    rar_rubric,
)
from tests.shared_data import real as _real

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rubric_formats"


def _reward(rubric, raw):
    raw = np.asarray(raw, float)
    return aggregate_rubric(rubric, normalize_scores(rubric, raw), ~np.isnan(raw))


# ------------------------------------------------------------------------------------------ unit (fixtures)

def test_healthbench_fixture():
    cases = import_healthbench(FIXTURES / "healthbench_mini.jsonl")
    assert [c.case_id for c in cases] == ["hb-0001", "hb-0002"]
    r = cases[0].rubric
    assert r.aggregation.method == "healthbench_points" and r.aggregation.missing == "drop"
    assert [d.scale.points for d in r.dimensions] == [7, 5, 10, -6]
    assert [d.group for d in r.dimensions] == ["completeness", "accuracy", "completeness", "accuracy"]
    assert r.dimensions[3].weight == 6.0 and "undesirable" in r.dimensions[3].anchors[1].description
    assert cases[0].meta["criterion_tags"]["c02"][1] == "cluster:emergency_referrals"
    assert cases[0].prompt[0]["role"] == "user" and cases[1].reference.startswith("Keep the child")
    # The judge reports met / not met; HealthBench's own example gives 0.5.
    reward, ok = _reward(r, [[1, 0, 1, 1]])
    assert reward[0] == pytest.approx(0.5) and ok[0]
    reward, ok = _reward(r, [[1, np.nan, 1, 1]])  # drop: a missing verdict invalidates the sample
    assert not ok[0]
    assert r.name == "healthbench/hb-0001" and r.content_hash != cases[1].rubric.content_hash
    ruscarl = import_healthbench(FIXTURES / "healthbench_ruscarl_mini.jsonl")
    assert ruscarl[0].case_id == "0" and ruscarl[0].rubric.dimensions == cases[1].rubric.dimensions


def test_healthbench_bad_points_name_the_record(tmp_path):
    bad = tmp_path / "hb.jsonl"
    bad.write_text(json.dumps({"prompt": [], "rubrics": [{"criterion": "x", "points": 0, "tags": []}]}) + "\n")
    with pytest.raises(RubricError, match=r"record 0 \(prompt_id 0\): rubric item 0: field 'points': expected a non-zero integer"):
        import_healthbench(bad)


def test_biggen_and_vicuna_fixtures():
    (case,) = import_biggen_bench(FIXTURES / "biggen_mini.jsonl")
    (dim,) = case.rubric.dimensions
    assert dim.scale.levels == (1, 2, 3, 4, 5) and dim.kind == "llm"
    assert dim.anchors[3].description == "Includes both stops but the schedule is unrealistic."
    assert case.meta["capability"] == "planning" and case.reference.startswith("Morning")
    assert _reward(case.rubric, [[4]])[0][0] == pytest.approx(0.75)
    (v,) = import_vicuna_eval(FIXTURES / "vicuna_mini.json")
    assert v.prompt == "How do I keep basil alive indoors?" and v.case_id == "1/vicuna"
    assert v.rubric.dimensions[0].description == "Is the advice specific and actionable?"
    assert v.rubric.dimensions[0].anchors[5].description.startswith("Specific, complete tips")
    assert v.meta["gpt4_score"] == [2, 2, 3] and v.meta["response"] == "Water it."
    with pytest.raises(RubricError, match="no '###Score Rubrics:' block"):
        parse_prometheus_rubric_text("###Feedback:", "x")


def test_hellobench_fixture():
    rubrics = hellobench_rubrics(FIXTURES / "hellobench")
    assert set(rubrics) == {"Science", "news", "rewrite", "continuation", "story_writing"}
    sci = rubrics["Science"]
    assert [d.weight for d in sci.dimensions] == [50.0, 30.0, 20.0]
    assert sci.dimensions[0].scale.levels == (0, 1, 2, 3, 4)
    cases = import_hellobench(FIXTURES / "hellobench", "open_ended_qa")
    assert [c.case_id for c in cases] == ["open_ended_qa_000", "open_ended_qa_001"] and cases[0].rubric == sci
    # HelloBench per-question score = sum_i s_i w_i / 100 with s in {0, .25, .5, .75, 1} = raw / 4.
    reward, _ = _reward(sci, [[4, 2, 1]])
    assert reward[0] == pytest.approx((1.0 * 50 + 0.5 * 30 + 0.25 * 20) / 100)
    with pytest.raises(RubricError, match="HelloBench task: expected one of"):
        import_hellobench(FIXTURES / "hellobench", "poetry")


def test_rar_fixture():
    cases = import_rar(FIXTURES / "rar_mini.jsonl")
    r = cases[0].rubric
    assert [d.group for d in r.dimensions] == ["essential", "important", "optional", "pitfall"]
    assert [d.scale.points for d in r.dimensions] == [5, 3, 1, -2]
    assert r.dimensions[0].description == "Identifies diagnosis: Identifies pulmonary embolism as the most likely diagnosis."
    assert cases[0].reference == "Pulmonary embolism."
    r2 = cases[1].rubric
    assert r2.dimensions[0].description == "Names the mitochondrion"
    assert r2.dimensions[1].description == "Names the nucleus: A common confusion."
    # Essential + important met, optional not, pitfall present: (5 + 3 - 2) / (5 + 3 + 1).
    assert _reward(r, [[1, 1, 0, 1]])[0][0] == pytest.approx(6 / 9)
    assert rubric_from_dict(rubric_to_dict(r)) == r


@pytest.mark.parametrize("item, message", [
    ({"title": "Pitfall Criteria: says X", "weight": 2}, "field 'weight': expected a negative weight for a pitfall criterion"),
    ({"title": "Essential Criteria: says X", "weight": -5}, "expected a positive weight for an essential criterion"),
    ({"title": "Says X", "weight": 5}, "no 'Essential|Important|Optional|Pitfall Criteria:' prefix"),
    ({"title": "Essential Criteria: X", "weight": 2.5}, "field 'points': expected a non-zero integer"),
    ({"title": "Essential Criteria: X", "weight": 5, "score": 1}, "unknown field(s) ['score']"),
])
def test_rar_errors(item, message):
    with pytest.raises(RubricError) as e:
        rar_rubric([item], "r", "rar.jsonl")
    assert str(e.value).startswith("rar.jsonl: item 0: ") and message in str(e.value)


# ------------------------------------------------------------------------------------------ integration (real files)

def test_longbench_write_rows(tmp_path):
    path = tmp_path / "lbw.jsonl"
    path.write_text(json.dumps({"prompt": "Write 100 words about tea.", "type": "Popular Science", "length": 100}) +
                    "\n" + json.dumps({"prompt": "写三百字", "type": "社区论坛", "length": 300}) + "\n", encoding="utf-8")
    first, second = import_longbench_write(path)
    assert (first.case_id, first.meta, second.case_id) == ("lbw/000", {"type": "Popular Science", "length": 100},
                                                           "lbw/001")
    assert first.rubric.dimension_ids == ["relevance", "accuracy", "coherence", "clarity", "breadth_and_depth",
                                          "reading_experience"]
    # S_q = mean over the six dimensions of (score - 1) * 25, here on [0, 1].
    assert _reward(first.rubric, [[1, 2, 3, 4, 5, 5]])[0] == pytest.approx((0 + 1 + 2 + 3 + 4 + 4) / 24)
    path.write_text(json.dumps({"prompt": "x", "type": "t", "length": 0}) + "\n", encoding="utf-8")
    with pytest.raises(RubricError, match="record 0: field 'length': expected a positive integer"):
        import_longbench_write(path)


def test_real_healthbench_files_import():
    for name, count in (("healthbench_oss_eval_first30.jsonl", 30), ("healthbench_val500_from_ruscarl.jsonl", 500)):
        cases = import_healthbench(_real("healthbench", name))
        assert len(cases) == count
        assert all(c.rubric.aggregation.method == "healthbench_points" for c in cases)
    items = sum(len(c.rubric.dimensions) for c in cases)
    negative = sum(d.scale.points < 0 for c in cases for d in c.rubric.dimensions)
    assert (items, negative) == (5965, 1859)  # SOURCE.txt statistics of the RuscaRL copy
    # All criteria met except the negative ones -> 1; nothing met -> 0 (clipped).
    r = cases[0].rubric
    good = np.where(r.points > 0, 1.0, 0.0)[None]
    assert _reward(r, good)[0][0] == pytest.approx(1.0) and _reward(r, 1 - good)[0][0] == 0.0


def test_real_prometheus_files_import():
    cases = import_biggen_bench(_real("prometheus", "biggen_bench_765.jsonl"))
    assert len(cases) == 765 and len({c.rubric.content_hash for c in cases}) > 700
    vicuna = import_vicuna_eval(_real("prometheus", "vicuna_eval.json"))
    assert len(vicuna) == 320 and all(len(v.meta["gpt4_score"]) == 3 for v in vicuna)
    assert all(v.prompt and "###" not in v.prompt for v in vicuna)
    assert all(v.meta["response"] and "###" not in v.meta["response"] for v in vicuna)


def test_real_hellobench_golden_scores():
    data = _real("hellobench")
    rubrics = hellobench_rubrics(data)
    assert len(rubrics) == 38
    for task in HELLOBENCH_TASKS:
        file_name = "summarization_reconstructed.jsonl" if task == "summarization" else None
        cases = import_hellobench(data, task, file_name)
        assert len(cases) == {"open_ended_qa": 200, "summarization": 100, "chat": 147, "text_completion": 77,
                              "heuristic_text_generation": 123}[task]
    # FORMULA.md golden values for gpt4o_0806, recomputed through our importer + aggregation.
    per_task: dict[str, list[float]] = {t: [] for t in HELLOBENCH_TASKS}
    with (data / "judgements_main_exp_scores.csv").open() as f:
        for row in csv.DictReader(f):
            if row["model"] != "gpt4o_0806":
                continue
            scores = json.loads(row["checklist_scores"])
            rubric = rubrics[row["category"]]
            reward, ok = _reward(rubric, [[4 * s for s in scores]])
            assert ok[0]
            per_task[row["task"]].append(float(reward[0]) * 100)
    golden = {"open_ended_qa": 54.82, "summarization": 29.71, "chat": 42.88, "text_completion": 67.49,
              "heuristic_text_generation": 47.87}
    for task, value in golden.items():
        assert (np.mean(per_task[task]) - 75) * 4 == pytest.approx(value, abs=0.01), task
