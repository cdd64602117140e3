"""The OpenAI-compatible judge backend against our own judge server (experiments.serve, the shipped tiny judge),
on 127.0.0.1 only: greedy verdicts over HTTP are the in-process ones, bad requests are 4xx, a missing key is 401,
concurrent requests are each answered once and batched, and an endpoint that is down is one line or a cause."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import pytest

from configs.judges import tiny as tiny_judge_config
from rubric_jax.judges import http_backend
from rubric_jax.judges.backends import HttpBackend, SamplerBackend
from rubric_jax.judges.llm_judge import Judge, judge_rows
from rubric_jax.judges.loading import load_judges
from rubric_jax.judges.spec import JudgeSpec, describe, judge_hash
from rubric_jax.rubrics.schema import dimension_from_dict

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "rubric_jax" / "assets" / "tiny"
TINY_JUDGE = str(REPO / "rubric_jax" / "assets" / "tiny_judge")
KEY_ENV, KEY = "RJ_TEST_SERVE_KEY", "test-key-3141"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, *flags: str) -> subprocess.Popen:
    """experiments.serve on the tiny judge in a subprocess, returned once /health answers."""
    env = {**os.environ, "PYTHONPATH": str(REPO), KEY_ENV: KEY}
    proc = subprocess.Popen([sys.executable, "-m", "experiments.serve", f"--checkpoint={TINY_JUDGE}",
                             "--judge=configs/judges/tiny.py", f"--config.port={port}", *flags],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"experiments.serve exited {proc.returncode}: {proc.stdout.read()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise AssertionError("experiments.serve did not answer /health in 300 s")


@pytest.mark.parametrize("setting, message", [
    ("--config.port=0", "--config.port=0: expected an integer >= 1"),
    ("--config.max_batch=0", "--config.max_batch=0: expected an integer >= 1"),
    ("--config.api_key_env=RJ_TEST_UNSET_KEY", "--config.api_key_env=RJ_TEST_UNSET_KEY: the environment variable is "
                                               "not set"),
    ("--config.prot=8000", "unknown config key 'prot' (Did you mean \"port\""),
    ("--config.port=65536", "--config.port=65536: expected an integer <= 65535"),
    ("--config.batch_window_ms=1e9", "--config.batch_window_ms=1000000000.0: expected a number in [0, 10000]"),
    ("--config.max_body_bytes=100", "--config.max_body_bytes=100: expected an integer >= 1024"),
])
def test_serve_refuses_a_bad_setting_in_one_line_before_loading(setting, message, command_server):
    proc = command_server("experiments.serve").run(f"--checkpoint={TINY_JUDGE}", setting)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"experiments.serve: error: {message}"), proc.stderr


def test_serve_on_a_busy_port_fails_before_loading_and_warns_of_an_open_host_without_a_key(command_server):
    """The port is bound before the model loads: a busy one is one line and exit 2, with nothing served. Every
    interface (0.0.0.0) without an API key is a warning line first."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = command_server("experiments.serve").run(f"--checkpoint={TINY_JUDGE}", "--config.host=0.0.0.0",
                                                       f"--config.port={port}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "serving" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-2:] == [
        "experiments.serve: warning: --config.host=0.0.0.0 without an API key: anyone who reaches this port can use "
        "the judge (set --config.api_key_env=NAME)",
        f"experiments.serve: error: --config.port={port}: cannot listen on 0.0.0.0:{port}: Address already in use"]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = start_server(port, f"--config.api_key_env={KEY_ENV}")
    os.environ[KEY_ENV] = KEY  # what the clients' judge.api_key_env names
    yield f"http://127.0.0.1:{port}"
    os.environ.pop(KEY_ENV, None)
    proc.terminate()
    proc.wait(timeout=30)


