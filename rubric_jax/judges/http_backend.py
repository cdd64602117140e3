"""The OpenAI-compatible judge backend: one round's judge prompts answered by an HTTP endpoint (an API, vLLM or
SGLang, or experiments.serve) instead of sampling.generate.

The `openai` client does the HTTP: timeouts, retries with exponential backoff and jitter that honour Retry-After.
This module adds what a judge round needs around it: at most `max_concurrency` requests in flight (threads),
requests-per-minute and tokens-per-minute limits (token buckets; a request is charged its prompt characters / 4
plus max_tokens before it is sent, corrected to the server's `usage` when it answers), and the counters a step
logs (`judge_http_*`: requests, prompt/completion tokens, retries, failures, latency percentiles). The API key
is read from the environment variable the spec names, when the client is made; it is never stored anywhere.

What an endpoint sends is checked before it counts (docs/hostile_input.md): an answer whose finish reason is not
"stop" or "length" (content_filter, tool_calls, ...), a refusal, content that is neither text nor a list of parts
(whose text parts are joined), or an answer longer than MAX_CHARS_PER_TOKEN characters per requested token is no
verdict (a failure with its reason, cause judge_http_error); `usage` counts outside [0, what was sent or asked]
are clamped into it (judge_http_usage_clamped), and null ones are left out, so an endpoint cannot drain the token
bucket; the retries counted are the ones the client made (its retry-count header).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from rubric_jax.sampling import parse_sampler

if TYPE_CHECKING:  # a type only: spec.served_identity imports this module, so spec is not imported back
    from rubric_jax.judges.spec import JudgeSpec

# Special tokens of the common chat templates (Qwen2, Llama 3, Mistral, Gemma, Phi): fenced out of untrusted text
# when the served model's own tokenizer is not available locally (no judge.checkpoint).
COMMON_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
                         "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<s>", "</s>",
                         "[INST]", "[/INST]", "<start_of_turn>", "<end_of_turn>", "<|user|>", "<|assistant|>",
                         "<|system|>", "<|end|>")
MAX_CHARS_PER_TOKEN = 64  # a longer answer than this many characters per requested token is refused, not parsed
FINISH_REASONS = ("stop", "length")  # an answer that ended otherwise (content_filter, tool_calls, ...) is refused
RETRY_COUNT_HEADER = "x-stainless-retry-count"  # the openai client's retry number, on every request it sends
OUTAGE_POLL_S = 1.0  # seconds between tries while an endpoint is unreachable (spec.outage_s bounds the total)
LATENCY_PERCENTILES = (50, 90, 99)  # judge_http_latency_p50_s, ...
# Phrases of an HTTP 400 that mean "the prompt does not fit the context" (OpenAI, vLLM, SGLang, experiments.serve).
_TOO_LONG_MARKERS = ("context length", "context_length", "maximum context", "exceeds the context", "too long")


@dataclasses.dataclass(frozen=True)
class Answer:
    """One prompt's answer: its text and finish reason ("stop" | "length"), or a cause and no answer
    ("judge_prompt_too_long": the server refused it for its context; "judge_http_error": no answer after retries)."""

    text: str = ""
    finish: str = ""
    cause: str = ""
    error: str = ""  # the last error's one-line description, when cause is set


class EndpointError(ValueError):
    """A judge endpoint that does not answer, or does not serve the spec's model (one line naming it)."""


class EndpointDown(EndpointError):
    """An endpoint that answered before stopped answering for longer than spec.outage_s. Raised from the judge
    round, before any update uses its rewards: the command stops with nothing half-applied (a run resumes
    from its last checkpoint, a score or evaluation from its verdict store)."""


