"""Judge backends: what answers a judge's prompts. Prompts in, texts out, usage counters on the side.

`JudgeBackend` is the interface llm_judge's one retry loop (and its one parser) runs over; the verdict store and the
cascade are layers around that loop, never inside a backend. Three implementations:
  SamplerBackend  sampling.generate in this process. Its calls are global in a multi-process job: every process
                  makes as many calls with as many prompts (the most of any process, agreed by the loop), padding
                  its own with one-token fillers, in calls of at most `batch_size` prompts; in the shared_prefix
                  layout prompts with the same shared part are one prompt continued by their suffixes.
  HttpBackend     an OpenAI-compatible endpoint (judges/http_backend.py): this process's prompts only, no global call;
                  a prompt the endpoint never answers comes back as an Answer with a cause (judge_http_error, or
                  judge_prompt_too_long when the server refused it for its context), and is not re-prompted.
  SharedBaseBackend  a SamplerBackend on the policy's frozen LoRA base (judge.share_policy_base), bound per scoring.
Usage counters: a sampler's generate calls (JudgeStats.judge_generate_calls), an endpoint's judge_http_* counters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import jax
import numpy as np

from rubric_jax import data, distributed, padding
from rubric_jax.judges.http_backend import Answer, HttpCounters
from rubric_jax.judges.prompts import JudgePrompt
from rubric_jax.models import lora

if TYPE_CHECKING:  # types only: llm_judge imports this module
    from rubric_jax.judges.llm_judge import Judge, JudgeStats


@dataclasses.dataclass(frozen=True)
class Batch:
    """One round's prompts for a backend: this process's prompts, their token ids ([] without a local tokenizer),
    their shared parts' lengths (the shared_prefix layout; None otherwise), and what every process agreed on: the
    most prompts any process sends (`most_sent`) and the round's sampling key (salted with all their digests)."""

    prompts: Sequence[JudgePrompt]
    ids: Sequence[Sequence[int]]
    shared: Sequence[int] | None
    most_sent: int
    key: jax.Array


class JudgeBackend(Protocol):
    """Answers a round's prompts of `judge` (its tokenizer, sampler and max_new_tokens): yields each call's Answers
    (text and finish reason, or a cause), in prompt order, the calls together covering `batch.prompts`; counts its
    usage into `stats`."""

    def calls(self, judge: Judge, batch: Batch, stats: JudgeStats) -> Iterator[list[Answer]]: ...


@dataclasses.dataclass(frozen=True)
class SamplerBackend:
    """`generate_fn` (sampling.generate, or a test's double) on `weights` (loader.Weights, per layer, in `layout`;
    default: one device) in this process: one global call per chunk of `batch_size` prompts (0: all of a round in
    one call, which bounds nothing; a batch size bounds the judge's KV cache)."""

    weights: Any
    generate_fn: Callable[..., Any]
    layout: Any = None  # sharding.Layout
    batch_size: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 0:
            raise ValueError(f"judge batch_size must be an integer >= 0, got {self.batch_size!r}")

    def calls(self, judge: Judge, batch: Batch, stats: JudgeStats) -> Iterator[list[Answer]]:
        chunk = self.batch_size or max(batch.most_sent, 1)
        for c, start in enumerate(range(0, batch.most_sent, chunk)):
            mine = slice(start, start + chunk)
            shared = batch.shared[mine] if batch.shared is not None else None
            texts, finishes = self._generate(judge, batch.ids[mine], shared, min(chunk, batch.most_sent - start),
                                             jax.random.fold_in(batch.key, c))
            stats.judge_generate_calls += 1
            yield [Answer(text, finish) for text, finish in zip(texts, finishes)]

    def _generate(self, judge: Judge, ids: Sequence[Sequence[int]], shared: Sequence[int] | None, count: int,
                  key: jax.Array) -> tuple[list[str], list[str]]:
        """Answer texts and finish reasons of `ids` in one generate call of `count` prompts (fillers pad it); with
        `shared` (the shared_prefix layout, on every process alike), prompts whose first `shared` tokens agree are one
        prompt continued by their suffixes, and the call's shape is agreed in `group_by_prefix` instead of by `count`."""
        eos = judge.tokenizer.eos_token_id
        kwargs = dict(max_new_tokens=judge.max_new_tokens, sampler=judge.sampler, stop_tokens=[eos],
                      pad_id=judge.tokenizer.pad_token_id, layout=self.layout)
        if shared is not None:
            prefixes, suffixes, rows, n = group_by_prefix(ids, shared, eos)
            result = self.generate_fn(self.weights, prefixes, key=key, n=n, suffix_ids=suffixes, **kwargs)
        else:
            rows = list(range(len(ids)))
            result = self.generate_fn(self.weights, [*ids, *[[eos]] * (count - len(ids))], key=key, n=1, **kwargs)
        texts = data.decode_responses(judge.tokenizer, result, keep_special_tokens=False)
        finishes = np.asarray(result.finish_reason)
        return [texts[r] for r in rows], [str(finishes[r]) for r in rows]


@dataclasses.dataclass(frozen=True)
class SharedBaseBackend:
    """The policy's frozen base as the judge (judge.share_policy_base): a SamplerBackend on the base's decode copy
    that `decode` makes from a LoRA policy's params with the adapters left out, as the policy's own rollout copy is
    made (train/programs.Layouts.rollout_weights). No weights are loaded or kept: each scoring binds the copy made
    with its rollout (`using`, per thread, so the one-step off-policy judging thread reads its own batch's)."""

    decode: Callable[[Any], Any]  # a model's params (training layout, no adapters) -> loader.Weights to sample
    generate_fn: Callable[..., Any]
    layout: Any  # sharding.Layout of the decode copy
    context: int  # the policy's context in tokens
    batch_size: int = 0
    bound: threading.local = dataclasses.field(default_factory=threading.local, compare=False)

    def weights_of(self, params: Any) -> Any:
        """The judge's weights for a policy of `params` (adapters and base): the base's decode copy, made now."""
        return self.decode(lora.strip(params))

    @contextlib.contextmanager
    def using(self, weights: Any) -> Iterator[None]:
        """Judges with `weights` (`weights_of`) in this thread while the block runs."""
        before, self.bound.weights = getattr(self.bound, "weights", None), weights
        try:
            yield
        finally:
            self.bound.weights = before

    def calls(self, judge: Judge, batch: Batch, stats: JudgeStats) -> Iterator[list[Answer]]:
        weights = getattr(self.bound, "weights", None)
        if weights is None:
            raise RuntimeError("the judge sharing the policy's base judges only inside a scoring that bound a policy "
                               "(SharedBaseBackend.using)")
        yield from SamplerBackend(weights, self.generate_fn, self.layout, self.batch_size).calls(judge, batch, stats)


def group_by_prefix(ids: Sequence[Sequence[int]], shared: Sequence[int], filler: int
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


@dataclasses.dataclass(frozen=True)
class HttpBackend:
    """`client` (an http_backend.HttpJudgeClient) answering this process's prompts in one call of concurrent
    requests; its judge_http_* counters go into stats.http (made at its first round)."""

    client: Any

    def calls(self, judge: Judge, batch: Batch, stats: JudgeStats) -> Iterator[list[Answer]]:
        stats.http = stats.http or HttpCounters()
        yield self.client.answer([p.messages for p in batch.prompts], sampler=judge.sampler,
                                 max_tokens=judge.max_new_tokens, stats=stats.http)
