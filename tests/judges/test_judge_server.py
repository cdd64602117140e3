"""The judge server's app in process (rubric_jax/judges/server.py), driven through ASGI by hand with a stub generate,
so that a client can disconnect mid-body or mid-wait and a body can stream in chunks: body limits, parsing off the
event loop, disconnected clients' work dropped, hostile JSON, the API key's checks. tests/judges/test_judge_http.py
runs the real server (experiments.serve) over HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
import types
from collections.abc import Sequence

import numpy as np
import pytest

from rubric_jax import sampling
from rubric_jax.judges import server
from rubric_jax.judges.backends import SamplerBackend
from rubric_jax.judges.llm_judge import Judge
from rubric_jax.models.checkpoint import load_tokenizer
from tests.judges.test_judge_http import TINY_JUDGE

KEY = "serve-key-2718"
ANSWER = [5, 6, 7]  # every row's stub answer, then eos


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY_JUDGE)


class StubModel:
    """A judge's generate_fn that records each call's prompts and answers ANSWER + eos; `hold` (when set) keeps a
    call waiting until it is released, as a long batch on the devices would."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls, self.hold = tokenizer, [], None
        self.entered = threading.Event()

    def __call__(self, weights, prompts, *, n, max_new_tokens, **kwargs):
        self.calls.append([list(p) for p in prompts])
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(60), "the test never released the held generate call"
        answer = (ANSWER + [self.tokenizer.eos_token_id])[:max_new_tokens]
        tokens = np.full((len(prompts) * n, max_new_tokens), self.tokenizer.pad_token_id)
        tokens[:, :len(answer)] = answer
        return sampling.GenerationResult(tokens, None, np.full(len(tokens), len(answer)),
                                         np.full(len(tokens), sampling.FINISH_STOP), len(answer))


def stub_app(tokenizer, stub=None, **settings):
    """The server's app over the stub model (a 512-token context, as the tiny judge's), served as "tj"."""
    weights = types.SimpleNamespace(cfg=types.SimpleNamespace(max_position_embeddings=512))
    judge = Judge("stub", tokenizer, SamplerBackend(weights, stub or StubModel(tokenizer)), sampler="greedy")
    return server.make_app(judge, "tj", window_s=0.0, **settings)


def chat_body(content: str = "Thanks!", **fields) -> bytes:
    return json.dumps({"model": "tj", "messages": [{"role": "user", "content": content}], "max_tokens": 8,
                       **fields}).encode()


class Client:
    """One ASGI request: the body in `chunks` (`complete`: the last one ends it), then the client stays (its receive
    waits) until `leave` is set, when it disconnects; `received` counts the body chunks the app read."""

    def __init__(self, chunks: Sequence[bytes] = (b"",), headers: Sequence[tuple[str, str]] = (),
                 key: str | None = KEY, complete: bool = True):
        self.chunks, self.complete, self.received, self.leave = list(chunks), complete, 0, asyncio.Event()
        self.headers = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers]
        if key is not None:
            self.headers.append((b"authorization", f"Bearer {key}".encode()))
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        if self.received < len(self.chunks):
            self.received += 1
            return {"type": "http.request", "body": self.chunks[self.received - 1],
                    "more_body": self.received < len(self.chunks) or not self.complete}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    async def request(self, app, method: str, path: str) -> tuple[int, dict | None]:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
                 "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": self.headers, "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
        await app(scope, self.receive, self.send)
        body = b"".join(m.get("body", b"") for m in self.sent[1:])
        return self.sent[0]["status"], json.loads(body) if body else None


async def post(app, body: bytes, **client) -> tuple[int, dict | None]:
    return await Client([body], **client).request(app, "POST", "/v1/chat/completions")


async def health(app, key: str | None = KEY) -> dict:
    return (await Client(key=key).request(app, "GET", "/health"))[1]


