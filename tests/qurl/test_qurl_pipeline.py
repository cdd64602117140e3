"""QuRL build end to end with a scripted generator and a scripted judge: filter, merge, retries, report, resume."""

import dataclasses
import json
import re

import pytest

from rubric_jax import schema
from rubric_jax.data import Question, load_questions
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.qurl import pipeline as P
from rubric_jax.qurl.config import BuildConfig, BuildError
from rubric_jax.qurl.retrieval import Document
from rubric_jax.rubrics.schema import rubric_to_dict
from qurl_scripted import Interrupted, ScriptedGenerator, fenced
from test_llm_judge import make_judge, tiny_tokenizer

QUESTIONS = [
    Question("run", "How should a beginner start running?", "health", "en", keywords=("running", "beginner")),
    Question("tree", "Are street trees worth it?", "society", "en", keywords=("trees",)),
    Question("volcano", "How do volcanoes form?", "science", "en", keywords=("volcano",)),
]
DOCUMENTS = [
    Document("run-a", "Running plan for a beginner", "Start slowly with run-walk intervals.", 0.8),
    Document("run-b", "Beginner running injuries", "Most running injuries come from doing too much.", 0.6),
    Document("tree-a", "Street trees cool cities", "Trees shade streets and lower cooling costs.", 0.9),
    Document("bread", "Bread", "Flour, water and salt.", 0.95),
]
CONFIG = BuildConfig(top_k=2, retrieval_pool=4, min_relevance=0.0, num_candidates=3, num_answers=4, max_retries=1,
                     min_criteria=1, max_criteria=3, max_points=4, min_valid_answers=3, questions_per_batch=2, seed=3)


def criterion(cid, description, points, cites):
    return {"id": cid, "description": description, "points": points,
            "levels": {str(level): f"{cid} level {level}" for level in range(points + 1)},
            "good_example": "good", "bad_example": "bad", "cites": cites}


def script():
    """The LLM: meta-descriptions (one empty at first), candidate sets per question, answers of varied quality."""
    rubric_replies: dict[str, int] = {}

    def reply(text, sample, call, key):
        if "Write a meta-description" in text:
            (document,) = fenced(text, "document")
            title = document.splitlines()[0].removeprefix("Title: ")
            return "" if title == "Beginner running injuries" and call == 0 else f"Meta of {title}."
        if "Write a rubric" in text:
            question = re.search(r"Question: (.*)", text).group(1)
            ordinal = rubric_replies[question] = rubric_replies.get(question, -1) + 1
            cites = [] if "References: none" in text else [1]
            coverage = "Covers warm-up, rest days and a gradual increase in weekly distance."
            flat = [[criterion("tone", "Friendly tone.", 2, cites)]] * 4
            sets = {  # running: 0 discriminates, 1 does not, 2 is malformed, 3 is its retry (coverage recurs)
                "How should a beginner start running?": [
                    [criterion("coverage", coverage, 4, cites), criterion("flow", "Clear transitions.", 2, cites)],
                    [criterion("tone", "Friendly tone.", 2, cites)],
                    "Here is a rubric: {oops",
                    [criterion("coverage_plan", "Covers the warm-up, rest days and a gradual increase of the weekly "
                                                "distance.", 4, cites),
                     criterion("examples", "Gives concrete examples.", 3, cites)]],
                }.get(question, flat)
            chosen = sets[ordinal]
            return chosen if isinstance(chosen, str) else json.dumps({"criteria": chosen})
        return f"An answer of quality {(sample + key) % 5} (draw {key})."

    return reply


def judge_reply(text, call):
    """Content criteria score the answer's quality digit (capped at the criterion's points); tone is constant."""
    digit = int(re.search(r"\d", fenced(text, "response")[0]).group(0))
    criteria = re.findall(r"Criterion `([^`]+)` \(integer score from 0 to (\d+)\)", text)
    return "Reasons.\n" + "\n".join(f"{c}: {1 if c == 'tone' else min(digit, int(hi))}" for c, hi in criteria)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def build(tmp_path, tok, generator=None, config=CONFIG, settings=None):
    judge, stub = make_judge(tok, judge_reply)
    reward = RubricReward(judges=[judge], judge_spec=JudgeSpec(mode="all_criteria", samples=1, max_retries=0))
    generator = generator or ScriptedGenerator(script())
    templates = P.load_templates()
    result = P.build_rubrics(QUESTIONS, DOCUMENTS, config, templates, generator, reward, tmp_path / "work",
                             P.build_settings(config, templates, **(settings or {"model": "scripted"})),
                             log=lambda line: None)
    P.write_outputs(tmp_path, result)
    return result, generator, stub


