"""An OpenAI-compatible server over rubric_jax's own sampler, so one loaded judge can answer many clients
(every run of a sweep, score, calibrate, evaluate) through the `openai` judge backend (judges/http_backend.py).

Routes: POST /v1/chat/completions (messages rendered by the model's chat template), POST /v1/completions (a raw
prompt), GET /v1/models, GET /health (also the batch counters). The model is a `llm_judge.Judge` (weights in
the judge's decode layout); requests are decoded exactly as the in-process judge decodes its prompts (stop at
eos, special tokens dropped), so a greedy answer is the in-process one. Requests arriving within
`window_s` of the first waiting one are answered by one `sampling.generate` call per (sampler, n bucket) group, up to
`max_batch` prompts, on one worker thread (the devices run one program at a time anyway); every call's batch
size is logged. Bad requests are a 4xx JSON error {"error": {"message", "type", "code"}}: malformed or too deeply
nested JSON, a body over `max_body_bytes` (413, refused while it streams in), an unknown model (404), a prompt over the
context, an unsupported parameter or value; with an API key, a request without `Authorization: Bearer <key>` (the
scheme in any case, the key compared in constant time) is 401, and /health answers only {"status": "ok"}.

A shared service: bodies are parsed and tokenised on one parser thread, never on the event loop, so /health and
other requests are answered meanwhile. A client that disconnects (mid-body or while waiting) is counted in
/health's `disconnected`; its queued job is dropped before it is batched (`cancelled`), while a job already in a
running generate call finishes with its batch (a device program cannot be interrupted) and its answer is discarded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import json
import logging
import queue
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rubric_jax import data, padding, sampler_names, sampling
from rubric_jax.judges.llm_judge import Judge
from rubric_jax.judges.spec import weights_identity

log = logging.getLogger("rubric_jax.serve")
MAX_N = 16  # most choices per request; n is decoded at padding.bucket_size(n) (1, 2, 3, 4, 6, 8, 12, 16), the rest cut
# The top_k values served: each compiles a sampling program of its own (temperature and top_p are runtime data).
TOP_K_CHOICES = (1, 5, 10, 20, 40, 50, 100)
# Most compiled program families (ProgramKey) the server admits: past it, a request needing another is refused, so
# no client can keep the devices compiling; each family may compile once per batch bucket too (max_batch bounds them).
MAX_PROGRAMS = 32
# Largest request body by default (bytes): a 32k-token prompt is ~130 KB of English, ~300 KB of \u-escaped Chinese.
MAX_BODY_BYTES = 2 << 20
# Request fields the server reads; `user` is accepted and ignored (an opaque end-user id in the OpenAI API).
_COMMON_FIELDS = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n", "stop",
                  "stream", "user"}
_FIELDS = {"chat": _COMMON_FIELDS | {"messages"}, "completions": _COMMON_FIELDS | {"prompt"}}


class RequestError(Exception):
    """A request the server refuses: HTTP `status` and a one-line message naming the field."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request"):
        super().__init__(message)
        self.status, self.code = status, code


@dataclasses.dataclass(frozen=True)
class Job:
    """One validated request: its prompt's token ids and how to sample it."""

    prompt_ids: list[int]
    max_tokens: int
    sampler: str
    n: int


@dataclasses.dataclass(frozen=True)
class ProgramKey:
    """What of a job selects its compiled generate program: the sampler kind and top_k, and the buckets of n, of
    max_tokens (the response cache) and of the prompt length. A batch's program is one of its jobs' keys (its
    buckets are the largest of its jobs'), so the keys admitted bound the programs compiled."""

    kind: str
    top_k: int
    n: int
    max_tokens: int
    prompt: int

    @classmethod
    def of(cls, job: Job) -> ProgramKey:
        parsed = sampling.parse_sampler(job.sampler)
        return cls(parsed.kind, parsed.top_k, padding.bucket_size(job.n), padding.bucket_size(job.max_tokens),
                   padding.bucket_size(len(job.prompt_ids)))


