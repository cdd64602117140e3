"""LLM judge: every judge prompt of a step in one batched `generate` call per judge, parsed, retried, combined.

Flow for a batch of rows (question, response, the row's LLM dimensions):
  requests: one per (row, dimension) in "per_dimension" mode, one per row in "all_criteria" mode (QuRL);
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
  layout:   with layout=shared_prefix a prompt is [system; rules; question; response] + [criterion; answer
            format]: the shared part's nonce comes from the row's content (not its dimension), so a row's D
            prompts of one sample and round share it, and one generate call prefills each distinct shared part
            once and continues it with its criteria (`sampling.generate(suffix_ids=...)`); a prompt's token ids
            are its shared part's then its criterion's, each tokenized alone (what the cache continues);
  ensemble: judges (different params or base models, RubricRL 6.2 / 7) are combined per score by the
            mean of the valid ones, or weighted by agreement with the other judges.
  cascade:  with `config.cascade` (judges/cascade.py), the items the judges above are uncertain of are judged
            again by the refining judges, whose valid verdicts replace theirs (RubricRL 7);
  backend:  a judge's answers come from sampling.generate in this process, or from an OpenAI-compatible
            endpoint (`Judge.http`, judges/http_backend.py: its requests are this process's own, no call is
            global); everything above is the same for both, and an endpoint that gives no answer after its
            HTTP retries fails the sample with cause "judge_http_error" (never re-prompted); with a store, a served
            judge whose endpoint reports no weights identity is fingerprinted first (check_fingerprint).

A slot is one (row, dimension) score; a request covers a contiguous range of slots. Arrays below are
indexed [J judges, S samples, L slots]. Randomness (nonces, anchor orders, sampling) comes only from
the explicit `key`, so judging is a pure function of its inputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rubric_jax import data, distributed, loader, padding, sampling, sharding
from rubric_jax.judges import cascade
from rubric_jax.judges.http_backend import COMMON_SPECIAL_TOKENS, summarize
from rubric_jax.judges.parser import parse_verdict
from rubric_jax.judges.prompts import JudgePrompt, compact_single_prompt, multi_prompt, single_prompt, without_reserved
from rubric_jax.judges.spec import MODES, JudgeSpec
from rubric_jax.judges.store import StoredAnswer, StoreError, VerdictStore, messages_digest, prompt_digest
from rubric_jax.models.checkpoint import load_tokenizer
from rubric_jax.rubrics.schema import Dimension, canonical_json, dimension_from_dict, dimension_to_dict

# Why a judge score is missing: the prompt does not fit the judge's context (never sent; the reward scores it the
# dimension's minimum: judges/reward.py), the reply hit max_new_tokens, or the reply had no parseable verdict.
# An HTTP judge's endpoint that gave no usable answer (none after its retries, or a refused one:
# http_backend.read_answer): judge_http_error.
FAILURE_CAUSES = ("judge_prompt_too_long", "judge_truncated", "judge_invalid_verdict", "judge_http_error")
GenerateFn = Callable[..., Any]  # sampling.generate's signature (see the sampler contract)
MAX_PROMPT_TOKENS = 4096  # longest judge prompt sent (capped by the judge's context); longer ones are counted


@dataclasses.dataclass(frozen=True)
class Judge:
    """One judge model: its Weights in `layout` (default: one device), its tokenizer (with chat
    template) and generation settings; or, with `http`, an endpoint that answers its prompts (weights None,
    tokenizer optional: the served model's, for prompt lengths and the special tokens fenced out)."""

    name: str
    weights: loader.Weights | None
    tokenizer: Any
    generate_fn: GenerateFn | None
    sampler: str = "temperature(0.7)"
    max_new_tokens: int = 256
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    layout: sharding.Layout | None = None
    batch_size: int = 0  # most prompts per generate call (0: all of a round in one call)
    http: Any = None  # http_backend.HttpJudgeClient: answers prompts instead of generate_fn

    def __post_init__(self) -> None:
        sampling.parse_sampler(self.sampler)
        for field, minimum in (("max_new_tokens", 1), ("max_prompt_tokens", 1), ("batch_size", 0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"judge {self.name!r}: {field} must be an integer >= {minimum}, got {value!r}")
        if self.http is not None and self.tokenizer is None:
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
    cfg = weights.cfg
    context_left = cfg.max_position_embeddings - max_new_tokens
    if context_left < 1:
        raise ValueError(f"judge {checkpoint_dir}: max_new_tokens={max_new_tokens} leaves no room in its "
                         f"{cfg.max_position_embeddings}-token context")
    return Judge(name or str(checkpoint_dir), weights, tokenizer, sampling.generate, sampler=sampler,
                 max_new_tokens=max_new_tokens, max_prompt_tokens=min(max_prompt_tokens, context_left), layout=layout,
                 batch_size=batch_size)


@dataclasses.dataclass(frozen=True)
class JudgeOutput:
    """Raw-scale scores per row (aligned with that row's LLM dimensions; NaN = failed), metrics, and per
    row the cause of each failed score (one of FAILURE_CAUSES; "" where the score is valid)."""

    scores: list[np.ndarray]
    details: dict[str, Any]
    causes: list[list[str]]


@dataclasses.dataclass(frozen=True)
class _Request:
    row: int
    dims: tuple[Dimension, ...]
    first_slot: int


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
    req: _Request, question: str, response: str, config: JudgeSpec, rng: np.random.Generator,
    reserved: Sequence[str], row_rng: np.random.Generator | None = None,
) -> JudgePrompt:
    """The request's prompt; with `reverse_order`, an all_criteria prompt lists (and expects) its criteria reversed.
    In the shared_prefix layout the nonce comes from `row_rng` (the row's, shared by its dimensions)."""
    nonce = rng.bytes(8).hex()  # drawn in both layouts: the anchor orders below come from the same stream
    shared = config.layout == "shared_prefix"
    if shared:
        nonce = (row_rng or rng).bytes(8).hex()
    dims = req.dims[::-1] if config.reverse_order else req.dims
    orders = [rng.permutation(len(d.anchors)).tolist() if config.shuffle_anchors else
              (list(range(len(d.anchors)))[::-1] if config.reverse_order else None) for d in dims]
    if config.prompt == "compact":
        return compact_single_prompt(response, dims[0], nonce=nonce, anchor_order=orders[0], reserved=reserved,
                                     response_first=shared)
    if config.mode == "per_dimension":
        return single_prompt(question, response, dims[0], nonce=nonce, anchor_order=orders[0], reserved=reserved,
                             response_first=shared)
    return multi_prompt(question, response, dims, nonce=nonce, anchor_orders=orders, reserved=reserved)


def _request_seed(question: str, response: str, dims: Sequence[Dimension]) -> int:
    """A request's content as an integer (sha256 of question, response and its dimensions' canonical JSON):
    with the key, sample and round it seeds the prompt's nonce and anchor order, so a prompt depends on its
    own content only (not on the other rows, their order, or how rows split over processes)."""
    content = canonical_json([question, response, [dimension_to_dict(d) for d in dims]])
    return int(hashlib.sha256(content.encode("utf-8")).hexdigest()[:32], 16)


def _call_salt(digests: Sequence[str]) -> int:
    """A 31-bit number from a call's prompt digests, folded into its sampling key: calls with different
    prompts draw different noise, also when every batch of a file is judged with one key."""
    return int(hashlib.sha256("".join(digests).encode("ascii")).hexdigest()[:8], 16) & 0x7FFFFFFF


def _generate(judge: Judge, ids: Sequence[Sequence[int]], shared: Sequence[int] | None, count: int, key: jax.Array
              ) -> tuple[list[str], list[str]]:
    """Answer texts and finish reasons of `ids` in one generate call of `count` prompts (fillers pad it); with
    `shared` (the shared_prefix layout, on every process alike), prompts whose first `shared` tokens agree are one
    prompt continued by their suffixes, and the call's shape is agreed in `_group_by_prefix` instead of by `count`."""
    eos = judge.tokenizer.eos_token_id
    kwargs = dict(max_new_tokens=judge.max_new_tokens, sampler=judge.sampler, stop_tokens=[eos],
                  pad_id=judge.tokenizer.pad_token_id, layout=judge.layout)
    if shared is not None:
        prefixes, suffixes, rows, n = _group_by_prefix(ids, shared, eos)
        result = judge.generate_fn(judge.weights, prefixes, key=key, n=n, suffix_ids=suffixes, **kwargs)
    else:
        rows = list(range(len(ids)))
        result = judge.generate_fn(judge.weights, [*ids, *[[eos]] * (count - len(ids))], key=key, n=1, **kwargs)
    texts = data.decode_responses(judge.tokenizer, result, keep_special_tokens=False)
    finishes = np.asarray(result.finish_reason)
    return [texts[r] for r in rows], [str(finishes[r]) for r in rows]


def _group_by_prefix(ids: Sequence[Sequence[int]], shared: Sequence[int], filler: int
                     ) -> tuple[list[list[int]], list[list[int]], list[int], int]:
    """The distinct shared parts (U, agreed across processes), n = the most suffixes of one (a bucket, agreed
    too), the U·n suffixes (row u·n + j; fillers `[filler]`, read by no one), and each prompt's row."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (x, k) in enumerate(zip(ids, shared)):
        groups.setdefault(tuple(x[:k]), []).append(i)
    most_prefixes, most_suffixes = distributed.max_over_processes(len(groups), max(map(len, groups.values()), default=1))
    n = padding.bucket_size(most_suffixes)
    prefixes = [list(p) for p in groups] + [[filler]] * (max(most_prefixes, 1) - len(groups))
    suffixes, rows = [[filler]] * (len(prefixes) * n), [0] * len(ids)
    for u, members in enumerate(groups.values()):
        for j, i in enumerate(members):
            suffixes[u * n + j], rows[i] = list(ids[i][shared[i]:]), u * n + j
    return prefixes, suffixes, rows, n


def _run_judge(
    judge: Judge,
    config: JudgeSpec,
    requests: Sequence[_Request],
    questions: Sequence[str],
    responses: Sequence[str],
    num_slots: int,
    key: jax.Array,
    stats: dict[str, Any],
    causes_SxL: np.ndarray,
    store: VerdictStore | None,
) -> np.ndarray:
    """Scores [S, L] for one judge: NaN where a sample never produced a valid verdict, whose cause
    (FAILURE_CAUSES) is written into `causes_SxL`. Answers found in `store` are not generated again; every
    generated answer is written to it right after its call."""
    scores_SxL = np.full((config.samples, num_slots), np.nan)
    if store is not None:
        check_fingerprint(judge, store)
    reserved = special_tokens(judge.tokenizer) if judge.tokenizer is not None else list(COMMON_SPECIAL_TOKENS)
    seeds = [_request_seed(questions[req.row], responses[req.row], req.dims) for req in requests]
    row_seeds = [_request_seed(questions[req.row], responses[req.row], ()) for req in requests]
    seed_hex = key_words(key).tobytes().hex()
    pending = [(r, s) for r in range(len(requests)) for s in range(config.samples)]
    for round_index, round_key in enumerate(jax.random.split(key, config.max_retries + 1)):
        prompt_key, gen_key = jax.random.split(round_key)
        prompts = [
            _build_prompt(requests[r], questions[requests[r].row], responses[requests[r].row], config,
                          host_rng(prompt_key, seeds[r], s), reserved, host_rng(prompt_key, row_seeds[r], s))
            for r, s in pending
        ]
        if judge.tokenizer is not None:
            ids, shared = encode_prompts(judge.tokenizer, prompts)
            fits = [len(x) <= judge.max_prompt_tokens for x in ids]
            digests = [prompt_digest(x) for x in ids]
        else:  # a served judge without a local tokenizer: its prompts are keyed by their chat messages
            ids, fits = [], [True] * len(prompts)
            digests = [messages_digest(p.messages) for p in prompts]
        stats["judge_prompt_too_long"] += fits.count(False)
        for (r, s), ok in zip(pending, fits):
            if not ok:
                first = requests[r].first_slot
                causes_SxL[s, first : first + len(requests[r].dims)] = "judge_prompt_too_long"
        sent = [i for i, ok in enumerate(fits) if ok]
        entry = {i: (judge.name, digests[i], pending[i][1], seed_hex) for i in sent}
        found = store.get(entry.values()) if store is not None else {}
        answers = {i: _reparsed(found[entry[i]], prompts[i], stats) for i in sent if entry[i] in found}
        misses = [i for i in sent if i not in answers]
        stats["judge_store_hits"] += len(answers)
        if round_index > 0:
            stats["judge_retried"] += len(misses)
        # The round's generate calls are global: every process makes as many, each with as many prompts, and
        # draws the same sampling key (the salt is agreed on); a process with fewer misses pads its calls.
        most_sent, most_pending, salt = distributed.max_over_processes(
            len(misses), len(pending), _call_salt([entry[i][1] for i in misses]))
        if not most_pending:
            break
        if judge.http is not None:
            generated = _answer_over_http(judge, prompts, misses, requests, pending, causes_SxL, stats)
        else:
            generated = {}
            chunk = judge.batch_size or max(most_sent, 1)
            for c, start in enumerate(range(0, most_sent, chunk)):
                mine = misses[start:start + chunk]
                grouped = [shared[i] for i in mine] if config.layout == "shared_prefix" else None
                texts, finishes = _generate(judge, [ids[i] for i in mine], grouped,
                                            min(chunk, most_sent - start),
                                            jax.random.fold_in(jax.random.fold_in(gen_key, salt), c))
                stats["judge_generate_calls"] += 1
                for i, text, finish in zip(mine, texts, finishes):
                    generated[i] = parsed_answer(text, finish, prompts[i])
                _keep(store, [(entry[i], generated[i]) for i in mine], stats)
        if judge.http is not None:
            _keep(store, [(entry[i], answer) for i, answer in generated.items()], stats)
        answers.update(generated)
        stats["judge_prompts"] += len(generated)
        still_invalid = []
        for i in sent:
            if i not in answers:  # a served judge that never answered: its cause is set, it is not re-prompted
                continue
            r, s = pending[i]
            answer, first = answers[i], requests[r].first_slot
            cut = answer.finish_reason == sampling.FINISH_LENGTH
            if answer.valid and not cut:
                scores = np.asarray(answer.scores)
                scores_SxL[s, first : first + len(requests[r].dims)] = scores[::-1] if config.reverse_order else scores
                continue
            causes_SxL[s, first : first + len(requests[r].dims)] = "judge_truncated" if cut else "judge_invalid_verdict"
            if i in misses:  # the counters count this call's judge work; stored failures are retried all the same
                stats["judge_invalid"] += 1
                if len(stats["judge_invalid_examples"]) < 5:
                    reason = "truncated at max_new_tokens" if cut else answer.reason
                    stats["judge_invalid_examples"].append(f"{judge.name}: {reason}")
            still_invalid.append((r, s))
        pending = still_invalid
    return scores_SxL


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


def _answer_over_http(judge: Judge, prompts: Sequence[JudgePrompt], misses: Sequence[int],
                      requests: Sequence[_Request], pending: Sequence[tuple[int, int]], causes_SxL: np.ndarray,
                      stats: dict[str, Any]) -> dict[int, StoredAnswer]:
    """The parsed answers of the prompts `misses` from the judge's endpoint (this process's prompts only: the
    endpoint samples, no collective call). A prompt that never got an answer (refused for its context, or no
    answer after the HTTP retries) gets its cause in `causes_SxL` and no answer: it is not stored or re-prompted."""
    replies = judge.http.answer([prompts[i].messages for i in misses], sampler=judge.sampler,
                                max_tokens=judge.max_new_tokens, stats=stats)
    answers = {}
    for i, reply in zip(misses, replies):
        if reply.cause:
            r, s = pending[i]
            first = requests[r].first_slot
            causes_SxL[s, first : first + len(requests[r].dims)] = reply.cause
            stats["judge_prompt_too_long"] += reply.cause == "judge_prompt_too_long"
            if reply.error and len(stats.setdefault("judge_http_error_examples", [])) < 5:
                stats["judge_http_error_examples"].append(f"{judge.name}: {reply.error}")
            continue
        answers[i] = parsed_answer(reply.text, reply.finish, prompts[i])
    return answers


def parsed_answer(text: str, finish: str, prompt: JudgePrompt) -> StoredAnswer:
    """A judge's answer to `prompt` with its verdict parsed from the text (parser.parse_verdict)."""
    verdict = parse_verdict(text, prompt.keys, prompt.ranges)
    return StoredAnswer(text, finish, verdict.valid, tuple(verdict.scores.tolist()), verdict.reason)


