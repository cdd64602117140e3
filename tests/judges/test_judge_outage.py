"""A served judge that goes away mid-run (issue 20 §3): the client waits it out for judge.outage_s and goes on when
it is back; past that the command stops with one line naming the endpoint, nothing of the round applied, and the
same command resumes once the endpoint answers again. The endpoint is a scripted OpenAI-compatible double on
127.0.0.1 (every verdict `SCORE: 1`) that the test takes down and brings back."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from openai_double import MODEL, Endpoint
from rubric_jax.judges import http_backend
from rubric_jax.judges.spec import JudgeSpec, JudgeSpecError, judge_hash
from tiny_config import absolute_tiny_config


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.down()


def client(url: str, **fields) -> http_backend.HttpJudgeClient:
    spec = JudgeSpec(backend="openai", base_url=url, model=MODEL, max_retries_http=0, timeout_s=5.0, **fields)
    return http_backend.HttpJudgeClient(spec)


CHATS = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]


def test_an_endpoint_back_within_outage_s_answers_every_prompt(endpoint):
    """Down when the round starts, up 2 s later: every prompt is answered (none missing), and each request
    that waited is counted in judge_http_outage_waits."""
    judge, stats = client(endpoint.url, outage_s=60.0), http_backend.HttpCounters()
    threading.Timer(2.0, endpoint.up).start()
    answers = judge.answer(CHATS, sampler="greedy", max_tokens=8, stats=stats)
    assert [a.text for a in answers] == ["SCORE: 1"] * 3 and not any(a.cause for a in answers)
    assert stats.judge_http_outage_waits == 3 and stats.judge_http_failures == 0
    assert len(endpoint.requests) == 3


def test_an_endpoint_down_past_outage_s_stops_the_round_naming_it(endpoint):
    with pytest.raises(http_backend.EndpointDown) as error:
        client(endpoint.url, outage_s=0.5).answer(CHATS, sampler="greedy", max_tokens=8,
                                                  stats=http_backend.HttpCounters())
    message = str(error.value)
    assert message.startswith(f"judge endpoint {endpoint.url} stopped answering for ")
    assert "judge.outage_s=0.5" in message and "re-run the same command" in message
    assert "\n" not in message


def test_outage_s_zero_keeps_a_missing_score_per_prompt(endpoint):
    """outage_s=0: no wait; each prompt's connection error is its own missing score (cause judge_http_error)."""
    stats = http_backend.HttpCounters()
    answers = client(endpoint.url, outage_s=0).answer(CHATS, sampler="greedy", max_tokens=8, stats=stats)
    assert [a.cause for a in answers] == ["judge_http_error"] * 3 and stats.judge_http_failures == 3


@pytest.mark.parametrize("value", [-1.0, float("inf"), "5", True])
def test_a_bad_outage_s_names_the_field(value):
    with pytest.raises(JudgeSpecError, match="outage_s"):
        JudgeSpec(backend="openai", base_url="http://127.0.0.1:1/v1", model=MODEL, outage_s=value)


def test_outage_s_changes_no_verdict_so_not_the_hash(endpoint):
    base = dict(backend="openai", base_url=endpoint.up().url, model=MODEL)  # hashing asks the endpoint its model
    assert judge_hash(JudgeSpec(**base, outage_s=1.0)) == judge_hash(JudgeSpec(**base, outage_s=600.0))


def _grpo_steps(workdir: Path) -> list[int]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r.get("stage") == "grpo" and "reward/mean" in r]


def _take_down_after_first_grpo_step(workdir: Path, endpoint: Endpoint, stop: threading.Event) -> None:
    while not stop.is_set():
        if (workdir / "metrics.jsonl").exists() and _grpo_steps(workdir):
            endpoint.down()
            return
        time.sleep(0.05)


def test_a_run_whose_judge_dies_stops_resumably_and_resumes_when_it_is_back(endpoint, tmp_path):
    """The tiny default with its politeness judge served: the endpoint dies once GRPO step 1 is logged. With a
    short outage_s the run stops (EndpointDown, naming the endpoint) with its last logged step k checkpointed and
    no row after it (the round that failed applied nothing); the endpoint back, the same call resumes from k and
    finishes. GRPO only: SFT sends nothing to the judge."""
    from rubric_jax.train import loop
    from rubric_jax.train.checkpointing import Checkpointer
    from rubric_jax.train.workdir import checkpoint_dir

    config = absolute_tiny_config()
    with config.unlocked():
        config.judge.backend, config.judge.base_url, config.judge.model = "openai", endpoint.url, MODEL
        config.judge.max_retries_http, config.judge.timeout_s, config.judge.outage_s = 0, 5.0, 1.0
        config.stages = ("grpo",)
        config.reward.gates_first = False  # the untrained policy fails the format gate: judge it anyway
        config.rl.steps, config.rl.questions_per_step, config.rl.group_size = 4, 2, 4
        config.rl.micro_batches, config.rl.max_new_tokens = 1, 8
        config.eval.every_steps, config.eval.max_questions, config.eval.max_new_tokens = 10, 8, 8
        config.checkpoint.every_steps = 1
    workdir = tmp_path / "run"
    endpoint.up()
    stop = threading.Event()
    watcher = threading.Thread(target=_take_down_after_first_grpo_step, args=(workdir, endpoint, stop))
    watcher.start()
    try:
        with pytest.raises(http_backend.EndpointDown, match=f"judge endpoint {endpoint.url} stopped answering"):
            loop.run(config, str(workdir))
    finally:
        stop.set()
        watcher.join()
    logged = _grpo_steps(workdir)
    last = logged[-1]
    assert logged == list(range(1, last + 1)) and last < config.rl.steps
    with Checkpointer(checkpoint_dir(workdir, "grpo"), max_to_keep=1) as checkpoints:
        assert checkpoints.latest_step() == last  # every logged step is saved (every_steps=1), none half-applied
    endpoint.up()
    loop.run(config, str(workdir))
    assert _grpo_steps(workdir) == [1, 2, 3, 4] and endpoint.requests