@dataclasses.dataclass(frozen=True)
class Choice:
    text: str
    finish: str
    tokens: int


class Batcher:
    """Runs Jobs on `judge` in batches: a worker thread takes the first waiting job, waits `window_s` for more
    (at most `max_batch` prompts), and answers each (sampler, n bucket) group with one generate call. It admits
    jobs of at most `max_programs` ProgramKeys (`submit` refuses a job of another once they are taken)."""

    def __init__(self, judge: Judge, *, window_s: float = 0.02, max_batch: int = 64, seed: int = 0,
                 max_programs: int = MAX_PROGRAMS):
        self.judge, self.window_s, self.max_batch, self.max_programs = judge, window_s, max_batch, max_programs
        self.programs: set[ProgramKey] = set()  # the program keys admitted so far
        self.key = jax.random.key(seed)
        self.jobs: queue.Queue[tuple[Job, Future]] = queue.Queue()
        self.batch_sizes: list[int] = []  # prompts per generate call, in call order
        self.cancelled = 0  # jobs dropped before they were batched: their clients had gone
        self.lock = threading.Lock()
        threading.Thread(target=self._loop, name="serve-batcher", daemon=True).start()

    def warm_up(self, prompt_tokens: int, max_tokens: int) -> list[int]:
        """Compiles the greedy generate of every batch bucket up to max_batch (padding.bucket_size) for prompts of
        `prompt_tokens` tokens, so the first batches of that size do not stall on a compile; the buckets."""
        sizes = sorted({padding.bucket_size(b) for b in range(1, self.max_batch + 1)})
        eos = self.judge.tokenizer.eos_token_id
        job = Job([eos] * prompt_tokens, max_tokens, "greedy", 1)
        self.admit(job)
        for size in sizes:
            start = time.perf_counter()
            self._generate([job] * size, "greedy", 1, self.key)
            log.info("warm-up: batch bucket %d compiled in %.1f s", size, time.perf_counter() - start)
        return sizes

    def admit(self, job: Job) -> None:
        """Records the job's ProgramKey; a RequestError when it is new and `max_programs` keys are taken."""
        key = ProgramKey.of(job)
        with self.lock:
            if key not in self.programs and len(self.programs) >= self.max_programs:
                raise RequestError(
                    f"this server compiles at most {self.max_programs} generate programs and all are taken; a request "
                    f"needing another (sampler {key.kind}, top_k {key.top_k}, n bucket {key.n}, max_tokens bucket "
                    f"{key.max_tokens}, prompt bucket {key.prompt}) is refused: send the sampler, n and max_tokens of "
                    "earlier requests", code="too_many_programs")
            self.programs.add(key)

    def submit(self, job: Job) -> Future:
        """The future of the job's choices, once admitted (RequestError: a program key past `max_programs`)."""
        self.admit(job)
        future: Future = Future()
        self.jobs.put((job, future))
        return future

    def stats(self) -> dict[str, Any]:
        with self.lock:
            sizes = list(self.batch_sizes)
            cancelled = self.cancelled
        return {"generate_calls": len(sizes), "prompts": int(sum(sizes)),
                "mean_batch": float(np.mean(sizes)) if sizes else 0.0, "max_batch": max(sizes, default=0),
                "traces": sum(sampling.TRACES.values()),  # a new batch or length bucket compiles (seconds)
                "queued": self.jobs.qsize(), "cancelled": cancelled, "programs": len(self.programs)}

    def _collect(self) -> list[tuple[Job, Future]]:
        batch = [self.jobs.get()]
        deadline = time.monotonic() + self.window_s
        while len(batch) < self.max_batch:
            left = deadline - time.monotonic()
            try:
                batch.append(self.jobs.get(timeout=left) if left > 0 else self.jobs.get_nowait())
            except queue.Empty:
                break
        return batch

    def _loop(self) -> None:
        calls = 0
        while True:
            batch = self._collect()
            groups: dict[tuple[str, int], list[tuple[Job, Future]]] = {}
            for job, future in batch:
                groups.setdefault((job.sampler, padding.bucket_size(job.n)), []).append((job, future))
            for (sampler, n), group in groups.items():
                group = self._live(group)
                if not group:
                    continue
                calls += 1
                start = time.perf_counter()
                try:
                    choices = self._generate([job for job, _ in group], sampler, n, jax.random.fold_in(self.key, calls))
                except Exception as e:  # the worker must outlive one failed call; the requests get a 500
                    log.exception("generate failed")
                    for _, future in group:
                        future.set_exception(e)
                    continue
                with self.lock:
                    self.batch_sizes.append(len(group))
                log.info("generate call %d: batch %d (n=%d, %s) in %.3f s, %d traces so far", calls, len(group), n,
                         sampler, time.perf_counter() - start, sum(sampling.TRACES.values()))
                for (_, future), mine in zip(group, choices):
                    future.set_result(mine)

    def _live(self, group: list[tuple[Job, Future]]) -> list[tuple[Job, Future]]:
        """The jobs of `group` whose futures were not cancelled (a client gone), now marked running (no longer
        cancellable); the cancelled ones are counted and dropped."""
        live = [(job, future) for job, future in group if future.set_running_or_notify_cancel()]
        with self.lock:
            self.cancelled += len(group) - len(live)
        return live

    def _generate(self, jobs: Sequence[Job], sampler: str, n: int, key: jax.Array) -> list[list[Choice]]:
        """Each job's job.n choices: one generate call of `n` (its n bucket) samples per prompt, up to the group's largest
        max_tokens, each row cut to its own (a greedy answer of m tokens is the first m tokens of a longer one; the
        samples are independent, so the first job.n of n are job.n samples)."""
        judge, backend = self.judge, self.judge.backend
        eos = judge.tokenizer.eos_token_id
        result = backend.generate_fn(backend.weights, [job.prompt_ids for job in jobs], key=key, n=n,
                                     max_new_tokens=max(job.max_tokens for job in jobs), sampler=sampler,
                                     stop_tokens=[eos], pad_id=judge.tokenizer.pad_token_id, layout=backend.layout)
        tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
        finishes = np.asarray(result.finish_reason)
        out = []
        for j, job in enumerate(jobs):
            choices = []
            for row in range(j * n, j * n + job.n):
                length, finish = int(lengths[row]), str(finishes[row])
                if length > job.max_tokens:
                    length, finish = job.max_tokens, sampling.FINISH_LENGTH
                ids = [int(t) for t in tokens[row, :length]]
                text = judge.tokenizer.decode(ids[:-1] if ids and ids[-1] == eos else ids, skip_special_tokens=True)
                choices.append(Choice(text, finish, length))
            out.append(choices)
        return out