class TokenBucket:
    """A per-minute limit: `take(n)` waits until n units are free (refilled continuously at rate/60 per second,
    at most `rate` banked); `refund(n)` returns units (negative: charges more). rate 0 = unlimited."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate, self.clock, self.sleep = per_minute, clock, sleep
        self.level, self.stamp = float(per_minute), clock()
        self.lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(float(self.rate), self.level + (now - self.stamp) * self.rate / 60.0)
        self.stamp = now

    def take(self, amount: float) -> None:
        if not self.rate:
            return
        amount = min(float(amount), float(self.rate))  # one request larger than a minute's budget still goes
        while True:
            with self.lock:
                self._refill()
                if self.level >= amount:
                    self.level -= amount
                    return
                wait = (amount - self.level) * 60.0 / self.rate
            self.sleep(wait)

    def refund(self, amount: float) -> None:
        if self.rate:
            with self.lock:
                self._refill()
                self.level = min(float(self.rate), self.level + amount)


def request_options(sampler: str, max_tokens: int) -> dict[str, Any]:
    """The OpenAI request fields of a rubric_jax sampler string: greedy is temperature 0; topk(k) is sent as
    vLLM's and SGLang's `top_k` extension."""
    parsed = parse_sampler(sampler)
    options: dict[str, Any] = {"max_tokens": max_tokens, "n": 1,
                               "temperature": 0.0 if parsed.kind == "greedy" else parsed.temperature}
    if parsed.kind == "nucleus":
        options["top_p"] = parsed.top_p
    if parsed.kind == "topk":
        options["extra_body"] = {"top_k": parsed.top_k}
    return options


@dataclasses.dataclass
class HttpCounters:
    """An endpoint client's usage counters, each field named as its metric (metrics.jsonl's `rl/<name>`), and the
    answered requests' latencies (seconds), logged as percentiles."""

    judge_http_requests: int = 0
    judge_http_prompt_tokens: int = 0
    judge_http_completion_tokens: int = 0
    judge_http_retries: int = 0  # the retries the openai client made
    judge_http_failures: int = 0  # requests without a usable answer
    judge_http_outage_waits: int = 0  # times an unreachable endpoint was waited for
    judge_http_usage_clamped: int = 0  # answers whose usage counts were out of bounds
    latencies: list[float] = dataclasses.field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The counters by metric name, then judge_http_latency_p{50,90,99}_s (NaN: no answered request)."""
        percentiles = {f"judge_http_latency_p{q}_s": float(np.percentile(self.latencies, q)) if self.latencies
                       else float("nan") for q in LATENCY_PERCENTILES}
        return {name: getattr(self, name) for name in HTTP_COUNTERS} | percentiles


HTTP_COUNTERS = tuple(f.name for f in dataclasses.fields(HttpCounters) if f.name != "latencies")


def _too_long(error: Exception) -> bool:
    import openai

    return isinstance(error, openai.BadRequestError) and any(m in str(error).lower() for m in _TOO_LONG_MARKERS)


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"


def _retries_taken(error: Exception) -> int:
    """The retries the openai client made before `error`: the retry number its last request carried (0 when the
    error has no request; the client does not retry a Retry-After over two minutes, nor a 4xx but 408, 409 and 429)."""
    request = getattr(error, "request", None)
    try:
        return int(request.headers.get(RETRY_COUNT_HEADER, 0))
    except (AttributeError, TypeError, ValueError):
        return 0


def _part_text(part: Any) -> str | None:
    """A content part's text (None for a part without text, e.g. an image); a ValueError for a malformed part."""
    part = part if isinstance(part, Mapping) else getattr(part, "__dict__", part)
    if not isinstance(part, Mapping):
        raise ValueError(f"a content part is {type(part).__name__}, not an object")
    if part.get("type", "text") != "text":
        return None
    if not isinstance(part.get("text"), str):
        raise ValueError(f"a text part's text is {type(part.get('text')).__name__}, not a string")
    return part["text"]


def read_answer(content: Any, finish: Any, refusal: Any, max_tokens: int) -> tuple[str, str]:
    """(text, "stop" | "length") of one choice, or a ValueError saying why it is no verdict: a finish reason outside
    FINISH_REASONS (None counts as "stop"), a refusal, content that is neither a string nor a list of parts (its
    text parts joined), or text longer than MAX_CHARS_PER_TOKEN characters per requested token."""
    if finish is not None and finish not in FINISH_REASONS:
        raise ValueError(f"finish_reason {str(finish)[:40]!r} (expected one of {FINISH_REASONS})")
    if refusal:
        raise ValueError(f"the model refused ({' '.join(str(refusal).split())[:100]!r})")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        text = "".join(t for t in map(_part_text, content) if t is not None)
    else:
        raise ValueError(f"content is {type(content).__name__}, expected a string or a list of text parts")
    if len(text) > MAX_CHARS_PER_TOKEN * max_tokens:
        raise ValueError(f"an answer of {len(text)} characters for max_tokens={max_tokens} (at most "
                         f"{MAX_CHARS_PER_TOKEN * max_tokens})")
    return text, "length" if finish == "length" else "stop"