def _reparsed(stored: StoredAnswer, prompt: JudgePrompt, stats: dict[str, Any]) -> StoredAnswer:
    """A stored answer with its verdict parsed again from its text (the text is the truth: a store whose scores were
    edited, or do not decode, cannot change a score); one whose stored verdict differs is counted in
    judge_store_mismatches."""
    answer = parsed_answer(stored.text, stored.finish_reason, prompt)
    same = (stored.valid == answer.valid and len(stored.scores) == len(answer.scores)
            and np.array_equal(stored.scores, answer.scores, equal_nan=True))
    stats["judge_store_mismatches"] += not same
    return answer


def _keep(store: VerdictStore | None, answers: list[tuple[Any, StoredAnswer]], stats: dict[str, Any]) -> None:
    """Writes `answers` to `store` (none: nothing); a read-only store keeps none of them, counted in
    judge_store_unsaved (its hits are still read: store.VerdictStore)."""
    if store is None or not answers:
        return
    if store.read_only:
        stats["judge_store_unsaved"] += len(answers)
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
    replies = judge.http.answer([p.messages for p in prompts], sampler="greedy", max_tokens=judge.max_new_tokens,
                                stats={})
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
    client = judge.http
    if client is None or client.identity or (str(store.path), store.judge_hash) in client.fingerprinted:
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
    requests: list[_Request] = []
    slot_rows: list[int] = []
    for row, dims in enumerate(dims_per_row):
        groups = [(d,) for d in dims] if config.mode == "per_dimension" else ([tuple(dims)] if dims else [])
        for group in groups:
            requests.append(_Request(row, group, len(slot_rows)))
            slot_rows.extend([row] * len(group))
    num_slots = len(slot_rows)
    ranges_Lx2 = np.asarray([d.scale.raw_range for req in requests for d in req.dims], dtype=np.float64).reshape(-1, 2)
    stats: dict[str, Any] = {
        "judge_prompts": 0, "judge_generate_calls": 0, "judge_invalid": 0, "judge_retried": 0,
        "judge_prompt_too_long": 0, "judge_store_hits": 0, "judge_store_mismatches": 0, "judge_store_unsaved": 0,
        "judge_invalid_examples": [],
    }
    per_judge = []
    causes_JxSxL = np.full((len(judges), config.samples, num_slots), "", dtype=object)
    for j, (judge, judge_key) in enumerate(zip(judges, jax.random.split(key, len(judges)))):
        scores_SxL = _run_judge(judge, config, requests, questions, responses, num_slots, judge_key, stats,
                                causes_JxSxL[j], store)
        per_judge.append(scores_SxL)
    summarize(stats)  # an HTTP judge's latencies -> percentiles
    scores_JxSxL = np.stack(per_judge)
    valid_JxSxL = ~np.isnan(scores_JxSxL)
    any_valid_JxL = valid_JxSxL.any(axis=1)
    median_JxL = np.full((len(judges), num_slots), np.nan)
    median_JxL[any_valid_JxL] = np.nanmedian(scores_JxSxL.transpose(0, 2, 1)[any_valid_JxL], axis=-1)
    spread_JxL = np.where(valid_JxSxL, scores_JxSxL, -np.inf).max(axis=1) - np.where(
        valid_JxSxL, scores_JxSxL, np.inf).min(axis=1)
    combined_L = combine_judges(median_JxL, ranges_Lx2, config.ensemble)
    stats["judge_scores"] = num_slots
    stats["judge_failed_samples"] = int((~valid_JxSxL).sum())
    stats["judge_sample_spread_mean"] = float(spread_JxL[any_valid_JxL].mean()) if any_valid_JxL.any() else float("nan")
    stats["sample_spread_count"] = int(any_valid_JxL.sum())  # the mean's weight when blocks of rows are joined
    slot_rows_L = np.asarray(slot_rows, dtype=np.int64)
    causes_L = np.asarray([_most_common_cause(causes_JxSxL[:, :, slot]) if np.isnan(combined_L[slot]) else ""
                           for slot in range(num_slots)], dtype=object)
    if config.cascade is not None:
        slot_dims = [d for req in requests for d in req.dims]
        escalate_L = cascade.uncertain(config, slot_dims, scores_JxSxL.reshape(len(judges) * config.samples, num_slots),
                                       combined_L)
        _refine(refiners, config.cascade, questions, responses, slot_rows_L, slot_dims, escalate_L, combined_L,
                causes_L, cascade.refine_key(key), store, stats)
    stats["judge_failed_scores"] = int(np.isnan(combined_L).sum())
    rows = range(len(dims_per_row))
    return JudgeOutput([combined_L[slot_rows_L == row] for row in rows], stats,
                       [causes_L[slot_rows_L == row].tolist() for row in rows])