# ------------------------------------------------------------------------------------------ request parsing
def _integer(body: Mapping[str, Any], field: str, default: int, low: int, high: int) -> int:
    value = body.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{field}={value!r}: expected an integer in [{low}, {high}]")
    return value


def _number(body: Mapping[str, Any], field: str) -> float | None:
    """The field's value, a finite number (a JSON integer of 400 digits is not: no float holds it) or None."""
    value = body.get(field)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                              not abs(value) <= sys.float_info.max):
        raise RequestError(f"{field}={value!r}: expected a number")
    return value


def sampler_of(body: Mapping[str, Any]) -> str:
    """The sampler string of a request's temperature (0 or absent: greedy), top_p and top_k; a temperature is 0 or
    one `sampling.parse_sampler` takes (finite and not 0 in float32, at least sampler_names.MIN_TEMPERATURE)."""
    temperature, top_p = _number(body, "temperature"), _number(body, "top_p")
    top_k = 0 if body.get("top_k") is None else body["top_k"]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k not in (0, -1, *TOP_K_CHOICES):
        raise RequestError(f"top_k={top_k!r}: expected one of {list(TOP_K_CHOICES)}, or 0 or -1 (off): each top_k "
                           "compiles a sampling program of its own")
    if temperature and not sampler_names.MIN_TEMPERATURE <= temperature <= sampler_names.MAX_TEMPERATURE:
        raise RequestError(f"temperature={temperature!r}: expected 0 (greedy) or a number in "
                           f"[{sampler_names.MIN_TEMPERATURE}, {sampler_names.MAX_TEMPERATURE:.4g}]")
    if top_p is not None and not 0 < top_p <= 1:
        raise RequestError(f"top_p={top_p!r}: expected a number in (0, 1]")
    if not temperature:
        return "greedy"
    if top_k > 0 and top_p not in (None, 1):
        raise RequestError("top_k and top_p together are not supported: give one")
    if top_k > 0:
        return f"topk({top_k}, {temperature})"
    if top_p not in (None, 1):
        return f"nucleus({top_p}, {temperature})"
    return f"temperature({temperature})"