def test_filter_drops_a_flat_set_merge_keeps_a_recurring_criterion_once(tmp_path, tok):
    result, generator, stub = build(tmp_path, tok)
    run, tree, volcano = result.report["questions"]
    assert [c["status"] for c in run["candidates"]] == ["kept", "dropped", "kept"]
    assert run["candidates"][1]["reason"] == "does not discriminate: std 0.0000 < min_std 0.05"
    assert run["candidates"][1]["rewards"] == [0.5] * 4  # tone 1 of 2 for every answer
    (merged,) = run["criteria"]
    assert merged["support"] == 2 and merged["cites"] == ["run-a"]
    assert merged["members"] == ["candidate 0: coverage", "candidate 2: coverage_plan"]
    assert run["merge"] == {"groups": 3, "unsupported": 2, "capped": 0}
    assert tree["status"] == "dropped" and tree["reason"].startswith("filter: none of the 3 candidate rubric sets")
    assert volcano["reason"] == "retrieval: no document is relevant to the question's query"

    rows = load_questions(tmp_path / "questions.jsonl")  # the existing row format
    assert [q.id for q in rows] == ["run"] and rows[0].keywords == ("running", "beginner")
    rubric = rows[0].replace_rubric
    assert rubric.name == "qurl/run" and rubric.dimension_ids == [merged["id"]] and rubric.dimensions[0].kind == "llm"
    assert rubric.content_hash == run["rubric_hash"]
    (entry,) = rubric.changelog
    assert "meta_description@1.0.0, rubric_generation@1.0.0, answer@1.0.0" in entry.reason
    assert "['run-a', 'run-b']" in entry.change and "2 of 3 candidate sets kept" in entry.change
    assert json.loads((tmp_path / "report.json").read_text()) == result.report


def test_malformed_generations_are_retried_in_batched_rounds_and_counted(tmp_path, tok):
    result, generator, stub = build(tmp_path, tok)
    # batch 1 (run, tree): meta round 0 + 1 retry, generation round 0 + 1 retry, answers; batch 2 has no document.
    assert [(len(c["prompts"]), c["n"]) for c in generator.calls] == [(3, 1), (1, 1), (2, 3), (1, 1), (2, 4)]
    assert len(stub.calls) == 1 and stub.calls[0]["batch"] == 4 * (3 + 3)  # every (candidate, answer) at once
    summary = result.report["summary"]
    assert summary["meta_description"] | {"invalid_examples": None} == {
        "requests": 3, "generate_calls": 2, "attempts": 4, "invalid": 1, "retried": 1, "failed": 0,
        "prompt_too_long": 0, "invalid_examples": None}
    assert summary["meta_description"]["invalid_examples"] == ["empty meta-description"]
    generation = summary["rubric_generation"]
    assert (generation["requests"], generation["invalid"], generation["retried"], generation["failed"]) == (6, 1, 1, 0)
    assert generation["invalid_examples"][0].startswith("not one JSON object")
    run = result.report["questions"][0]
    assert run["candidates"][2]["attempts"] == 2 and len(run["candidates"][2]["invalid_reasons"]) == 1
    assert run["documents"][1]["meta_description"] == "ok" and summary["answers"]["sampled"] == 8
    assert summary["filter"] == {"scored": 6, "kept": 2, "dropped": 4}
    assert summary["dropped_at"] == {"filter": 1, "retrieval": 1} and summary["kept"] == 1
    assert summary["judge"]["judge_generate_calls"] == 1 and summary["judge"]["reward_rows"] == 24


def test_a_generation_that_stays_invalid_is_a_counted_failure(tmp_path, tok):
    def never_valid(text, sample, call, key):
        return "no JSON, ever" if "Write a rubric" in text else script()(text, sample, call, key)

    result, generator, _ = build(tmp_path, tok, ScriptedGenerator(never_valid))
    generation = result.report["summary"]["rubric_generation"]
    assert (generation["requests"], generation["attempts"], generation["failed"]) == (6, 12, 6)
    assert result.report["summary"]["dropped_at"] == {"rubric_generation": 2, "retrieval": 1}
    assert result.report["questions"][0]["reason"] == "rubric_generation: no valid candidate in 3 sample(s)"
    assert (tmp_path / "questions.jsonl").read_text() == ""


