"""Judge backends (judges/backends.py): one retry loop and one parser over either backend, and the typed counters
(llm_judge.JudgeStats) that keep the metric names metrics.jsonl has always had (issue 35)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rubric_jax.judges import http_backend
from rubric_jax.judges import llm_judge as lj
from rubric_jax.judges.backends import Batch, HttpBackend, SamplerBackend
from rubric_jax.judges.cascade import CascadeStats
from rubric_jax.judges.prompts import single_prompt
from rubric_jax.judges.spec import JudgeSpec
from tests.judges.test_llm_judge import criteria_ids, dim, make_judge, tok  # noqa: F401 (tok: a fixture)

LOOP_COUNTERS = ["judge_prompts", "judge_generate_calls", "judge_invalid", "judge_retried", "judge_prompt_too_long",
                 "judge_store_hits", "judge_store_mismatches", "judge_store_unsaved", "judge_invalid_examples"]
SUMMARY = ["judge_scores", "judge_failed_samples", "judge_sample_spread_mean", "sample_spread_count"]


def test_the_sampler_backend_pads_to_the_agreed_count_in_batch_size_calls_and_counts_them(tok):
    judge, stub = make_judge(tok, lambda text, call: f"SCORE: {call + 1}", batch_size=2)
    prompts = [single_prompt("q", f"answer {i}", dim("acc"), nonce="ab" * 8) for i in range(5)]
    ids, _ = lj.encode_prompts(tok, prompts)
    stats = lj.JudgeStats()
    assert isinstance(judge.backend, SamplerBackend)
    calls = list(judge.backend.calls(judge, Batch(prompts, ids, None, 6, jax.random.key(0)), stats))
    # Another process sent 6 prompts: this one's 5 go in calls of 2, the last padded with a filler.
    assert [call["batch"] for call in stub.calls] == [2, 2, 2]
    assert [[a.text for a in call] for call in calls] == [["SCORE: 1"] * 2, ["SCORE: 2"] * 2, ["SCORE: 3"]]
    assert stats.judge_generate_calls == 3 and stats.http is None


def test_a_sampler_backend_refuses_a_bad_batch_size():
    with pytest.raises(ValueError, match=r"judge batch_size must be an integer >= 0, got -1"):
        SamplerBackend(None, lambda *args, **kwargs: None, batch_size=-1)


class ScriptedClient:
    """An endpoint client double: `acc` prompts get SCORE: 4, any other criterion no answer (judge_http_error)."""

    def __init__(self):
        self.asked: list[int] = []

    def answer(self, chats, *, sampler, max_tokens, stats):
        stats.judge_http_requests += len(chats)
        stats.latencies.extend([0.5] * len(chats))
        self.asked.append(len(chats))
        return [http_backend.Answer("SCORE: 4", "stop") if criteria_ids(chat[-1]["content"]) == ["acc"] else
                http_backend.Answer(cause="judge_http_error", error="boom") for chat in chats]


def test_the_retry_loop_runs_over_an_endpoint_backend_with_the_same_parser_and_counters():
    client = ScriptedClient()
    judge = lj.Judge("scripted", None, HttpBackend(client), sampler="greedy", max_new_tokens=8)
    assert isinstance(judge.backend, HttpBackend)
    spec = JudgeSpec(samples=1, max_retries=2, backend="openai", base_url="http://127.0.0.1:9/v1", model="m")
    out = lj.judge_rows([judge], spec, ["q"], ["r"], [[dim("acc"), dim("tone")]], jax.random.key(0))
    assert out.scores[0][0] == 4 and np.isnan(out.scores[0][1])
    assert out.causes == [["", "judge_http_error"]]
    assert client.asked == [2]  # a prompt the endpoint never answered is not re-prompted
    latencies = [f"judge_http_latency_p{q}_s" for q in http_backend.LATENCY_PERCENTILES]
    assert list(out.details) == [*LOOP_COUNTERS, *http_backend.HTTP_COUNTERS, "judge_http_error_examples",
                                 *latencies, *SUMMARY, "judge_failed_scores"]
    assert out.details["judge_http_error_examples"] == ["scripted: boom"]
    assert (out.details["judge_prompts"], out.details["judge_http_requests"], out.details[latencies[0]]) == (1, 2, 0.5)


def test_judge_stats_details_keep_the_metric_names_and_their_order():
    assert list(lj.JudgeStats().details()) == [*LOOP_COUNTERS, *SUMMARY, "judge_failed_scores"]
    cascaded = lj.JudgeStats(cascade=CascadeStats(4, 1, 0.25, 2, 1, 0, 0)).details()
    assert list(cascaded) == [*LOOP_COUNTERS, *SUMMARY, "judge_cascade_screened", "judge_cascade_escalated",
                              "judge_cascade_escalated_frac", "judge_cascade_prompts", "judge_cascade_generate_calls",
                              "judge_cascade_store_hits", "judge_cascade_failed_scores", "judge_failed_scores"]
    assert cascaded["judge_cascade_escalated_frac"] == 0.25


def test_http_counters_summary_names_each_counter_then_the_latency_percentiles():
    counters = http_backend.HttpCounters(judge_http_requests=2, latencies=[1.0, 3.0])
    summary = counters.summary()
    assert list(summary) == [*http_backend.HTTP_COUNTERS, "judge_http_latency_p50_s", "judge_http_latency_p90_s",
                             "judge_http_latency_p99_s"]
    assert (summary["judge_http_requests"], summary["judge_http_latency_p50_s"]) == (2, 2.0)
    assert np.isnan(http_backend.HttpCounters().summary()["judge_http_latency_p99_s"])  # none answered