def parse_request(raw: bytes, kind: str, judge: Judge, model_name: str, default_max_tokens: int) -> Job:
    """The Job of a /v1/chat/completions (`kind` "chat") or /v1/completions ("completions") body; RequestError
    (4xx) naming the field otherwise."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"malformed JSON body: {e}") from None
    except RecursionError:
        raise RequestError("malformed JSON body: nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS[kind])
    if unknown:
        raise RequestError(f"unsupported parameter(s) {unknown}; this server reads {sorted(_FIELDS[kind])}",
                           code="unsupported_parameter")
    if body.get("model") != model_name:
        raise RequestError(f"model={body.get('model')!r}: this server serves only {model_name!r}", 404,
                           "model_not_found")
    if body.get("stream"):
        raise RequestError("stream=true is not supported: answers come whole", code="unsupported_parameter")
    if body.get("stop"):
        raise RequestError("stop sequences are not supported: answers stop at the model's end-of-sequence token",
                           code="unsupported_parameter")
    context = judge.backend.weights.cfg.max_position_embeddings
    max_tokens = _integer(body, "max_tokens", _integer(body, "max_completion_tokens", default_max_tokens, 1, context),
                          1, context)
    n = _integer(body, "n", 1, 1, MAX_N)
    sampler = sampler_of(body)
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise RequestError("messages: expected a non-empty list of {role, content} objects with string values")
        (ids,) = data.encode_chats(judge.tokenizer, [[{"role": m["role"], "content": m["content"]}
                                                      for m in messages]])
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("prompt: expected a non-empty string (one prompt per request)")
        ids = list(judge.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    if len(ids) + max_tokens > context:
        raise RequestError(f"the prompt's {len(ids)} tokens + max_tokens={max_tokens} exceed the context length "
                           f"of {context} tokens (this model's maximum context length)", code="context_length_exceeded")
    return Job(ids, max_tokens, sampler, n)


# ------------------------------------------------------------------------------------------ the ASGI app
def authorized(header: str, api_key: str) -> bool:
    """Whether an Authorization header carries `api_key` (no key: every request): scheme "Bearer" in any case (RFC
    9110), the key compared in constant time (a timing side channel would leak it byte by byte)."""
    if not api_key:
        return True
    scheme, _, token = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("latin-1"), api_key.encode())


async def read_body(request: Any, limit: int) -> bytes:
    """The request's body, refused (413) as soon as its declared length or the bytes received exceed `limit`, so a
    huge body is never held whole; starlette's ClientDisconnect when the client leaves mid-body."""
    declared = request.headers.get("content-length", "")
    if declared.isdecimal() and (len(declared) > 18 or int(declared) > limit):
        raise RequestError(f"the body's {declared} bytes exceed this server's limit of {limit} bytes", 413,
                           "request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"the body exceeds this server's limit of {limit} bytes", 413, "request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def until_disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the ASGI server reports the client gone (after the body, `receive` waits for that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def answer_or_gone(future: Future, receive: Callable[[], Awaitable[dict]]) -> list[Choice] | None:
    """The job's choices, or None when its client disconnected first: its future is then cancelled, so the batcher
    drops the job if it is still queued (a job in a running batch finishes and its answer is discarded)."""
    answer = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if answer.done():
        return answer.result()
    answer.cancel()  # cancels `future` too, unless the batcher already runs it
    return None


def make_app(judge: Judge, model_name: str, *, api_key: str = "", window_s: float = 0.02, max_batch: int = 64,
             default_max_tokens: int = 256, seed: int = 0, warmup_prompt_tokens: int = 0,
             max_body_bytes: int = MAX_BODY_BYTES, max_programs: int = MAX_PROGRAMS):
    """The starlette app serving `judge` as `model_name` (the batcher's worker thread starts here, after a
    warm-up of every batch bucket for `warmup_prompt_tokens`-token prompts when that is > 0)."""
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    # What the model behind `model_name` is (GET /v1/models): clients put it in their judge hash (docs/judges.md).
    identity = weights_identity(judge.name) if (Path(judge.name) / "config.json").is_file() else ""
    batcher = Batcher(judge, window_s=window_s, max_batch=max_batch, seed=seed, max_programs=max_programs)
    if warmup_prompt_tokens:
        batcher.warm_up(warmup_prompt_tokens, default_max_tokens)
    # One parser thread: JSON and tokenising stay off the event loop, and the tokenizer is never used by two
    # parses at once.
    parser = ThreadPoolExecutor(1, thread_name_prefix="serve-parse")
    counts = {"requests": 0, "refused": 0, "disconnected": 0}

    def error(e: RequestError) -> JSONResponse:
        counts["refused"] += 1
        return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error", "code": e.code}},
                            status_code=e.status)

    def unauthorized(request: Request) -> JSONResponse | None:
        if authorized(request.headers.get("authorization", ""), api_key):
            return None
        return error(RequestError("missing or wrong API key (Authorization: Bearer <key>)", 401, "invalid_api_key"))

    async def completion(request: Request, kind: str) -> Response:
        refused = unauthorized(request)
        if refused:
            return refused
        try:
            raw = await read_body(request, max_body_bytes)
            job = await asyncio.get_running_loop().run_in_executor(
                parser, functools.partial(parse_request, raw, kind, judge, model_name, default_max_tokens))
        except RequestError as e:
            return error(e)
        except ClientDisconnect:  # left mid-body: nobody to answer
            counts["disconnected"] += 1
            return Response(status_code=400)
        try:
            future = batcher.submit(job)
        except RequestError as e:
            return error(e)
        counts["requests"] += 1
        choices = await answer_or_gone(future, request.receive)
        if choices is None:
            counts["disconnected"] += 1
            return Response(status_code=400)
        items = [({"message": {"role": "assistant", "content": c.text}} if kind == "chat" else
                  {"text": c.text, "logprobs": None}) | {"index": i, "finish_reason": c.finish}
                 for i, c in enumerate(choices)]
        completion_tokens = sum(c.tokens for c in choices)
        return JSONResponse({
            "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model_name, "choices": items,
            "usage": {"prompt_tokens": len(job.prompt_ids), "completion_tokens": completion_tokens,
                      "total_tokens": len(job.prompt_ids) + completion_tokens}})

    async def chat(request: Request) -> Response:
        return await completion(request, "chat")

    async def completions(request: Request) -> Response:
        return await completion(request, "completions")

    async def models(request: Request) -> JSONResponse:
        return unauthorized(request) or JSONResponse({"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "rubric_jax",
            "max_model_len": judge.backend.weights.cfg.max_position_embeddings, "weights_identity": identity}]})

    async def health(request: Request) -> JSONResponse:
        """Liveness for anyone; the counters (what the server is asked and by how many) only with the key."""
        if not authorized(request.headers.get("authorization", ""), api_key):
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "ok", "model": model_name, **counts, **batcher.stats()})

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ])