def post(url: str, body: bytes | dict, key: str | None = KEY) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, raw, headers), timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def counters(base: str) -> dict:
    """The server's /health with its counters (they need the key; without it /health is only {"status": "ok"})."""
    request = urllib.request.Request(f"{base}/health", headers={"Authorization": f"Bearer {KEY}"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())


def tiny_spec(**fields) -> JudgeSpec:
    return dataclasses.replace(JudgeSpec.from_config(tiny_judge_config.get_config()), **fields)


def http_spec(base: str, **fields) -> JudgeSpec:
    return tiny_spec(backend="openai", base_url=f"{base}/v1", model="tiny_judge", api_key_env=KEY_ENV, **fields)


def politeness_rows(count: int = 8):
    """The tiny SFT set's questions and responses (some thank or apologise, some do not) and the tiny default's
    LLM politeness dimension."""
    (dim,) = [d for d in json.loads((TINY / "questions_eval.jsonl").open().readline())["rubric"]["extra"]
              if d["kind"] == "llm"]
    rows = [json.loads(line) for line in (TINY / "sft.jsonl").open()][:count]
    return [r["prompt"] for r in rows], [r["response"] for r in rows], [[dimension_from_dict(dim)]] * count


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_greedy_verdicts_over_http_equal_the_in_process_ones(server, endpoint):
    questions, responses, dims = politeness_rows()
    key = jax.random.key(7)
    local = judge_rows(load_judges(tiny_spec()), tiny_spec(), questions, responses, dims, key)
    spec = http_spec(server, endpoint=endpoint)
    remote = judge_rows(load_judges(spec), spec, questions, responses, dims, key)
    local_scores, remote_scores = np.concatenate(local.scores), np.concatenate(remote.scores)
    assert len(set(local_scores[~np.isnan(local_scores)].tolist())) == 2  # both verdicts occur: not trivially equal
    np.testing.assert_array_equal(remote_scores, local_scores)
    assert remote.causes == local.causes
    d = remote.details
    assert d["judge_http_requests"] == d["judge_prompts"] == local.details["judge_prompts"]
    assert d["judge_http_failures"] == 0 and d["judge_http_prompt_tokens"] > 0 and d["judge_http_completion_tokens"] > 0
    assert 0 < d["judge_http_latency_p50_s"] <= d["judge_http_latency_p90_s"] <= d["judge_http_latency_p99_s"]


def _with_key() -> str:
    """Setup code for a command server's child (tests/command_server.py): the served judge's key in its environment,
    where the clients' judge.api_key_env names it."""
    return f"import os\nos.environ[{KEY_ENV!r}] = {KEY!r}\n"


def test_the_readme_two_process_run_trains_with_the_served_judge(server, tmp_path, command_server):
    """README's second pair of commands, shortened: the tiny default whose politeness judge is the served one
    (`experiments.serve --checkpoint=rubric_jax/assets/tiny_judge --judge=configs/judges/tiny.py` is the module's
    server): every GRPO step's judge prompts go over HTTP, none fails. The full run's held-out rewards equal the
    in-process run's at every eval (benchmarks/RESULTS.md); the verdicts' equality is the test above."""
    from tiny_config import absolute_tiny_config

    sft = tmp_path / "sft.jsonl"  # 32 of the tiny default's 174 SFT answers: 2 steps of 16, not 6 of 32 (as test_loop)
    sft.write_text("".join(Path(absolute_tiny_config().data.sft).read_text().splitlines(keepends=True)[:32]))
    short = [f"--config.data.sft={sft}", "--config.sft.epochs=1", "--config.sft.batch_size=16", "--config.rl.steps=2",
             "--config.rl.questions_per_step=2", "--config.rl.group_size=4", "--config.rl.micro_batches=1",
             "--config.rl.max_new_tokens=16", "--config.eval.max_questions=8", "--config.eval.every_steps=2",
             "--config.eval.max_new_tokens=16", "--config.reward.gates_first=False"]
    proc = command_server("experiments.run").run(  # as ./launch.sh does, forked from the warm server
        "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}", "--config.judge.backend=openai",
        f"--config.judge.base_url={server}/v1", "--config.judge.model=tiny_judge",
        f"--config.judge.api_key_env={KEY_ENV}", *short, setup=_with_key())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r.get("stage") == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2] and all(r["judge_http_requests"] > 0 for r in grpo)
    assert sum(r.get("judge_http_failures", 0) for r in rows) == 0 and all(r["judge_failed_scores"] == 0 for r in grpo)


