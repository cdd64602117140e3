"""What an OpenAI-compatible endpoint answers is checked before it counts (issue 38 S5, S6, T4, H4): content sent
as a list of parts is joined, any other shape of content, a content_filter or tool_calls finish, a refusal and an
oversized answer are failures with their reason (never verdicts), null usage fields are left out, an absurd usage
is clamped (the token bucket stays sane), and the retries counted are the ones the client made. And which model
answers (S1): a served judge's hash holds the weights identity its endpoint reports, and an endpoint that reports
none is fingerprinted by the verdict store. The endpoint is the scripted double of tests/openai_double.py."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from openai_double import MODEL, Endpoint
from rubric_jax.judges import http_backend
from rubric_jax.judges.backends import HttpBackend
from rubric_jax.judges.llm_judge import FINGERPRINT_PROBES, Judge, judge_rows
from rubric_jax.judges.loading import load_judges, open_verdict_store
from rubric_jax.judges.spec import JudgeSpec, judge_hash
from rubric_jax.judges.store import StoreError
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
    stats = http_backend.HttpCounters()
    (answer,) = client(endpoint.url, **fields).answer(CHAT, sampler="greedy", max_tokens=max_tokens, stats=stats)
    return answer, stats


def test_content_as_a_list_of_parts_is_joined_and_other_shapes_are_refused_with_a_reason(endpoint):
    parts = [{"type": "text", "text": "Polite.\n"}, {"type": "image_url", "image_url": {"url": "x"}},
             {"type": "text", "text": "SCORE: 1"}]
    answer, stats = ask(endpoint, {"content": parts})
    assert (answer.text, answer.finish, answer.cause) == ("Polite.\nSCORE: 1", "stop", "")
    for content, why in ((7, "content is int"), ({"text": "SCORE: 1"}, "content is dict"),
                         ([{"type": "text", "text": 1}], "a text part's text is int"),
                         (["SCORE: 1"], "a content part is str")):
        answer, stats = ask(endpoint, {"content": content})
        assert answer.cause == "judge_http_error" and answer.error.startswith(f"refused answer: {why}"), answer
        assert stats.judge_http_failures == 1 and stats.judge_http_requests == 1


def test_a_content_filter_finish_a_refusal_and_an_oversized_answer_are_no_verdict(endpoint):
    for script, why in (({"content": "SCORE: 1", "finish_reason": "content_filter"}, "finish_reason 'content_filter'"),
                        ({"content": "SCORE: 1", "finish_reason": "tool_calls"}, "finish_reason 'tool_calls'"),
                        ({"content": "SCORE: 1", "refusal": "I can't judge that."}, "the model refused"),
                        ({"content": "x" * 2_000_000 + "\nSCORE: 1"},
                         "an answer of 2000009 characters for max_tokens=16")):
        answer, stats = ask(endpoint, script)
        assert answer.cause == "judge_http_error" and answer.error.startswith(f"refused answer: {why}"), answer
        assert answer.text == "" and stats.judge_http_failures == 1
    answer, _ = ask(endpoint, {"content": "SCORE: 1", "finish_reason": "length"})
    assert (answer.text, answer.finish, answer.cause) == ("SCORE: 1", "length", "")


def test_a_content_filtered_verdict_is_a_missing_score_with_its_reason(endpoint):
    """Through the judge: `SCORE: 1` behind a content_filter finish is no score (cause judge_http_error, the reason
    among the examples), not a valid 1; it is not retried as an unparseable verdict would be."""
    endpoint.reply = lambda messages: {"content": "SCORE: 1", "finish_reason": "content_filter"}
    spec = JudgeSpec(backend="openai", base_url=endpoint.url, model=MODEL, max_retries_http=0, outage_s=0, samples=1,
                     sampler="greedy")
    judge = Judge("filtered", None, HttpBackend(http_backend.HttpJudgeClient(spec)), sampler="greedy", max_new_tokens=8)
    out = judge_rows([judge], spec, ["q", "q"], ["Thanks!", "Go away."], [[SAFE]] * 2, jax.random.key(0))
    assert all(np.isnan(s).all() for s in out.scores) and out.causes == [["judge_http_error"]] * 2
    assert out.details["judge_http_failures"] == 2 and out.details["judge_retried"] == 0
    assert "refused answer: finish_reason 'content_filter'" in out.details["judge_http_error_examples"][0]


def test_null_usage_fields_are_left_out_and_an_absurd_usage_is_clamped(endpoint, capsys):
    answer, stats = ask(endpoint, {"content": "SCORE: 1", "usage": {"prompt_tokens": None, "completion_tokens": None,
                                                                   "total_tokens": None}})
    assert answer.text == "SCORE: 1" and stats.judge_http_prompt_tokens == stats.judge_http_completion_tokens == 0
    assert stats.judge_http_usage_clamped == 0
    judge = client(endpoint.url, tokens_per_minute=1_000_000)
    endpoint.reply = lambda messages: {"content": "SCORE: 1", "usage": {"prompt_tokens": 1e12,
                                                                        "completion_tokens": -5, "total_tokens": 1}}
    stats = http_backend.HttpCounters()
    judge.answer(CHAT * 2, sampler="greedy", max_tokens=16, stats=stats)
    bound = http_backend.prompt_bound(CHAT[0])
    assert stats.judge_http_usage_clamped == 2 and stats.judge_http_prompt_tokens == 2 * bound
    assert stats.judge_http_completion_tokens == 0
    assert judge.tokens.level > 1_000_000 - 4 * bound  # charged what was sent, not 1e12: the next request goes now
    warning = capsys.readouterr().err
    assert warning.count(f"warning: judge endpoint {endpoint.url} reported usage") == 1 and "clamped" in warning


def test_the_retries_counted_are_the_ones_the_client_made(endpoint):
    """A 429 whose Retry-After is over two minutes is not retried by the openai client (counted 0, not
    max_retries_http); a 503 twice then an answer is 2 retries; a 503 every time is max_retries_http."""
    answer, stats = ask(endpoint, {"status": 429, "headers": {"Retry-After": "3600"}, "content": "slow down"},
                        max_retries_http=3)
    assert answer.cause == "judge_http_error" and stats.judge_http_retries == 0 and stats.judge_http_failures == 1
    calls = []

    def flaky(messages):
        calls.append(1)
        return {"status": 503, "headers": {"retry-after-ms": "10"}} if len(calls) <= 2 else "SCORE: 1"

    endpoint.reply, stats = flaky, http_backend.HttpCounters()
    (answer,) = client(endpoint.url, max_retries_http=3).answer(CHAT, sampler="greedy", max_tokens=8, stats=stats)
    assert answer.text == "SCORE: 1" and stats.judge_http_retries == 2 and stats.judge_http_failures == 0
    answer, stats = ask(endpoint, {"status": 503, "headers": {"retry-after-ms": "10"}}, max_retries_http=2)
    assert answer.cause == "judge_http_error" and stats.judge_http_retries == 2


def test_read_answer_bounds_the_answer_by_its_token_budget():
    limit = http_backend.MAX_CHARS_PER_TOKEN * 4
    assert http_backend.read_answer("a" * limit, "stop", None, 4) == ("a" * limit, "stop")
    with pytest.raises(ValueError, match=f"an answer of {limit + 1} characters for max_tokens=4"):
        http_backend.read_answer("a" * (limit + 1), "stop", None, 4)
    assert http_backend.read_answer(None, None, None, 4) == ("", "stop")


def _score_with_store(spec: JudgeSpec, responses: list[str]) -> tuple[str, dict]:
    """One command's worth: the served judge loaded, its store opened under the judge hash, the rows judged."""
    (judge,) = load_judges(spec)
    store = open_verdict_store(spec)
    out = judge_rows([judge], spec, ["How is my order?"] * len(responses), responses, [[SAFE]] * len(responses),
                     jax.random.key(0), store)
    store.close()
    return store.judge_hash, out.details


