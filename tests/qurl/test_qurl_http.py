"""Rubric construction against an OpenAI-compatible endpoint (issue 20 §5): with qurl.generator=judge and
config.judge.backend=openai, every stage (meta-descriptions, candidate rubrics, sampled answers, the filter's
judge scores) is a request to the endpoint, no model is loaded, and the build keeps rubrics made of what the
endpoint wrote. The endpoint is the scripted double of tests/openai_double.py."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from openai_double import MODEL, Endpoint
from rubric_jax import config_boundary
from rubric_jax.qurl import pipeline
from rubric_jax.qurl.config import BuildError
from tiny_config import ROOT, absolute_tiny_config

QURL_ASSETS = ROOT / "rubric_jax" / "assets" / "qurl"


def _criterion(cid: str, description: str, points: int, cites: list[int]) -> dict:
    return {"id": cid, "description": description, "points": points,
            "levels": {str(level): f"{cid} level {level}" for level in range(points + 1)},
            "good_example": "good", "bad_example": "bad", "cites": cites}


def scripted_llm():
    """The endpoint's model: a meta-description per document, one two-criterion rubric per request, answers of
    qualities 0..4 in turn, and verdicts that give each criterion the answer's quality (capped at its points)."""
    answers = itertools.count()

    def reply(messages: list[dict]) -> str:
        text = messages[-1]["content"]
        if "Write a meta-description" in text:
            return "A short meta-description of the document."
        if "Write a rubric" in text:
            cites = [] if "References: none" in text else [1]
            return json.dumps({"criteria": [_criterion("coverage", "Covers a safe plan step by step.", 4, cites),
                                            _criterion("flow", "Reads in a clear order.", 2, cites)]})
        criteria = re.findall(r"Criterion `([^`]+)` \(integer score from 0 to (\d+)\)", text)
        if criteria:
            quality = int(re.search(r"quality (\d)", text).group(1))
            return "Reasons.\n" + "\n".join(f"{c}: {min(quality, int(hi))}" for c, hi in criteria)
        return f"An answer of quality {next(answers) % 5}."

    return reply


def _config(url: str):
    config = absolute_tiny_config()
    with config.unlocked():
        config.qurl.generator = "judge"
        config.judge.backend, config.judge.base_url, config.judge.model = "openai", url, MODEL
        config.judge.checkpoint = ""  # the endpoint's own model: no local directory
        config.judge.mode, config.judge.prompt, config.judge.samples, config.judge.max_retries = \
            "all_criteria", "full", 1, 0
        config.judge.max_retries_http, config.judge.outage_s = 0, 0
    return config


def test_every_stage_of_a_build_is_written_and_judged_by_the_endpoint(tmp_path):
    endpoint = Endpoint(reply=scripted_llm()).up()
    try:
        questions = tmp_path / "questions.jsonl"
        questions.write_text("".join((QURL_ASSETS / "questions.jsonl").read_text().splitlines(True)[:2]))
        result = pipeline.run_build(config_boundary.experiment(_config(endpoint.url)), str(questions), str(QURL_ASSETS / "corpus.jsonl"),
                                    str(tmp_path / "out"), log=lambda line: None)
    finally:
        endpoint.down()
    stages = {"meta": "Write a meta-description", "rubric": "Write a rubric", "judge": "Criterion `"}
    seen = {name: sum(marker in r for r in endpoint.requests) for name, marker in stages.items()}
    answers = sum(not any(m in r for m in stages.values()) for r in endpoint.requests)
    assert min(seen.values()) > 0 and answers > 0, seen  # each stage went to the endpoint
    summary = result.report["summary"]
    assert summary["questions"] == 2 and summary["kept"] == 2, summary
    built = [json.loads(line) for line in (tmp_path / "out" / "questions.jsonl").read_text().splitlines()]
    assert [{d["id"] for d in row["rubric"]["replace"]["dimensions"]} for row in built] == [{"coverage", "flow"}] * 2
    usage = result.report["generator"]
    assert usage["name"] == f"{MODEL}@{endpoint.url}"
    assert usage["judge_http_requests"] == len(endpoint.requests) - seen["judge"]  # the writer's own requests


def test_generator_judge_without_an_endpoint_is_one_line():
    config = absolute_tiny_config()
    with config.unlocked():
        config.qurl.generator = "judge"
    with pytest.raises(BuildError, match="qurl.generator=judge writes through the judge's endpoint"):
        pipeline.run_build(config_boundary.experiment(config), str(QURL_ASSETS / "questions.jsonl"), str(QURL_ASSETS / "corpus.jsonl"),
                           "/nonexistent/out")


def test_an_unknown_generator_names_the_field():
    config = absolute_tiny_config()
    with config.unlocked():
        config.qurl.generator = "api"
    with pytest.raises(ValueError, match=r"^config\.qurl\.generator='api': expected one of \('model', 'judge'\)"):
        config_boundary.experiment(config)