async def until(condition, what: str) -> None:
    """Waits (yielding to the event loop) until `condition()` holds; fails after 60 s, naming `what`."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_a_body_over_the_limit_is_413_before_it_is_read_whole(tokenizer):
    """Declared too long: refused before a byte is read. Streamed without a length: refused at the chunk that
    crosses the limit, the rest never read. Within the limit it is answered."""
    app = stub_app(tokenizer, max_body_bytes=4096)

    async def main():
        declared = Client([b"x" * 5000], headers=[("content-length", "5000")])
        status, body = await declared.request(app, "POST", "/v1/chat/completions")
        assert status == 413 and body["error"]["code"] == "request_too_large" and declared.received == 0
        streamed = Client([chat_body()[:-1]] + [b" " * 1024] * 100 + [b"}"])
        status, body = await streamed.request(app, "POST", "/v1/chat/completions")
        assert status == 413 and "limit of 4096 bytes" in body["error"]["message"] and streamed.received == 5
        status, body = await post(app, chat_body())
        assert status == 200 and body["choices"][0]["message"]["content"] == tokenizer.decode(ANSWER)
        assert (await health(app))["refused"] == 2

    asyncio.run(main())


class HeldTokenizer:
    """The tiny judge's tokenizer, whose chat template waits for `release` (a huge prompt's tokenising): records
    whether the test released it, which it does only after /health answered."""

    def __init__(self, tokenizer):
        self.tokenizer, self.entered, self.release, self.released = tokenizer, threading.Event(), threading.Event(), []

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        self.entered.set()
        self.released.append(self.release.wait(30))
        return self.tokenizer.apply_chat_template(*args, **kwargs)


def test_parsing_and_tokenising_run_off_the_event_loop(tokenizer):
    """While a request's prompt is being tokenised, /health (and every other route) is answered."""
    held = HeldTokenizer(tokenizer)
    app = stub_app(held)

    async def main():
        slow = asyncio.ensure_future(post(app, chat_body("word " * 50)))
        await until(held.entered.is_set, "the request reached the tokenizer")
        assert (await health(app))["requests"] == 0
        held.release.set()
        assert (await slow)[0] == 200 and held.released == [True]

    asyncio.run(main())


def test_a_disconnected_clients_queued_job_is_dropped_before_it_is_batched(tokenizer):
    """Request A holds the devices; B and C queue behind it and their clients leave; D queues. When A's batch ends,
    only D is generated: B's and C's prompts never reach the model, counted as cancelled and disconnected."""
    stub = StubModel(tokenizer)
    stub.hold = threading.Event()
    app = stub_app(tokenizer, stub)

    async def main():
        first = asyncio.ensure_future(post(app, chat_body("A")))
        await until(stub.entered.is_set, "A's generate call started")
        leaving = [Client([chat_body(q)]) for q in "BC"]
        waits = [asyncio.ensure_future(c.request(app, "POST", "/v1/chat/completions")) for c in leaving]
        await until_health(app, lambda h: h["queued"] == 2, "B and C queued")
        for client in leaving:
            client.leave.set()
        await asyncio.gather(*waits)
        last = asyncio.ensure_future(post(app, chat_body("D")))
        await until_health(app, lambda h: h["queued"] == 3, "D queued")
        stub.hold.set()
        assert (await asyncio.wait_for(first, 60))[0] == (await asyncio.wait_for(last, 60))[0] == 200
        return await health(app)

    after = asyncio.run(main())
    prompts = [tokenizer.decode(p[0]) for p in stub.calls]
    assert len(stub.calls) == 2 and "A" in prompts[0] and "D" in prompts[1], prompts
    assert after["cancelled"] == 2 and after["disconnected"] == 2 and after["requests"] == 4