def test_build_rubrics_writes_through_the_served_judge_and_names_the_stage_that_kept_nothing(server, tmp_path,
                                                                                              command_server):
    """Issue 20 §5 against a real endpoint (tests/qurl/test_qurl_http.py has the scripted one): experiments.build_rubrics
    with qurl.generator=judge sends its stages to experiments.serve. The tiny judge writes the meta-descriptions; its
    context is too short for a rubric-writing prompt, which the server refuses (400), so no rubric is built: the report
    is written and the command exits 1 naming the stage and the cause."""
    qurl = REPO / "rubric_jax" / "assets" / "qurl"
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join((qurl / "questions.jsonl").read_text().splitlines(True)[:2]))
    before = counters(server)
    proc = command_server("experiments.build_rubrics").run(
        "--config=configs/tiny.py", f"--questions={questions}", f"--corpus={qurl / 'corpus.jsonl'}",
        f"--out={tmp_path / 'out'}", "--config.qurl.generator=judge", "--config.judge.backend=openai",
        f"--config.judge.base_url={server}/v1", "--config.judge.model=tiny_judge",
        f"--config.judge.api_key_env={KEY_ENV}", setup=_with_key())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "experiments.build_rubrics: error: no rubric built: all 2 question(s) dropped: 2 at rubric_generation "
        f"(no valid candidate in 2 sample(s)); {tmp_path / 'out'}/report.json has each question's reason")
    summary, usage = (json.loads((tmp_path / "out" / "report.json").read_text())[k] for k in ("summary", "generator"))
    meta, rubric = summary["meta_description"], summary["rubric_generation"]
    assert meta["requests"] > 0 and meta["failed"] == 0  # written by the served judge
    assert rubric["requests"] > 0 and rubric["prompt_too_long"] == rubric["failed"] == rubric["requests"]
    after = counters(server)
    served, refused = (after[k] - before[k] for k in ("requests", "refused"))
    assert usage["judge_http_requests"] == meta["attempts"] + rubric["attempts"] == served + refused
    assert (served, refused) == (meta["attempts"], rubric["attempts"]) and usage["judge_http_failures"] == refused


def test_bad_requests_are_4xx_with_a_message_and_the_key_is_required(server):
    chat = f"{server}/v1/chat/completions"
    ok = {"model": "tiny_judge", "messages": [{"role": "user", "content": "Thanks!"}], "max_tokens": 4}
    cases = {
        "malformed": (post(chat, b"{not json"), 400, "malformed JSON"),
        "model": (post(chat, {**ok, "model": "gpt-4o"}), 404, "serves only 'tiny_judge'"),
        "context": (post(chat, {**ok, "messages": [{"role": "user", "content": "word " * 2000}]}), 400,
                    "exceed the context length"),
        "parameter": (post(chat, {**ok, "logit_bias": {"1": 5}}), 400, "unsupported parameter(s) ['logit_bias']"),
        "stop": (post(chat, {**ok, "stop": ["\n"]}), 400, "stop sequences are not supported"),
        "value": (post(chat, {**ok, "temperature": -1}), 400, "temperature=-1"),
        "messages": (post(chat, {**ok, "messages": "hi"}), 400, "messages:"),
        "no key": (post(chat, ok, key=None), 401, "API key"),
        "wrong key": (post(chat, ok, key="guess"), 401, "API key"),
        "completions prompt": (post(f"{server}/v1/completions", {"model": "tiny_judge", "prompt": 3}), 400, "prompt:"),
    }
    for name, ((status, body), want_status, want_text) in cases.items():
        assert status == want_status and want_text in body["error"]["message"], (name, status, body)
    status, body = post(chat, ok)
    assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")
    assert body["usage"]["completion_tokens"] <= 4
    status, two = post(chat, {**ok, "n": 2})  # greedy: two equal choices of the same prompt
    assert status == 200 and [c["index"] for c in two["choices"]] == [0, 1]
    assert {c["message"]["content"] for c in two["choices"]} == {body["choices"][0]["message"]["content"]}
    models = urllib.request.Request(f"{server}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert json.loads(urllib.request.urlopen(models, timeout=30).read())["data"][0]["id"] == "tiny_judge"


def test_the_server_reports_the_weights_behind_its_model_name_and_the_hash_holds_them(server):
    """Issue 38 S1: GET /v1/models names the served weights (spec.weights_identity of the checkpoint), and a served
    judge's hash and record hold that identity, so tiny_judge_hack served under the same name is another judge."""
    from rubric_jax.judges.spec import weights_identity

    models = urllib.request.Request(f"{server}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    (model,) = json.loads(urllib.request.urlopen(models, timeout=30).read())["data"]
    assert model["weights_identity"] == weights_identity(TINY_JUDGE) != weights_identity(f"{TINY_JUDGE}_hack")
    spec = http_spec(server)
    assert describe(spec)["served_identity"] == model["weights_identity"]
    assert load_judges(spec)[0].backend.client.identity == model["weights_identity"]


def test_concurrent_requests_are_each_answered_once_and_batched(server):
    """40 requests from 4 threads at once (benchmarks/bench_serve.py has the load figures): each answer is that
    prompt's one-at-a-time answer, each id is unique, and the server's generate calls held more than one prompt."""
    questions = [f"Request {i}: {'thank you' if i % 3 else 'the box is late'}." for i in range(40)]
    bodies = [{"model": "tiny_judge", "messages": [{"role": "user", "content": q}], "max_tokens": 6}
              for q in questions]
    chat = f"{server}/v1/chat/completions"
    alone = {q: post(chat, b)[1]["choices"][0]["message"]["content"] for q, b in list(zip(questions, bodies))[:3]}
    before = counters(server)
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda b: post(chat, b), bodies))
    after = counters(server)
    assert all(status == 200 for status, _ in replies)
    assert len({body["id"] for _, body in replies}) == 40
    assert [body["choices"][0]["message"]["content"] for _, body in replies[:3]] == [alone[q] for q in questions[:3]]
    calls, prompts = after["generate_calls"] - before["generate_calls"], after["prompts"] - before["prompts"]
    assert prompts == 40 and calls < 40  # mean batch > 1


