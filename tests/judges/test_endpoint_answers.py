"""What an OpenAI-compatible endpoint answers is checked before it counts (issue 38 S5, S6, T4, H4): content sent
as a list of parts is joined, any other shape of content, a content_filter or tool_calls finish, a refusal and an
oversized answer are failures with their reason (never verdicts), null usage fields are left out, an absurd usage
is clamped (the token bucket stays sane), and the retries counted are the ones the client made. The endpoint is
the scripted double of tests/openai_double.py."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from openai_double import MODEL, Endpoint
from rubric_jax.judges import http_backend
from rubric_jax.judges.llm_judge import Judge, judge_rows
from rubric_jax.judges.spec import JudgeSpec
from test_llm_judge import SAFE

CHAT = [[{"role": "user", "content": "Was this polite?"}]]


@pytest.fixture
def endpoint():
    e = Endpoint().up()
    yield e
    e.down()


def client(url: str, **fields) -> http_backend.HttpJudgeClient:
    spec = JudgeSpec(backend="openai", base_url=url, model=MODEL, timeout_s=10.0, outage_s=0,
                     **{"max_retries_http": 0, **fields})
    return http_backend.HttpJudgeClient(spec)


def ask(endpoint: Endpoint, reply, max_tokens: int = 16, **fields) -> tuple[http_backend.Answer, dict]:
    endpoint.reply = lambda messages: reply
    stats: dict = {}
    (answer,) = client(endpoint.url, **fields).answer(CHAT, sampler="greedy", max_tokens=max_tokens, stats=stats)
    return answer, stats


def test_content_as_a_list_of_parts_is_joined_and_other_shapes_are_refused_with_a_reason(endpoint):
    parts = [{"type": "text", "text": "Polite.\n"}, {"type": "image_url", "image_url": {"url": "x"}},
             {"type": "text", "text": "SCORE: 1"}]
    answer, stats = ask(endpoint, {"content": parts})
    assert (answer.text, answer.finish, answer.cause) == ("Polite.\nSCORE: 1", "stop", "")
    for content, why in ((7, "content is int"), ({"text": "SCORE: 1"}, "content is dict"),
                         ([{"type": "text", "text": 1}], "a text part's text is int"), (["SCORE: 1"], "a content part is str")):
        answer, stats = ask(endpoint, {"content": content})
        assert answer.cause == "judge_http_error" and answer.error.startswith(f"refused answer: {why}"), answer
        assert stats["judge_http_failures"] == 1 and stats["judge_http_requests"] == 1


def test_a_content_filter_finish_a_refusal_and_an_oversized_answer_are_no_verdict(endpoint):
    for script, why in (({"content": "SCORE: 1", "finish_reason": "content_filter"}, "finish_reason 'content_filter'"),
                        ({"content": "SCORE: 1", "finish_reason": "tool_calls"}, "finish_reason 'tool_calls'"),
                        ({"content": "SCORE: 1", "refusal": "I can't judge that."}, "the model refused"),
                        ({"content": "x" * 2_000_000 + "\nSCORE: 1"}, "an answer of 2000009 characters for max_tokens=16")):
        answer, stats = ask(endpoint, script)
        assert answer.cause == "judge_http_error" and answer.error.startswith(f"refused answer: {why}"), answer
        assert answer.text == "" and stats["judge_http_failures"] == 1
    answer, _ = ask(endpoint, {"content": "SCORE: 1", "finish_reason": "length"})
    assert (answer.text, answer.finish, answer.cause) == ("SCORE: 1", "length", "")


def test_a_content_filtered_verdict_is_a_missing_score_with_its_reason(endpoint):
    """Through the judge: `SCORE: 1` behind a content_filter finish is no score (cause judge_http_error, the reason
    among the examples), not a valid 1; it is not retried as an unparseable verdict would be."""
    endpoint.reply = lambda messages: {"content": "SCORE: 1", "finish_reason": "content_filter"}
    spec = JudgeSpec(backend="openai", base_url=endpoint.url, model=MODEL, max_retries_http=0, outage_s=0, samples=1,
                     sampler="greedy")
    judge = Judge("filtered", None, None, None, sampler="greedy", max_new_tokens=8,
                  http=http_backend.HttpJudgeClient(spec))
    out = judge_rows([judge], spec, ["q", "q"], ["Thanks!", "Go away."], [[SAFE]] * 2, jax.random.key(0))
    assert all(np.isnan(s).all() for s in out.scores) and out.causes == [["judge_http_error"]] * 2
    assert out.details["judge_http_failures"] == 2 and out.details["judge_retried"] == 0
    assert "refused answer: finish_reason 'content_filter'" in out.details["judge_http_error_examples"][0]


def test_null_usage_fields_are_left_out_and_an_absurd_usage_is_clamped(endpoint, capsys):
    answer, stats = ask(endpoint, {"content": "SCORE: 1", "usage": {"prompt_tokens": None, "completion_tokens": None,
                                                                   "total_tokens": None}})
    assert answer.text == "SCORE: 1" and stats["judge_http_prompt_tokens"] == stats["judge_http_completion_tokens"] == 0
    assert stats["judge_http_usage_clamped"] == 0
    judge = client(endpoint.url, tokens_per_minute=1_000_000)
    endpoint.reply = lambda messages: {"content": "SCORE: 1", "usage": {"prompt_tokens": 1e12,
                                                                        "completion_tokens": -5, "total_tokens": 1}}
    stats = {}
    judge.answer(CHAT * 2, sampler="greedy", max_tokens=16, stats=stats)
    bound = http_backend.prompt_bound(CHAT[0])
    assert stats["judge_http_usage_clamped"] == 2 and stats["judge_http_prompt_tokens"] == 2 * bound
    assert stats["judge_http_completion_tokens"] == 0
    assert judge.tokens.level > 1_000_000 - 4 * bound  # charged what was sent, not 1e12: the next request goes now
    warning = capsys.readouterr().err
    assert warning.count(f"warning: judge endpoint {endpoint.url} reported usage") == 1 and "clamped" in warning


def test_the_retries_counted_are_the_ones_the_client_made(endpoint):
    """A 429 whose Retry-After is over two minutes is not retried by the openai client (counted 0, not
    max_retries_http); a 503 twice then an answer is 2 retries; a 503 every time is max_retries_http."""
    answer, stats = ask(endpoint, {"status": 429, "headers": {"Retry-After": "3600"}, "content": "slow down"},
                        max_retries_http=3)
    assert answer.cause == "judge_http_error" and stats["judge_http_retries"] == 0 and stats["judge_http_failures"] == 1
    calls = []

    def flaky(messages):
        calls.append(1)
        return {"status": 503, "headers": {"retry-after-ms": "10"}} if len(calls) <= 2 else "SCORE: 1"

    endpoint.reply, stats = flaky, {}
    (answer,) = client(endpoint.url, max_retries_http=3).answer(CHAT, sampler="greedy", max_tokens=8, stats=stats)
    assert answer.text == "SCORE: 1" and stats["judge_http_retries"] == 2 and stats["judge_http_failures"] == 0
    answer, stats = ask(endpoint, {"status": 503, "headers": {"retry-after-ms": "10"}}, max_retries_http=2)
    assert answer.cause == "judge_http_error" and stats["judge_http_retries"] == 2


def test_read_answer_bounds_the_answer_by_its_token_budget():
    limit = http_backend.MAX_CHARS_PER_TOKEN * 4
    assert http_backend.read_answer("a" * limit, "stop", None, 4) == ("a" * limit, "stop")
    with pytest.raises(ValueError, match=f"an answer of {limit + 1} characters for max_tokens=4"):
        http_backend.read_answer("a" * (limit + 1), "stop", None, 4)
    assert http_backend.read_answer(None, None, None, 4) == ("", "stop")