def _count(value: Any, bound: int) -> tuple[int | None, bool]:
    """A usage count clamped into [0, bound] and whether it was outside (None, not clamped: a null or missing one;
    a non-number is clamped to 0)."""
    if value is None:
        return None, False
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 0, True
    clamped = min(max(value, 0), bound)
    return int(clamped), clamped != value


def usage_counts(usage: Any, prompt_bound: int, max_tokens: int) -> tuple[int | None, int | None, bool]:
    """(prompt tokens, completion tokens, clamped) of an answer's `usage`: each None when the endpoint gave none,
    else clamped into [0, prompt_bound] and [0, max_tokens] (an endpoint cannot report more than it was sent or
    asked: a prompt of B bytes is at most B tokens)."""
    prompt, prompt_clamped = _count(getattr(usage, "prompt_tokens", None), prompt_bound)
    completion, completion_clamped = _count(getattr(usage, "completion_tokens", None), max_tokens)
    return prompt, completion, prompt_clamped or completion_clamped


def prompt_bound(messages: Sequence[Mapping[str, str]]) -> int:
    """The most tokens `messages` can be: their JSON's UTF-8 bytes (a token is at least a byte; the JSON's keys
    and quotes stand for the chat template's few tokens per message) plus a template's preamble."""
    return len(json.dumps(list(messages), ensure_ascii=False).encode("utf-8")) + 64


