"""LLM judge: every judge prompt of a step in one batched `generate` call per judge, parsed, retried, combined.

Flow for a batch of rows (question, response, the row's LLM dimensions):
  requests: one per (row, dimension) in "per_dimension" mode, one per row in "all_criteria" mode (QuRL), one per
            (group, dimension) in the group layout (below);
  samples:  each request is prompted `samples` times (fresh nonce, optionally shuffled anchors)
            and the median of its valid verdicts is kept (RubricRL 3.3);
  rounds:   round 0 sends all prompts in ONE generate call (or calls of at most `batch_size` prompts,
            which bounds the judge's KV cache); each retry round re-prompts only the invalid samples
            (new nonce, new anchor order, new sampling key), again in one call (or `batch_size` chunks);
  failure:  a sample still invalid after `max_retries` is NaN; a request with no valid sample is NaN
            and masked invalid; every failure is counted in `details` (never turned into a score), and
            each failed score carries its cause (FAILURE_CAUSES: the most frequent among its samples);
  processes: in a multi-process job each process judges its own rows, but every generate call is global:
            the number of rounds and each call's prompt count are the maximum over processes (a process
            with fewer prompts pads its call with one-token fillers and discards their verdicts), so
            every process makes the same calls with the same shapes, also in retry rounds;
  content:  a prompt's nonce and anchor order come from (key, a hash of its question, response and
            dimensions, sample, round), so a prompt depends only on its own content: a greedy judge's
            verdicts do not depend on the other rows or how rows split over processes (a sampling
            judge's noise depends on where a row sits in a call), and a verdict store can find it;
  store:    with a VerdictStore (judges/store.py), a prompt whose answer is stored (same judge hash and
            judge name, token ids, sample and key) is not generated: only misses are sent, in the same calls per
            round (a process with fewer misses pads), and each call's answers are stored right after it (a read-only
            store: not stored, counted); a stored answer's verdict is parsed again from its text, never taken as stored;
  group:    with layout=group (listwise; OpenPipe RULER, TRL #4707) a request is a group: every row of the call with
            the same question and the same LLM dimension (GRPO's rollouts of one question), in content order (by
            response text), scored in ONE prompt (prompts.group_prompt). Sample s shows the group in a seeded order
            rolled by s (a permutation from the key, the group's content and the round; rolled per sample, so S <= G
            samples show each response at S different positions); the verdict's labels map back to rows through it,
            and each valid sample's (dimension, shown position, group size, score) is kept for the position bias
            (details["judge_group_positions"]: calibration reports it). A group's prompt depends on its content only;
  layout:   with layout=shared_prefix a prompt is [system; rules; question; response] + [criterion; answer
            format]: the shared part's nonce comes from the row's content (not its dimension), so a row's D
            prompts of one sample and round share it, and one generate call prefills each distinct shared part
            once and continues it with its criteria (`sampling.generate(suffix_ids=...)`); a prompt's token ids
            are its shared part's then its criterion's, each tokenized alone (what the cache continues);
  ensemble: judges (different params or base models, RubricRL 6.2 / 7) are combined per score by the
            mean of the valid ones, or weighted by agreement with the other judges.
  cascade:  with `config.cascade` (judges/cascade.py), the items the judges above are uncertain of are judged
            again by the refining judges, whose valid verdicts replace theirs (RubricRL 7);
  backend:  a judge's answers come from its one `JudgeBackend` (judges/backends.py): SamplerBackend (sampling.generate
            in this process) or HttpBackend (an OpenAI-compatible endpoint, judges/http_backend.py: its requests are
            this process's own, no call is global); the retry loop (_run_judge), the parser and the store are the same for both,
            and an endpoint that gives no answer after its HTTP retries fails the sample with cause
            "judge_http_error" (never re-prompted); with a store, a served judge whose endpoint reports no weights
            identity is fingerprinted first (check_fingerprint).
  stats:    one JudgeStats per call (typed counters named as their metrics); JudgeOutput.details is its details().

A slot is one (row, dimension) score; a request covers a contiguous range of slots. Arrays below are
indexed [J judges, S samples, L slots]. Randomness (nonces, anchor orders, sampling) comes only from
the explicit `key`, so judging is a pure function of its inputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rubric_jax import data, distributed, loader, sampling, sharding
from rubric_jax.judges import cascade
from rubric_jax.judges.backends import Batch, HttpBackend, JudgeBackend, SamplerBackend
from rubric_jax.judges.http_backend import COMMON_SPECIAL_TOKENS, HTTP_COUNTERS, HttpCounters
from rubric_jax.judges.parser import parse_verdict
from rubric_jax.judges.prompts import (JudgePrompt, compact_single_prompt, group_prompt, multi_prompt, single_prompt,
                                       without_reserved)
from rubric_jax.judges.spec import MAX_PROMPT_TOKENS, MODES, JudgeSpec, prompt_budget
from rubric_jax.judges.store import StoredAnswer, StoreError, VerdictStore, messages_digest, prompt_digest
from rubric_jax.models.checkpoint import load_tokenizer
from rubric_jax.rubrics.schema import Dimension, canonical_json, dimension_from_dict, dimension_to_dict

# Why a judge score is missing: the prompt does not fit the judge's context (never sent; the reward scores it the
# dimension's minimum: judges/reward.py), the reply hit max_new_tokens, or the reply had no parseable verdict.
# An HTTP judge's endpoint that gave no usable answer (none after its retries, or a refused one:
# http_backend.read_answer): judge_http_error.
FAILURE_CAUSES = ("judge_prompt_too_long", "judge_truncated", "judge_invalid_verdict", "judge_http_error")


@dataclasses.dataclass(frozen=True)
class Judge:
    """One judge: its name, its tokenizer (with chat template; optional for a served judge: the served model's, for
    prompt lengths and the special tokens fenced out), its generation settings, and the one backend that answers its
    prompts (backends.SamplerBackend: weights in this process; backends.HttpBackend: an endpoint)."""

    name: str
    tokenizer: Any
    backend: JudgeBackend
    sampler: str = "temperature(0.7)"
    max_new_tokens: int = 256
    max_prompt_tokens: int = MAX_PROMPT_TOKENS

    def __post_init__(self) -> None:
        sampling.parse_sampler(self.sampler)
        for field in ("max_new_tokens", "max_prompt_tokens"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"judge {self.name!r}: {field} must be an integer >= 1, got {value!r}")
        if isinstance(self.backend, HttpBackend) and self.tokenizer is None:
            return
        if self.tokenizer.pad_token_id is None or self.tokenizer.eos_token_id is None:
            raise ValueError(f"judge {self.name!r}: tokenizer needs pad and eos tokens")
        if not self.tokenizer.chat_template:
            raise ValueError(f"judge {self.name!r}: tokenizer has no chat template")


def load_judge(
    checkpoint_dir: str, *, layout: sharding.Layout | None = None, param_dtype: str = "auto",
    compute_dtype: str = "auto", name: str | None = None, sampler: str = "temperature(0.7)",
    max_new_tokens: int = 256, max_prompt_tokens: int = MAX_PROMPT_TOKENS, batch_size: int = 0,
) -> Judge:
    """A judge from a HF directory (config.json, safetensors, tokenizer with chat template), loaded
    straight into `layout` (the run's decode layout; default: one device) in `param_dtype`, computing
    in `compute_dtype` ("auto": bfloat16 on accelerators, float32 on CPU), run by sampling.generate."""
    dtypes = dict(param_dtype=loader.resolve_dtype(param_dtype, "judge.param_dtype"),
                  compute_dtype=loader.resolve_dtype(compute_dtype, "judge.compute_dtype"))
    tokenizer = load_tokenizer(checkpoint_dir)
    # Per layer (the decode form the sampler reads in place); the stacked arrays read are dropped here.
    layout = layout or sharding.single_device_layout()
    weights = loader.to_layout(loader.load_weights(checkpoint_dir, layout, **dtypes), layout, per_layer=True)
    # A prompt that cannot fit the judge's context is counted as too long, never sent to generate.
    try:
        budget = prompt_budget(weights.cfg.max_position_embeddings, max_new_tokens, max_prompt_tokens)
    except ValueError as e:
        raise ValueError(f"judge {checkpoint_dir}: {e}") from None
    return Judge(name or str(checkpoint_dir), tokenizer, SamplerBackend(weights, sampling.generate, layout, batch_size),
                 sampler=sampler, max_new_tokens=max_new_tokens, max_prompt_tokens=budget)


@dataclasses.dataclass(frozen=True)
class JudgeOutput:
    """Raw-scale scores per row (aligned with that row's LLM dimensions; NaN = failed), metrics, and per
    row the cause of each failed score (one of FAILURE_CAUSES; "" where the score is valid)."""

    scores: list[np.ndarray]
    details: dict[str, Any]
    causes: list[list[str]]


@dataclasses.dataclass
class JudgeStats:
    """The counters of one judge_rows call, each field named as its metric (metrics.jsonl's `rl/<name>`);
    `details()` is the dict JudgeOutput carries."""

    judge_prompts: int = 0  # prompts a backend answered (not the stored ones)
    judge_generate_calls: int = 0  # the sampler backend's generate calls
    judge_invalid: int = 0  # answers without a valid verdict (truncated or unparseable)
    judge_retried: int = 0  # prompts sent again in retry rounds
    judge_prompt_too_long: int = 0  # prompts longer than the judge's context (never sent), or refused for it
    judge_store_hits: int = 0  # answers read from the verdict store
    judge_store_mismatches: int = 0  # stored answers whose stored verdict differs from their text's
    judge_store_unsaved: int = 0  # answers a read-only store did not keep
    judge_invalid_examples: list[str] = dataclasses.field(default_factory=list)  # the first 5 reasons
    http: HttpCounters | None = None  # an endpoint's counters, once one was asked
    judge_http_error_examples: list[str] = dataclasses.field(default_factory=list)  # the first 5 endpoint errors
    judge_scores: int = 0  # the scores (slots) judged
    judge_failed_samples: int = 0  # samples (of every judge) without a valid verdict
    judge_sample_spread_mean: float = float("nan")  # mean max - min of a score's valid samples
    sample_spread_count: int = 0  # the mean's weight when blocks of rows are joined
    cascade: cascade.CascadeStats | None = None  # the refining judges' counters, with a cascade
    judge_failed_scores: int = 0  # scores without any valid verdict
    # layout=group only: (dimension id, shown position, group size, raw score) of every valid sample (not a metric)
    judge_group_positions: list[tuple[str, int, int, float]] | None = None

    def details(self) -> dict[str, Any]:
        """The counters by metric name, in the order they have always been logged: an endpoint's judge_http_* only
        once one was asked (its latencies as percentiles), judge_http_error_examples only when one failed, the
        cascade's judge_cascade_* only with a cascade."""
        counters = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        http, examples, cascaded = counters.pop("http"), counters.pop("judge_http_error_examples"), counters.pop("cascade")
        positions = counters.pop("judge_group_positions")
        summary = {name: counters.pop(name) for name in _SUMMARY_FIELDS}
        details = counters  # the loop's counters, in field order
        if http is not None:
            endpoint = http.summary()
            details |= {name: endpoint.pop(name) for name in HTTP_COUNTERS}
            details |= ({"judge_http_error_examples": examples} if examples else {}) | endpoint  # then the latencies
        details |= {name: summary[name] for name in _SUMMARY_FIELDS[:-1]}
        details |= dataclasses.asdict(cascaded) if cascaded is not None else {}
        details |= {"judge_failed_scores": summary["judge_failed_scores"]}
        return details | ({"judge_group_positions": positions} if positions is not None else {})


# JudgeStats fields judge_rows fills after the judges answered (last in its details).
_SUMMARY_FIELDS = ("judge_scores", "judge_failed_samples", "judge_sample_spread_mean", "sample_spread_count",
                   "judge_failed_scores")


@dataclasses.dataclass(frozen=True)
class _Request:
    """One item to prompt: its row (or, layout=group, its group's rows in content order), its dimensions, and the
    slot of each (row, dimension) it scores (one per dimension, or one per row of the group)."""

    rows: tuple[int, ...]
    dims: tuple[Dimension, ...]
    slots: tuple[int, ...]


def key_words(key: jax.Array) -> np.ndarray:
    """A JAX key's (typed or raw) data as uint32 words."""
    data = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return np.asarray(data, dtype=np.uint32).ravel()


def host_rng(key: jax.Array, *indices: int) -> np.random.Generator:
    """A numpy generator seeded from a JAX key and optional non-negative `indices` (e.g. a prompt's content
    seed and sample), for nonces and anchor orders."""
    return np.random.default_rng([*key_words(key).tolist(), *indices])


def special_tokens(tokenizer: Any) -> list[str]:
    """Every special token string of the tokenizer (these must never come from untrusted text)."""
    added = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
    return sorted(set(added) | set(tokenizer.all_special_tokens))


def _build_prompt(
    req: _Request, question: str, response: str | Sequence[str], config: JudgeSpec, rng: np.random.Generator,
    reserved: Sequence[str], row_rng: np.random.Generator | None = None, shown: Sequence[int] = (),
) -> tuple[JudgePrompt, tuple[int, ...]]:
    """The request's prompt and the slot each of its verdict keys fills, in key order; with `reverse_order`, an
    all_criteria prompt lists (and expects) its criteria reversed. In the shared_prefix layout the nonce comes from
    `row_rng` (the row's, shared by its dimensions); in the group layout `response` holds the group's responses
    (content order) and `shown` the order they are shown in (`_shown_order`)."""
    nonce = rng.bytes(8).hex()  # drawn in both layouts: the anchor orders below come from the same stream
    shared = config.layout == "shared_prefix"
    if shared:
        nonce = (row_rng or rng).bytes(8).hex()
    dims = req.dims[::-1] if config.reverse_order else req.dims
    orders = [rng.permutation(len(d.anchors)).tolist() if config.shuffle_anchors else
              (list(range(len(d.anchors)))[::-1] if config.reverse_order else None) for d in dims]
    slots = req.slots[::-1] if config.reverse_order else req.slots
    if config.layout == "group":
        return (group_prompt(question, [response[m] for m in shown], req.dims[0], nonce=nonce, anchor_order=orders[0],
                             reserved=reserved), tuple(req.slots[m] for m in shown))
    if config.prompt == "compact":
        return compact_single_prompt(response, dims[0], nonce=nonce, anchor_order=orders[0], reserved=reserved,
                                     response_first=shared), slots
    if config.mode == "per_dimension":
        return single_prompt(question, response, dims[0], nonce=nonce, anchor_order=orders[0], reserved=reserved,
                             response_first=shared), slots
    return multi_prompt(question, response, dims, nonce=nonce, anchor_orders=orders, reserved=reserved), slots


def _shown_order(size: int, rng: np.random.Generator, sample: int) -> list[int]:
    """The group layout's order of a group's `size` responses (content-order indices, by shown position) in
    `sample`: a permutation drawn from `rng` (the group's content and round, not the sample) rolled by `sample`, so
    S <= size samples show each response at S different positions."""
    return np.roll(rng.permutation(size), sample).tolist()


def _content(req: _Request, questions: Sequence[str], responses: Sequence[str], group: bool
             ) -> tuple[str, str | list[str]]:
    """A request's question and its response (in the group layout, its group's responses in content order)."""
    return questions[req.rows[0]], [responses[r] for r in req.rows] if group else responses[req.rows[0]]


def _group_requests(questions: Sequence[str], responses: Sequence[str], dims_per_row: Sequence[Sequence[Dimension]]
                    ) -> list[_Request]:
    """layout=group: one request per (question, dimension), in order of first appearance, over every row of the call
    asking that question with that dimension, in content order (response text, then row), so that its prompts
    depend on the group's content only; slots are numbered row by row, each row's dimensions in order."""
    members: dict[tuple[str, str], list[tuple[int, int]]] = {}
    dims: dict[tuple[str, str], Dimension] = {}
    slot = 0
    for row, row_dims in enumerate(dims_per_row):
        for dim in row_dims:
            group = (questions[row], canonical_json(dimension_to_dict(dim)))
            members.setdefault(group, []).append((row, slot))
            dims[group] = dim
            slot += 1
    ordered = {g: sorted(pairs, key=lambda p: (responses[p[0]], p[0])) for g, pairs in members.items()}
    return [_Request(tuple(r for r, _ in pairs), (dims[g],), tuple(s for _, s in pairs))
            for g, pairs in ordered.items()]


def _request_seed(question: str, response: str | Sequence[str], dims: Sequence[Dimension]) -> int:
    """A request's content as an integer (sha256 of question, response (a group's list of them) and its dimensions'
    canonical JSON): with the key, sample and round it seeds the prompt's nonce and anchor order, so a prompt depends
    on its own content only (not on the other rows, their order, or how rows split over processes)."""
    content = canonical_json([question, response, [dimension_to_dict(d) for d in dims]])
    return int(hashlib.sha256(content.encode("utf-8")).hexdigest()[:32], 16)


def _call_salt(digests: Sequence[str]) -> int:
    """A 31-bit number from a call's prompt digests, folded into its sampling key: calls with different
    prompts draw different noise, also when every batch of a file is judged with one key."""
    return int(hashlib.sha256("".join(digests).encode("ascii")).hexdigest()[:8], 16) & 0x7FFFFFFF


def _run_judge(
    judge: Judge,
    config: JudgeSpec,
    requests: Sequence[_Request],
    questions: Sequence[str],
    responses: Sequence[str],
    num_slots: int,
    key: jax.Array,
    stats: JudgeStats,
    causes_SxL: np.ndarray,
    store: VerdictStore | None,
) -> np.ndarray:
    """Scores [S, L] for one judge, the retry loop over its backend: NaN where a sample never produced a valid
    verdict, whose cause (FAILURE_CAUSES) is written into `causes_SxL`. Answers found in `store` are not generated
    again; every generated answer is written to it right after its call."""
    scores_SxL = np.full((config.samples, num_slots), np.nan)
    if store is not None:
        check_fingerprint(judge, store)
    reserved = special_tokens(judge.tokenizer) if judge.tokenizer is not None else list(COMMON_SPECIAL_TOKENS)
    contents = [_content(req, questions, responses, config.layout == "group") for req in requests]
    seeds = [_request_seed(*content, req.dims) for content, req in zip(contents, requests)]
    row_seeds = [_request_seed(*content, ()) for content in contents]
    seed_hex = key_words(key).tobytes().hex()
    pending = [(r, s) for r in range(len(requests)) for s in range(config.samples)]
    for round_index, round_key in enumerate(jax.random.split(key, config.max_retries + 1)):
        prompt_key, gen_key = jax.random.split(round_key)
        built = [
            _build_prompt(requests[r], *contents[r], config, host_rng(prompt_key, seeds[r], s), reserved,
                          host_rng(prompt_key, row_seeds[r], s),
                          _shown_order(len(requests[r].rows), host_rng(prompt_key, seeds[r]), s)
                          if config.layout == "group" else ())
            for r, s in pending
        ]
        prompts, verdict_slots = [p for p, _ in built], [v for _, v in built]
        ids, shared, digests = _tokenized(judge, prompts)
        sent = []
        for i, (r, s) in enumerate(pending):
            if judge.tokenizer is not None and len(ids[i]) > judge.max_prompt_tokens:
                _fail(causes_SxL, requests[r], s, "judge_prompt_too_long")
                stats.judge_prompt_too_long += 1
            else:
                sent.append(i)
        entry = {i: (judge.name, digests[i], pending[i][1], seed_hex) for i in sent}
        found = store.get(entry.values()) if store is not None else {}
        answers = {i: _reparsed(found[entry[i]], prompts[i], stats) for i in sent if entry[i] in found}
        misses = [i for i in sent if i not in answers]
        stats.judge_store_hits += len(answers)
        if round_index > 0:
            stats.judge_retried += len(misses)
        # The round's calls are global for the sampler: every process makes as many, each with as many prompts, and
        # draws the same sampling key (the salt is agreed on); a process with fewer misses pads its calls.
        most_sent, most_pending, salt = distributed.max_over_processes(
            len(misses), len(pending), _call_salt([entry[i][1] for i in misses]))
        if not most_pending:
            break
        batch = Batch([prompts[i] for i in misses], [ids[i] for i in misses] if ids else [],
                      [shared[i] for i in misses] if config.layout == "shared_prefix" else None, most_sent,
                      jax.random.fold_in(gen_key, salt))
        answers.update(_asked(judge, batch, misses, entry, [requests[pending[i][0]] for i in misses],
                              [pending[i][1] for i in misses], causes_SxL, store, stats))
        pending = _scored(judge.name, requests, pending, verdict_slots, sent, misses, answers, scores_SxL, causes_SxL,
                          stats)
    return scores_SxL


def _tokenized(judge: Judge, prompts: Sequence[JudgePrompt]) -> tuple[list[list[int]], list[int], list[str]]:
    """The prompts' token ids, shared-part lengths and store digests; a served judge without a local tokenizer has
    no ids (its prompts are all sent, and keyed by their chat messages)."""
    if judge.tokenizer is None:
        return [], [0] * len(prompts), [messages_digest(p.messages) for p in prompts]
    ids, shared = encode_prompts(judge.tokenizer, prompts)
    return ids, shared, [prompt_digest(x) for x in ids]


def _fail(causes_SxL: np.ndarray, request: _Request, sample: int, cause: str) -> None:
    """Marks every slot of `request`'s `sample` failed with `cause`."""
    causes_SxL[sample, list(request.slots)] = cause


def _asked(judge: Judge, batch: Batch, misses: Sequence[int], entry: dict[int, Any], requests: Sequence[_Request],
           samples: Sequence[int], causes_SxL: np.ndarray, store: VerdictStore | None, stats: JudgeStats
           ) -> dict[int, StoredAnswer]:
    """The parsed answers of the prompts `misses` (batch.prompts, in order) from the judge's backend, each call's
    written to `store` right after it. A prompt the backend never answered (an endpoint's refusal or failure) gets its
    cause and no answer: it is not stored or re-prompted."""
    generated: dict[int, StoredAnswer] = {}
    done = 0
    for replies in judge.backend.calls(judge, batch, stats):
        answered = []
        for k, reply in enumerate(replies, start=done):
            if reply.cause:
                _fail(causes_SxL, requests[k], samples[k], reply.cause)
                stats.judge_prompt_too_long += reply.cause == "judge_prompt_too_long"
                if reply.error and len(stats.judge_http_error_examples) < 5:
                    stats.judge_http_error_examples.append(f"{judge.name}: {reply.error}")
                continue
            generated[misses[k]] = parsed_answer(reply.text, reply.finish, batch.prompts[k])
            answered.append(misses[k])
        done += len(replies)
        _keep(store, [(entry[i], generated[i]) for i in answered], stats)
    stats.judge_prompts += len(generated)
    return generated


def _scored(judge_name: str, requests: Sequence[_Request], pending: Sequence[tuple[int, int]],
            verdict_slots: Sequence[tuple[int, ...]], sent: Sequence[int], misses: Sequence[int],
            answers: dict[int, StoredAnswer], scores_SxL: np.ndarray, causes_SxL: np.ndarray, stats: JudgeStats
            ) -> list[tuple[int, int]]:
    """Writes each valid answer's scores into `scores_SxL` (key k's score into slot `verdict_slots[i][k]`) and each
    invalid one's cause into `causes_SxL`; in the group layout, each valid score's shown position too. Returns the
    (request, sample) pairs to prompt again (invalid ones, stored or generated; never one the backend did not answer)."""
    still_invalid = []
    for i in sent:
        if i not in answers:  # a served judge that never answered: its cause is set, it is not re-prompted
            continue
        r, s = pending[i]
        answer = answers[i]
        cut = answer.finish_reason == sampling.FINISH_LENGTH
        if answer.valid and not cut:
            scores_SxL[s, list(verdict_slots[i])] = answer.scores
            if stats.judge_group_positions is not None:
                size, dim_id = len(answer.scores), requests[r].dims[0].id
                stats.judge_group_positions.extend((dim_id, k, size, v) for k, v in enumerate(answer.scores))
            continue
        _fail(causes_SxL, requests[r], s, "judge_truncated" if cut else "judge_invalid_verdict")
        if i in misses:  # the counters count this call's judge work; stored failures are retried all the same
            stats.judge_invalid += 1
            if len(stats.judge_invalid_examples) < 5:
                reason = "truncated at max_new_tokens" if cut else answer.reason
                stats.judge_invalid_examples.append(f"{judge_name}: {reason}")
        still_invalid.append((r, s))
    return still_invalid


def encode_prompts(tokenizer: Any, prompts: Sequence[JudgePrompt]) -> tuple[list[list[int]], list[int]]:
    """Each prompt's token ids with the chat template, and how many of them are its shared part (0 without a
    `suffix`): the rendered text up to the suffix and from it are tokenized apart, so the shared part's ids are
    the same for every criterion of a response and the ids are what a cache of them continues."""
    if not any(p.suffix for p in prompts):
        return (data.encode_chats(tokenizer, [p.messages for p in prompts]) if prompts else []), [0] * len(prompts)
    texts = [tokenizer.apply_chat_template([dict(m) for m in p.messages], tokenize=False, add_generation_prompt=True)
             for p in prompts]
    cuts = [text.rindex(p.suffix) if p.suffix else len(text) for text, p in zip(texts, prompts)]
    heads = tokenizer([t[:c] for t, c in zip(texts, cuts)], add_special_tokens=False)["input_ids"]
    tails = tokenizer([t[c:] for t, c in zip(texts, cuts)], add_special_tokens=False)["input_ids"]
    return [list(h) + list(t) for h, t in zip(heads, tails)], [len(h) if p.suffix else 0
                                                              for h, p in zip(heads, prompts)]


def parsed_answer(text: str, finish: str, prompt: JudgePrompt) -> StoredAnswer:
    """A judge's answer to `prompt` with its verdict parsed from the text (parser.parse_verdict)."""
    verdict = parse_verdict(text, prompt.keys, prompt.ranges)
    return StoredAnswer(text, finish, verdict.valid, tuple(verdict.scores.tolist()), verdict.reason)


def _reparsed(stored: StoredAnswer, prompt: JudgePrompt, stats: JudgeStats) -> StoredAnswer:
    """A stored answer with its verdict parsed again from its text (the text is the truth: a store whose scores were
    edited, or do not decode, cannot change a score); one whose stored verdict differs is counted in
    judge_store_mismatches."""
    answer = parsed_answer(stored.text, stored.finish_reason, prompt)
    same = (stored.valid == answer.valid and len(stored.scores) == len(answer.scores)
            and np.array_equal(stored.scores, answer.scores, equal_nan=True))
    stats.judge_store_mismatches += not same
    return answer


def _keep(store: VerdictStore | None, answers: list[tuple[Any, StoredAnswer]], stats: JudgeStats) -> None:
    """Writes `answers` to `store` (none: nothing); a read-only store keeps none of them, counted in
    judge_store_unsaved (its hits are still read: store.VerdictStore)."""
    if store is None or not answers:
        return
    if store.read_only:
        stats.judge_store_unsaved += len(answers)
        return
    store.put(answers)


# The fingerprint of a served judge whose endpoint reports no weights identity (a foreign API): its greedy verdicts on
# these fixed prompts, stored with a verdict store's answers and compared at each command's first judge call.
_PROBE_DIMENSION = dimension_from_dict({
    "id": "politeness", "description": "The response is polite: it thanks or apologises to the user.", "kind": "llm",
    "scale": {"kind": "binary"}, "anchors": {"0": "impolite or curt", "1": "polite: thanks or apologises"}})
FINGERPRINT_PROBES = ("Thank you for waiting, and sorry for the delay: your refund is on its way.",
                      "Figure it out yourself.", "Sorry, I cannot help with that. Thanks for asking!",
                      "Your order ships tomorrow.")
_PROBE_NONCE = "f1e2d3c4b5a69788"
FINGERPRINT_META = "fingerprint"  # store_meta key prefix: fingerprint:<judge hash>:<judge name>


def fingerprint(judge: Judge) -> list[float | None]:
    """`judge`'s greedy verdicts on FINGERPRINT_PROBES over its endpoint (None: no parseable verdict); a StoreError
    when a probe gets no answer (the fingerprint cannot be taken: nothing is judged)."""
    prompts = [single_prompt("How is my order doing?", response, _PROBE_DIMENSION, nonce=_PROBE_NONCE,
                             reserved=COMMON_SPECIAL_TOKENS) for response in FINGERPRINT_PROBES]
    replies = judge.backend.client.answer([p.messages for p in prompts], sampler="greedy",
                                          max_tokens=judge.max_new_tokens, stats=HttpCounters())
    failed = next((reply.error or reply.cause for reply in replies if reply.cause), None)
    if failed is not None:
        raise StoreError(f"judge {judge.name}: the fingerprint probes got no answer ({failed}); nothing was judged")
    scores = [parsed_answer(reply.text, reply.finish, p).scores[0] for reply, p in zip(replies, prompts)]
    return [None if np.isnan(score) else float(score) for score in scores]


def check_fingerprint(judge: Judge, store: VerdictStore) -> None:
    """A served judge whose endpoint reports no weights identity (nothing in its judge hash tells its model) is
    fingerprinted once per store: the first time, its probe verdicts are stored with the store's meta; afterwards
    they must be the same, else a StoreError (one line): the model behind the name changed and the stored
    verdicts are another model's. A read-only store without a fingerprint is not checked."""
    if not isinstance(judge.backend, HttpBackend):
        return
    client = judge.backend.client
    if client.identity or (str(store.path), store.judge_hash) in client.fingerprinted:
        return
    key = f"{FINGERPRINT_META}:{store.judge_hash}:{judge.name}"
    stored, now = store.meta(key), fingerprint(judge)
    if stored is None and not store.read_only:
        store.set_meta(key, json.dumps(now))
    elif stored is not None and json.loads(stored) != now:
        raise StoreError(f"verdict store {store.path}: the served judge {judge.name} reports no weights identity, "
                         f"and its verdicts on the fingerprint probes are {now}, not the {json.loads(stored)} stored "
                         "with this store's verdicts: another model answers under that name; serve the same model "
                         "or use another --judge.store")
    client.fingerprinted.add((str(store.path), store.judge_hash))


def combine_judges(scores_JxL: np.ndarray, ranges_Lx2: np.ndarray, ensemble: str) -> np.ndarray:
    """Per slot: mean of the valid judges' scores, or agreement-weighted (w = 1 / (1 + mean |s_j - s_k| / span))."""
    valid_JxL = ~np.isnan(scores_JxL)
    if ensemble == "mean" or scores_JxL.shape[0] == 1:
        weights_JxL = valid_JxL.astype(np.float64)
    else:
        span_L = (ranges_Lx2[:, 1] - ranges_Lx2[:, 0]).astype(np.float64)
        filled_JxL = np.where(valid_JxL, scores_JxL, 0.0)
        diff_JxJxL = np.abs(filled_JxL[:, None, :] - filled_JxL[None, :, :]) / span_L
        pair_JxJxL = valid_JxL[:, None, :] & valid_JxL[None, :, :]
        pair_JxJxL &= ~np.eye(scores_JxL.shape[0], dtype=bool)[:, :, None]
        others_JxL = pair_JxJxL.sum(axis=1)
        mean_dev_JxL = np.where(others_JxL > 0, (diff_JxJxL * pair_JxJxL).sum(axis=1) / np.maximum(others_JxL, 1), 0.0)
        weights_JxL = np.where(valid_JxL, 1.0 / (1.0 + mean_dev_JxL), 0.0)
    total_L = weights_JxL.sum(axis=0)
    weighted_L = (weights_JxL * np.where(valid_JxL, scores_JxL, 0.0)).sum(axis=0)
    return np.where(total_L > 0, weighted_L / np.where(total_L > 0, total_L, 1.0), np.nan)


def judge_rows(
    judges: Sequence[Judge],
    config: JudgeSpec,
    questions: Sequence[str],
    responses: Sequence[str],
    dims_per_row: Sequence[Sequence[Dimension]],
    key: jax.Array,
    store: VerdictStore | None = None,
    refiners: Sequence[Judge] = (),
) -> JudgeOutput:
    """LLM scores (raw scale) for each row's dimensions: one batched generate per judge per round; with a
    `store`, only prompts without a stored answer are generated, and every answer is stored. With a cascade
    (`config.cascade`), `refiners` (its loaded judges) re-judge the items the first judges are uncertain of."""
    if not judges:
        raise ValueError("judge_rows: no judge configured")
    if (config.cascade is not None) != bool(refiners):
        raise ValueError("judge_rows: judge.cascade needs its refining judges (loading.load_cascade), and only it")
    if config.mode not in MODES:
        raise ValueError(f"judge_rows: judge mode {config.mode!r} is not one of {MODES} (resolve 'benchmark' first)")
    if not len(questions) == len(responses) == len(dims_per_row):
        raise ValueError(
            f"judge_rows: {len(questions)} questions, {len(responses)} responses, {len(dims_per_row)} dimension lists"
        )
    slot_rows = [row for row, dims in enumerate(dims_per_row) for _ in dims]
    slot_dims = [d for dims in dims_per_row for d in dims]
    requests = (_group_requests(questions, responses, dims_per_row) if config.layout == "group"
                else _row_requests(dims_per_row, config.mode))
    num_slots = len(slot_rows)
    ranges_Lx2 = np.asarray([d.scale.raw_range for d in slot_dims], dtype=np.float64).reshape(-1, 2)
    stats = JudgeStats(judge_group_positions=[] if config.layout == "group" else None)
    per_judge = []
    causes_JxSxL = np.full((len(judges), config.samples, num_slots), "", dtype=object)
    for j, (judge, judge_key) in enumerate(zip(judges, jax.random.split(key, len(judges)))):
        scores_SxL = _run_judge(judge, config, requests, questions, responses, num_slots, judge_key, stats,
                                causes_JxSxL[j], store)
        per_judge.append(scores_SxL)
    scores_JxSxL = np.stack(per_judge)
    valid_JxSxL = ~np.isnan(scores_JxSxL)
    any_valid_JxL = valid_JxSxL.any(axis=1)
    median_JxL = np.full((len(judges), num_slots), np.nan)
    median_JxL[any_valid_JxL] = np.nanmedian(scores_JxSxL.transpose(0, 2, 1)[any_valid_JxL], axis=-1)
    spread_JxL = np.where(valid_JxSxL, scores_JxSxL, -np.inf).max(axis=1) - np.where(
        valid_JxSxL, scores_JxSxL, np.inf).min(axis=1)
    combined_L = combine_judges(median_JxL, ranges_Lx2, config.ensemble)
    stats.judge_scores = num_slots
    stats.judge_failed_samples = int((~valid_JxSxL).sum())
    stats.judge_sample_spread_mean = float(spread_JxL[any_valid_JxL].mean()) if any_valid_JxL.any() else float("nan")
    stats.sample_spread_count = int(any_valid_JxL.sum())
    slot_rows_L = np.asarray(slot_rows, dtype=np.int64)
    causes_L = np.asarray([_most_common_cause(causes_JxSxL[:, :, slot]) if np.isnan(combined_L[slot]) else ""
                           for slot in range(num_slots)], dtype=object)
    if config.cascade is not None:
        escalate_L = cascade.uncertain(config, slot_dims, scores_JxSxL.reshape(len(judges) * config.samples, num_slots),
                                       combined_L)
        _refine(refiners, config.cascade, questions, responses, slot_rows_L, slot_dims, escalate_L, combined_L,
                causes_L, cascade.refine_key(key), store, stats)
    stats.judge_failed_scores = int(np.isnan(combined_L).sum())
    rows = range(len(dims_per_row))
    return JudgeOutput([combined_L[slot_rows_L == row] for row in rows], stats.details(),
                       [causes_L[slot_rows_L == row].tolist() for row in rows])


def _row_requests(dims_per_row: Sequence[Sequence[Dimension]], mode: str) -> list[_Request]:
    """One request per (row, dimension) in per_dimension mode, one per row with dimensions in all_criteria mode;
    slots numbered row by row, each row's dimensions in order."""
    requests, first = [], 0
    for row, dims in enumerate(dims_per_row):
        for group in ([(d,) for d in dims] if mode == "per_dimension" else ([tuple(dims)] if dims else [])):
            requests.append(_Request((row,), group, tuple(range(first, first + len(group)))))
            first += len(group)
    return requests


def _refine(refiners: Sequence[Judge], spec: JudgeSpec, questions: Sequence[str], responses: Sequence[str],
            slot_rows_L: np.ndarray, slot_dims: Sequence[Dimension], escalate_L: np.ndarray, combined_L: np.ndarray,
            causes_L: np.ndarray, key: jax.Array, store: VerdictStore | None, stats: JudgeStats) -> None:
    """The cascade's second pass, in place: the escalated slots re-judged by `refiners` as judge `spec` (each row
    with its escalated dimensions only); a valid refined score replaces the first's, a failed one keeps it (and its
    cause when the first failed too). Always called with a cascade: the refiners' calls are global."""
    escalated = [[slot_dims[slot] for slot in np.flatnonzero(escalate_L & (slot_rows_L == row))]
                 for row in range(len(questions))]
    refined = judge_rows(refiners, spec, questions, responses, escalated, key, store)
    for row, scores, causes in zip(range(len(questions)), refined.scores, refined.causes):
        for slot, score, cause in zip(np.flatnonzero(escalate_L & (slot_rows_L == row)), scores, causes):
            if not np.isnan(score):
                combined_L[slot], causes_L[slot] = score, ""
            elif np.isnan(combined_L[slot]):
                causes_L[slot] = cause
    screened, sent = len(escalate_L), int(escalate_L.sum())
    stats.cascade = cascade.CascadeStats(
        screened, sent, sent / screened if screened else float("nan"), refined.details["judge_prompts"],
        refined.details["judge_generate_calls"], refined.details["judge_store_hits"],
        refined.details["judge_failed_scores"])


def escalated_frac(counters: dict[str, Any]) -> float:
    """The cascade's share of screened items sent to the refining judge (NaN when none was screened)."""
    screened = counters["judge_cascade_screened"]
    return counters["judge_cascade_escalated"] / screened if screened else float("nan")


def _most_common_cause(causes: np.ndarray) -> str:
    """The most frequent non-empty cause among a failed score's samples (ties: FAILURE_CAUSES order)."""
    counts = [int((causes == cause).sum()) for cause in FAILURE_CAUSES]
    return FAILURE_CAUSES[int(np.argmax(counts))]


def shortest_prompt_tokens(judge: Judge, config: JudgeSpec, question: str, dims: Sequence[Dimension]) -> int:
    """Tokens of the shortest prompt `judge` can be sent for these LLM dimensions of a row (one dimension in
    per_dimension mode, the row's in all_criteria): the one for an empty response. Longer than `judge.max_prompt_tokens`
    means that no response to this row is ever judged on them."""
    request = _Request((0,), tuple(dims), tuple(range(len(dims))))
    response = [""] if config.layout == "group" else ""  # the group layout's shortest: a group of one empty response
    prompt, _ = _build_prompt(request, question, response, config, np.random.default_rng(0),
                              special_tokens(judge.tokenizer), shown=[0])
    return len(encode_prompts(judge.tokenizer, [prompt])[0][0])


def judge_tokens_per_token(judge: Judge, tokenizer: Any) -> int:
    """The most judge tokens the text of one token of `tokenizer` (a policy's, special tokens included) takes in
    `judge`'s prompt (reserved strings replaced as the fence replaces them). Times a response's token count it
    estimates the response's judge tokens at worst (token by token: merges across tokens are not counted)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    reserved = special_tokens(judge.tokenizer)
    ids = judge.tokenizer([without_reserved(t, reserved) for t in texts], add_special_tokens=False)["input_ids"]
    return max(map(len, ids), default=0)