def test_an_endpoint_that_does_not_answer_at_start_up_is_one_line_naming_it(tmp_path, command_server):
    port = free_port()  # nothing listens there
    responses = tmp_path / "in.jsonl"
    responses.write_text(json.dumps({"question": "q", "response": "Thanks!"}) + "\n")
    proc = command_server("experiments.score").run(
        "--rubric=rubric_jax/assets/tiny/rubric_hack.yaml", f"--responses={responses}",
        f"--out={tmp_path / 'out.jsonl'}", "--judge=configs/judges/tiny.py", "--judge.backend=openai",
        f"--judge.base_url=http://127.0.0.1:{port}/v1", "--judge.model=tiny_judge", "--judge.timeout_s=5")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"experiments.score: error: judge endpoint http://127.0.0.1:{port}/v1 does not answer")
    assert "Traceback" not in proc.stderr and not (tmp_path / "out.jsonl").exists()


def test_an_endpoint_failing_mid_run_gives_missing_scores_with_their_cause():
    """The endpoint answered at start-up and is gone now, with outage_s=0 (no waiting it out,
    tests/judges/test_judge_outage.py): after its HTTP retries every score is missing with cause judge_http_error,
    counted, and no sample is re-prompted."""
    spec = tiny_spec(backend="openai", base_url=f"http://127.0.0.1:{free_port()}/v1", model="m",
                     max_retries_http=1, timeout_s=2.0, max_retries=2, outage_s=0)
    client = http_backend.HttpJudgeClient(spec)
    judge = Judge("gone", None, HttpBackend(client), sampler=spec.sampler, max_new_tokens=8)
    questions, responses, dims = politeness_rows(3)
    out = judge_rows([judge], spec, questions, responses, dims, jax.random.key(0))
    assert all(np.isnan(s).all() for s in out.scores) and out.causes == [["judge_http_error"]] * 3
    d = out.details
    assert d["judge_http_failures"] == d["judge_http_requests"] == 3 and d["judge_http_retries"] == 3
    assert d["judge_retried"] == 0 and d["judge_failed_scores"] == 3 and "APIConnectionError" in \
        d["judge_http_error_examples"][0]


def test_endpoint_fields_enter_the_hash_and_the_key_is_never_recorded(monkeypatch):
    """(Hashing a served judge asks its endpoint which model it serves: two scripted endpoints, no identity.)"""
    from openai_double import MODEL, Endpoint

    endpoints = [Endpoint().up(), Endpoint().up()]
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv("OTHER", KEY)
    try:
        base = dataclasses.replace(http_spec(endpoints[0].url.removesuffix("/v1")), model=MODEL)
        same = [dataclasses.replace(base, **{f: v}) for f, v in (
            ("api_key_env", "OTHER"), ("max_concurrency", 2), ("timeout_s", 5.0), ("max_retries_http", 0),
            ("requests_per_minute", 60), ("tokens_per_minute", 1000))]
        assert {judge_hash(s) for s in same} == {judge_hash(base)}
        changed = [dataclasses.replace(base, **{f: v}) for f, v in (
            ("base_url", endpoints[1].url), ("endpoint", "completions"))] + [tiny_spec()]
        assert judge_hash(base) not in {judge_hash(s) for s in changed}
        assert KEY not in json.dumps(describe(base)) and describe(base)["spec"]["api_key_env"] == KEY_ENV
    finally:
        for endpoint in endpoints:
            endpoint.down()
    assert judge_hash(tiny_spec()) == judge_hash(dataclasses.replace(tiny_spec(), max_concurrency=3))