async def until_health(app, condition, what: str) -> None:
    """Polls /health until `condition` holds of its answer (at most 60 s)."""
    for _ in range(6000):
        if condition(await health(app)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_hostile_json_and_half_sent_bodies_are_answered_quietly(tokenizer, caplog):
    """JSON nested 100,000 deep is a 400 (not a RecursionError's 500); a client that leaves mid-body is counted,
    with no traceback; a temperature positive in float64 but 0 in float32, or a number no float holds, is a 400
    naming it; a Content-Length of 5,000 digits is a 413 and a non-decimal one is ignored (the body is read)."""
    app = stub_app(tokenizer)

    async def main():
        status, body = await post(app, b"[" * 100_000 + b"]" * 100_000)
        assert status == 400 and body["error"]["message"] == "malformed JSON body: nested too deeply"
        deep = b'{"model": "tj", "user": ' + b"{\"a\": " * 50_000 + b"1" + b"}" * 50_000 + b"}"
        status, body = await post(app, deep)
        assert status == 400 and "nested too deeply" in body["error"]["message"]
        half = Client([chat_body()[:20], chat_body()[20:40]], complete=False)  # then the client leaves
        half.leave.set()
        assert (await half.request(app, "POST", "/v1/chat/completions"))[0] == 400  # to nobody
        status, body = await post(app, chat_body(temperature=1e-300))
        assert status == 400 and body["error"]["message"].startswith("temperature=1e-300: expected 0 (greedy) or")
        status, body = await post(app, chat_body()[:-1] + b', "top_p": 1' + b"0" * 400 + b"}")  # no float holds it
        assert status == 400 and body["error"]["message"].startswith("top_p=1000"), body
        for length in ("1" + "0" * 5000, "\u00b2"):  # an int() of 5,000 digits raises; "²" is a digit, not decimal
            status, body = await post(app, chat_body(), headers=[("content-length", length)])
            assert status == (413 if length[0] == "1" else 200), (length[:9], body)
        return await health(app)

    after = asyncio.run(main())
    assert after["refused"] == 5 and after["disconnected"] == 1 and after["requests"] == 1
    assert "Traceback" not in caplog.text


def test_the_api_key_scheme_is_any_case_and_health_shows_counters_only_with_the_key(tokenizer, monkeypatch):
    """`bearer`, `BEARER` and `Bearer` all carry the key (RFC 9110: the scheme is case-insensitive), compared with
    hmac.compare_digest; a wrong key or scheme is 401. /health is liveness for anyone and its counters need the key."""
    app = stub_app(tokenizer, api_key=KEY)
    compared = []
    monkeypatch.setattr(server.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or a == b)

    async def main():
        for header, want in [(f"bearer {KEY}", 200), (f"BEARER  {KEY}", 200), (f"Bearer {KEY}", 200),
                             (f"Bearer {KEY}x", 401), (f"Basic {KEY}", 401), (KEY, 401), ("", 401)]:
            client = Client([chat_body()], headers=[("authorization", header)], key=None)
            status, _ = await client.request(app, "POST", "/v1/chat/completions")
            assert status == want, header
        assert await health(app, key=None) == {"status": "ok"}
        assert await health(app, key="guess") == {"status": "ok"}
        return await health(app)

    counters = asyncio.run(main())
    assert counters["requests"] == 3 and counters["refused"] == 4 and counters["model"] == "tj"
    assert (KEY.encode(), KEY.encode()) in compared and (f"{KEY}x".encode(), KEY.encode()) in compared


def test_top_k_is_one_of_a_few_values_and_n_decodes_at_its_bucket(tokenizer):
    """Each top_k and each n compiled a program of its own (top_k up to 2**20, n up to 16): a client could keep the
    devices compiling. top_k is one of server.TOP_K_CHOICES (or off); n is decoded at its bucket and cut, so the 16
    values of n take 8 programs, and each answer has exactly n choices."""
    stub = StubModel(tokenizer)
    decoded_n = []
    app = stub_app(tokenizer, stub=lambda *args, n, **kwargs: decoded_n.append(n) or stub(*args, n=n, **kwargs))

    async def main():
        for top_k in (7, 41, 1 << 20, 101):
            status, body = await post(app, chat_body(temperature=0.5, top_k=top_k))
            assert status == 400 and f"top_k={top_k}: expected one of [1, 5, 10, 20, 40, 50, 100]" in (
                body["error"]["message"]), body
        for top_k in (0, -1, 40):
            assert (await post(app, chat_body(temperature=0.5, top_k=top_k)))[0] == 200
        before = (await health(app))["programs"]
        for n in range(1, server.MAX_N + 1):
            status, body = await post(app, chat_body(n=n))
            assert status == 200 and len(body["choices"]) == n
        return (await health(app))["programs"] - before

    assert asyncio.run(main()) == 8
    assert sorted(set(decoded_n)) == [1, 2, 3, 4, 6, 8, 12, 16]


def test_the_server_compiles_at_most_max_programs_and_refuses_a_request_needing_another(tokenizer):
    """Past `max_programs` program keys (sampler kind and top_k, n, max_tokens and prompt buckets) a request needing
    a new one is a 400 naming the limit, before any work; requests of the admitted keys, any temperature, go on."""
    stub = StubModel(tokenizer)
    app = stub_app(tokenizer, stub=stub, max_programs=2)

    async def main():
        assert (await post(app, chat_body()))[0] == 200  # greedy
        assert (await post(app, chat_body(temperature=0.5)))[0] == 200  # temperature: the second key
        calls = len(stub.calls)
        for fields in ({"temperature": 0.5, "top_k": 40}, {"n": 2}, {"max_tokens": 100}, {"content": "x " * 100}):
            status, body = await post(app, chat_body(**fields))
            assert status == 400 and body["error"]["code"] == "too_many_programs", fields
            assert "at most 2 generate programs" in body["error"]["message"]
        assert len(stub.calls) == calls  # refused before any work
        for temperature in (0.5000001, 1.7, 0):
            assert (await post(app, chat_body(temperature=temperature)))[0] == 200
        return await health(app)

    counters = asyncio.run(main())
    assert counters["programs"] == 2 and counters["refused"] == 4