def _refine(refiners: Sequence[Judge], spec: JudgeSpec, questions: Sequence[str], responses: Sequence[str],
            slot_rows_L: np.ndarray, slot_dims: Sequence[Dimension], escalate_L: np.ndarray, combined_L: np.ndarray,
            causes_L: np.ndarray, key: jax.Array, store: VerdictStore | None, stats: dict[str, Any]) -> None:
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
    stats["judge_cascade_screened"] = len(escalate_L)
    stats["judge_cascade_escalated"] = int(escalate_L.sum())
    stats["judge_cascade_escalated_frac"] = escalated_frac(stats)
    for name in ("judge_prompts", "judge_generate_calls", "judge_store_hits", "judge_failed_scores"):
        stats[name.replace("judge_", "judge_cascade_", 1)] = refined.details[name]


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
    prompt = _build_prompt(_Request(0, tuple(dims), 0), question, "", config, np.random.default_rng(0),
                           special_tokens(judge.tokenizer))
    return len(encode_prompts(judge.tokenizer, [prompt])[0][0])


def judge_tokens_per_token(judge: Judge, tokenizer: Any) -> int:
    """The most judge tokens the text of one token of `tokenizer` (a policy's, special tokens included) takes in
    `judge`'s prompt (reserved strings replaced as the fence replaces them). Times a response's token count it
    estimates the response's judge tokens at worst (token by token: merges across tokens are not counted)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    reserved = special_tokens(judge.tokenizer)
    ids = judge.tokenizer([without_reserved(t, reserved) for t in texts], add_special_tokens=False)["input_ids"]
    return max(map(len, ids), default=0)