@pytest.mark.parametrize("field, value, why", [
    ("base_url", "127.0.0.1:8000", "expected the endpoint's http(s) URL"),
    ("model", "", "expected the served model's name"),
    ("api_key_env", "sk-abc", "expected the NAME of an environment variable"),
    ("endpoint", "responses", "expected one of ('chat', 'completions')"),
    ("timeout_s", 0, "expected a number of seconds > 0"),
    ("max_concurrency", 0, "expected an integer >= 1"),
])
def test_bad_endpoint_fields_name_the_field(field, value, why):
    good = {"backend": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "m"}
    block = {**tiny_judge_config.get_config().to_dict(), **good, field: value}
    with pytest.raises(ValueError, match=rf"--judge\.{field}=.*{__import__('re').escape(why)}"):
        JudgeSpec.from_config(block, "--judge")
    with pytest.raises(ValueError, match=r"config\.judge\.base_url=.*read only with backend=openai"):
        JudgeSpec.from_config({**tiny_judge_config.get_config().to_dict(), "base_url": "http://x"}, "config.judge")


def test_token_buckets_hold_requests_and_tokens_to_their_per_minute_rates():
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    bucket = http_backend.TokenBucket(60, clock=lambda: now[0], sleep=sleep)  # one a second, 60 banked
    for _ in range(60):
        bucket.take(1)
    assert slept == []
    bucket.take(3)
    assert sum(slept) == pytest.approx(3.0)
    bucket.refund(2)  # the server's usage said 2 fewer than charged
    slept.clear()
    bucket.take(2)
    assert slept == []
    assert http_backend.request_options("greedy", 5)["temperature"] == 0.0
    assert http_backend.request_options("nucleus(0.9, 0.5)", 5) == {
        "max_tokens": 5, "n": 1, "temperature": 0.5, "top_p": 0.9}


def test_a_served_judge_holds_no_weights_in_the_runs_memory_plan():
    """The dry run's memory plan counts an in-process judge's weights and none for an endpoint (whose local
    checkpoint is only its tokenizer)."""
    from configs import tiny
    from rubric_jax import aot, config_boundary

    config = tiny.get_config()
    assert [name for name, _ in aot.judge_configs(config_boundary.experiment(config).judge, aot.CPU)] == ["tiny_judge"]
    config.judge.backend, config.judge.base_url, config.judge.model = "openai", "http://127.0.0.1:1/v1", "tiny_judge"
    assert aot.judge_configs(config_boundary.experiment(config).judge, aot.CPU) == []


def test_the_batcher_cuts_each_row_to_its_own_max_tokens_and_warms_every_batch_bucket():
    """A stub generate answers every row with tokens 5, 6, 7, 8 then eos: a job asking 2 tokens gets 2 and finish
    "length", one asking 8 gets the 4 and eos ("stop", eos not in the text); the warm-up runs every batch bucket."""
    from rubric_jax import sampling
    from rubric_jax.judges.server import Batcher, Job
    from rubric_jax.models.checkpoint import load_tokenizer

    tokenizer = load_tokenizer(TINY_JUDGE)
    eos, calls = tokenizer.eos_token_id, []

    def generate(weights, prompts, *, n, max_new_tokens, **kwargs):
        calls.append((len(prompts), max_new_tokens))
        rows = len(prompts) * n
        tokens = np.full((rows, max_new_tokens), tokenizer.pad_token_id)
        answer = [5, 6, 7, 8, eos][:max_new_tokens]
        tokens[:, :len(answer)] = answer
        stopped = len(answer) == 5
        return sampling.GenerationResult(tokens, np.zeros(tokens.shape), np.full(rows, len(answer)),
                                         np.full(rows, "stop" if stopped else "length"), len(answer))

    judge = Judge("stub", tokenizer, SamplerBackend(None, generate), sampler="greedy")
    batcher = Batcher(judge, max_batch=6)
    short, long = batcher._generate([Job([1, 2], 2, "greedy", 1), Job([3], 8, "greedy", 1)], "greedy", 1,
                                    jax.random.key(0))
    assert calls == [(2, 8)]
    assert short[0].finish == "length" and short[0].tokens == 2 and short[0].text == tokenizer.decode([5, 6])
    assert long[0].finish == "stop" and long[0].tokens == 5 and long[0].text == tokenizer.decode([5, 6, 7, 8])
    calls.clear()
    assert batcher.warm_up(3, 4) == [1, 2, 3, 4, 6] and calls == [(b, 4) for b in (1, 2, 3, 4, 6)]