@pytest.mark.parametrize("interrupt_at", [1, 3, 4])
def test_an_interrupted_build_resumes_with_identical_output(tmp_path, tok, interrupt_at):
    build(tmp_path / "whole", tok)
    with pytest.raises(Interrupted):
        build(tmp_path / "cut", tok, ScriptedGenerator(script(), interrupt_at=interrupt_at))
    assert not (tmp_path / "cut" / "report.json").exists()
    _, resumed, _ = build(tmp_path / "cut", tok)
    steps_done_before = {1: 0, 3: 1, 4: 2}[interrupt_at]  # meta (calls 0-1), generation (2-3), answers (4)
    assert len(resumed.calls) == 5 - [0, 2, 4][steps_done_before]
    for name in ("questions.jsonl", "report.json"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


def test_different_keys_change_the_output(tmp_path, tok):
    """The resume test above would pass vacuously if outputs ignored the keys; they do not."""
    build(tmp_path / "a", tok)
    build(tmp_path / "b", tok, config=dataclasses.replace(CONFIG, seed=4))
    answers = [json.loads((tmp_path / d / "work" / "batch_00000.json").read_text())["questions"][0]["answers"]
               for d in ("a", "b")]
    assert answers[0] != answers[1]


def test_a_resume_with_other_settings_is_refused(tmp_path, tok):
    build(tmp_path, tok)
    with pytest.raises(BuildError, match=r"other settings \(changed: build.min_std\)"):
        build(tmp_path, tok, config=dataclasses.replace(CONFIG, min_std=0.2))
    with pytest.raises(BuildError, match=r"\(changed: model\)"):
        build(tmp_path, tok, settings={"model": "another"})


def test_without_reference_documents_the_rubric_comes_from_the_question_alone(tmp_path, tok):
    result, generator, _ = build(tmp_path, tok, config=dataclasses.replace(CONFIG, top_k=0, retrieval_pool=0))
    assert not any("Write a meta-description" in p for c in generator.calls for p in c["prompts"])
    run = result.report["questions"][0]
    assert run["status"] == "kept" and run["documents"] == [] and run["criteria"][0]["cites"] == []
    assert result.report["questions"][2]["reason"].startswith("filter:")  # volcano needs no document now


@pytest.mark.parametrize("field, value, message", [
    ("top_k", -1, "qurl.top_k=-1: expected an integer >= 0"),
    ("num_answers", 1, "qurl.num_answers=1: expected an integer >= 2"),
    ("min_std", float("nan"), "qurl.min_std=nan: expected a number in [0, 0.5]"),
    ("max_criteria", 9, "qurl.max_criteria=9: expected from min_criteria=3 to 7"),
    ("min_valid_answers", 5, "qurl.min_valid_answers=5: expected at most num_answers=4"),
    ("retrieval_pool", 2, "qurl.retrieval_pool=2: expected at least top_k=5"),
    ("sampler", "nucleus(2)", "qurl.sampler='nucleus(2)'"),
])
def test_bad_settings_are_one_line_errors(field, value, message):
    with pytest.raises(schema.BlockError) as e:
        BuildConfig.from_values({**schema.defaults(BuildConfig), field: value}, "qurl")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_an_output_may_not_overwrite_an_input(tmp_path):
    with pytest.raises(BuildError, match="would overwrite the input"):
        P.check_output_dir(tmp_path, [tmp_path / "questions.jsonl"])
    with pytest.raises(BuildError, match="would overwrite the input"):
        P.check_output_dir(tmp_path, [tmp_path / "work" / "batch_00000.json"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(BuildError, match="exists and is not a directory"):
        P.check_output_dir(tmp_path / "file", [])
    P.check_output_dir(tmp_path, [tmp_path / "corpus.jsonl"])  # next to the outputs is fine


def test_written_rubrics_round_trip(tmp_path, tok):
    result, _, _ = build(tmp_path, tok)
    (row,) = result.rows
    assert rubric_to_dict(load_questions(tmp_path / "questions.jsonl")[0].replace_rubric) == row["rubric"]["replace"]


COUNTS = {f.name: f.metadata["bounds"] for f in schema.config_fields(BuildConfig) if f.type == "int"}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_every_qurl_count_has_an_upper_bound(name):
    """Issue 38 H6: config.qurl's counts are bounded above as well (num_candidates=10**6 was accepted); the bounds
    are the fields' (rubric_jax/schema.py), so qurl_block() and the docs show them."""
    assert COUNTS[name] is not None
    largest = COUNTS[name][1]
    with pytest.raises(schema.BlockError, match=rf"^qurl\.{name}={largest + 1}: expected an integer <= {largest}$"):
        BuildConfig.from_values({**schema.defaults(BuildConfig), name: largest + 1}, "qurl")