SERVED = dict(backend="openai", model=MODEL, samples=1, sampler="greedy", max_retries_http=0, outage_s=0,
              max_retries=0)
ROWS = [f"Answer {i}: {'thanks!' if i % 2 else 'no.'}" for i in range(6)]


def test_another_model_served_under_the_same_name_is_another_judge_hash(endpoint, tmp_path):
    """S1: the endpoint reports the weights identity behind its model name (as experiments.serve does); after a
    swap to other weights under the same name, the judge hash moves and no stored verdict is read."""
    endpoint.identity = "a" * 64
    tokenizer_dir = str(Path(__file__).resolve().parents[2] / "rubric_jax" / "assets" / "tiny_judge")
    spec = JudgeSpec(base_url=endpoint.url, store=str(tmp_path / "v.db"), checkpoints=(tokenizer_dir,), **SERVED)
    first_hash, first = _score_with_store(spec, ROWS)
    again_hash, again = _score_with_store(spec, ROWS)
    assert again_hash == first_hash and again["judge_store_hits"] == len(ROWS) and again["judge_prompts"] == 0
    endpoint.identity = "b" * 64
    swapped_hash, swapped = _score_with_store(spec, ROWS)
    assert swapped_hash != first_hash and swapped["judge_store_hits"] == 0 and swapped["judge_prompts"] == len(ROWS)
    assert not any(FINGERPRINT_PROBES[0] in request for request in endpoint.requests)  # identified: no probes


def test_an_endpoint_reporting_no_identity_is_fingerprinted_by_the_store(endpoint, tmp_path):
    """S1, a foreign endpoint: the first use of a store sends the fixed probes once and stores their verdicts; the
    same model passes (and is probed once per store and client); another model behind the name is refused in one
    line before anything is judged or stored."""
    spec = JudgeSpec(base_url=endpoint.url, store=str(tmp_path / "v.db"), **SERVED)
    _, first = _score_with_store(spec, ROWS)
    probes = [r for r in endpoint.requests if any(p in r for p in FINGERPRINT_PROBES)]
    assert len(probes) == len(FINGERPRINT_PROBES) and first["judge_prompts"] == len(ROWS)
    _, again = _score_with_store(spec, ROWS)
    assert again["judge_store_hits"] == len(ROWS)
    endpoint.reply = lambda messages: "SCORE: 1" if "Thank" in messages[-1]["content"] else "SCORE: 0"
    before = len(endpoint.requests)
    with pytest.raises(StoreError) as error:
        _score_with_store(spec, ROWS)
    assert str(error.value) == (
        f"verdict store {tmp_path / 'v.db'}: the served judge {MODEL}@{endpoint.url} reports no weights identity, "
        "and its verdicts on the fingerprint probes are [1.0, 0.0, 1.0, 0.0], not the [1.0, 1.0, 1.0, 1.0] stored with "
        "this store's verdicts: another model answers under that name; serve the same model or use another "
        "--judge.store")
    assert len(endpoint.requests) - before == len(FINGERPRINT_PROBES)  # the probes only: nothing judged
    assert judge_hash(spec) == _score_with_store(JudgeSpec(base_url=endpoint.url, store=str(tmp_path / "new.db"),
                                                           **SERVED), ROWS)[0]  # a new store starts a new fingerprint