class HttpJudgeClient:
    """Answers judge prompts through one OpenAI-compatible endpoint (`spec`'s base_url, model, endpoint, limits).
    `tokenizer` (the served model's, from judge.checkpoint) renders raw prompts for endpoint=completions."""

    def __init__(self, spec: JudgeSpec, tokenizer: Any = None, environ: Mapping[str, str] = os.environ):
        import openai

        self.spec, self.tokenizer = spec, tokenizer
        key = environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if spec.api_key_env and not key:
            raise EndpointError(f"judge.api_key_env={spec.api_key_env}: the environment variable is not set")
        # The client refuses an empty key; a server without authentication ignores this placeholder.
        self.client = openai.OpenAI(base_url=spec.base_url, api_key=key or "unused", timeout=spec.timeout_s,
                                    max_retries=spec.max_retries_http)
        self.requests = TokenBucket(spec.requests_per_minute)
        self.tokens = TokenBucket(spec.tokens_per_minute)
        self.lock = threading.Lock()
        self.warned = False  # the clamped-usage warning was printed
        self.identity = ""  # the served model's weights identity, once `check` read it ("" if none is reported)
        self.fingerprinted: set[tuple[str, str]] = set()  # (store path, judge hash) whose fingerprint matched

    @property
    def name(self) -> str:
        return f"{self.spec.model}@{self.spec.base_url}"

    def check(self) -> str:
        """The weights identity the endpoint reports for the spec's model (experiments.serve's `weights_identity` in
        GET /models: a content hash of the served weights and tokenizer; "" from an endpoint that reports none, whose
        model a verdict store fingerprints instead: llm_judge.check_fingerprint). Raises EndpointError (one line
        naming the endpoint) unless it answers GET /models within the timeout (one try) and lists the spec's model."""
        try:
            served = {m.id: m for m in self.client.with_options(max_retries=0).models.list()}
        except Exception as e:  # any failure to answer is the same one line for the user
            raise EndpointError(f"judge endpoint {self.spec.base_url} does not answer ({_one_line(e)}); start it "
                                "or fix judge.base_url") from None
        if served and self.spec.model not in served:
            raise EndpointError(f"judge endpoint {self.spec.base_url} does not serve judge.model={self.spec.model!r}"
                                f" (it serves {sorted(served)})")
        identity = getattr(served.get(self.spec.model), "weights_identity", None)
        self.identity = identity if isinstance(identity, str) else ""
        return self.identity

    def answer(self, chats: Sequence[Sequence[Mapping[str, str]]], *, sampler: str, max_tokens: int,
               stats: HttpCounters) -> list[Answer]:
        """One Answer per chat, in order, at most max_concurrency requests at a time; counted into `stats`."""
        options = request_options(sampler, max_tokens)
        if not chats:
            return []
        with ThreadPoolExecutor(max_workers=min(self.spec.max_concurrency, len(chats))) as pool:
            return list(pool.map(lambda chat: self._one(chat, options, stats), chats))

    def _one(self, chat: Sequence[Mapping[str, str]], options: dict[str, Any], stats: HttpCounters) -> Answer:
        messages = [dict(m) for m in chat]
        estimate = options["max_tokens"] + sum(len(m["content"]) for m in messages) // 4
        self.requests.take(1)
        self.tokens.take(estimate)
        start = time.monotonic()
        try:
            content, finish, refusal, usage, retries = self._send_through_outage(messages, options, stats)
        except EndpointDown:
            raise
        except Exception as e:  # openai's own retries are spent: the cause is recorded, the run goes on
            self._count_failure(stats, _retries_taken(e))
            return Answer(cause="judge_prompt_too_long" if _too_long(e) else "judge_http_error", error=_one_line(e))
        latency = time.monotonic() - start
        prompt, completion, clamped = usage_counts(usage, prompt_bound(messages), options["max_tokens"])
        if prompt is not None and completion is not None:
            self.tokens.refund(estimate - prompt - completion)
        if clamped:
            self._warn_clamped(usage)
        with self.lock:
            stats.judge_http_requests += 1
            stats.judge_http_retries += retries
            stats.latencies.append(latency)
            stats.judge_http_prompt_tokens += prompt or 0
            stats.judge_http_completion_tokens += completion or 0
            stats.judge_http_usage_clamped += clamped
        try:
            text, finish = read_answer(content, finish, refusal, options["max_tokens"])
        except ValueError as e:  # answered, but no verdict: a failure with its reason, never parsed or stored
            with self.lock:
                stats.judge_http_failures += 1
            return Answer(cause="judge_http_error", error=f"refused answer: {e}")
        return Answer(text=text, finish=finish)

    def _count_failure(self, stats: HttpCounters, retries: int) -> None:
        with self.lock:
            stats.judge_http_requests += 1
            stats.judge_http_retries += retries
            stats.judge_http_failures += 1

    def _warn_clamped(self, usage: Any) -> None:
        """One stderr line per client the first time an endpoint's usage is out of bounds (the counter counts all)."""
        with self.lock:
            if self.warned:
                return
            self.warned = True
        counts = {k: getattr(usage, k, None) for k in ("prompt_tokens", "completion_tokens")}
        print(f"warning: judge endpoint {self.spec.base_url} reported usage {counts}, more than was sent or asked "
              "(or not a count); clamped (judge_http_usage_clamped counts such answers)", file=sys.stderr)

    def _send_through_outage(self, messages: list[dict[str, str]], options: dict[str, Any], stats: HttpCounters
                             ) -> tuple[Any, Any, Any, Any, int]:
        """_send, waiting out an unreachable endpoint (refused or timed-out connections after openai's retries)
        for up to spec.outage_s: a judge server restarted within that time costs the round nothing but the wait.
        Past it, EndpointDown; with outage_s=0 the connection error is this prompt's (a missing score)."""
        import openai

        down_since = None
        while True:
            try:
                return self._send(messages, options)
            except openai.APIConnectionError as e:
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    with self.lock:
                        stats.judge_http_outage_waits += 1
                waited = now - down_since
                if self.spec.outage_s == 0:
                    raise
                if waited >= self.spec.outage_s:
                    raise EndpointDown(f"judge endpoint {self.spec.base_url} stopped answering for {waited:.0f} s "
                                       f"(judge.outage_s={self.spec.outage_s:g}; {_one_line(e)}); nothing of this "
                                       "round was applied: restart the endpoint and re-run the same command") from None
                time.sleep(min(OUTAGE_POLL_S, self.spec.outage_s - waited))

    def _send(self, messages: list[dict[str, str]], options: dict[str, Any]) -> tuple[Any, Any, Any, Any, int]:
        """(content, finish reason, refusal, usage, retries taken) of one request, as the endpoint sent them."""
        if self.spec.endpoint == "chat":
            raw = self.client.chat.completions.with_raw_response.create(model=self.spec.model, messages=messages,
                                                                        **options)
            parsed = raw.parse()
            choice = parsed.choices[0]
            message = choice.message
            return message.content, choice.finish_reason, getattr(message, "refusal", None), parsed.usage, \
                raw.retries_taken
        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        raw = self.client.completions.with_raw_response.create(model=self.spec.model, prompt=prompt, **options)
        parsed = raw.parse()
        choice = parsed.choices[0]
        return choice.text, choice.finish_reason, None, parsed.usage, raw.retries_taken
