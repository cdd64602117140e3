"""The one text-generation interface of rubric construction: chat prompts -> texts, with an explicit key.

`TextGenerator` is what the pipeline calls: `generator(prompts, key, n=..., max_new_tokens=...)` returns
n generations per prompt (row b * n + j is sample j of prompt b) in ONE batched call. The in-process
implementation, `ModelTextGenerator`, chat-templates and decodes exactly as the LLM judge does
(`data.encode_chats`, `data.decode_responses`) and samples with `sampling.generate` on the
decode layout; a prompt that does not fit the model's context is not sent and comes back as finish "too_long".
`EndpointTextGenerator` sends the same chats to the judge's OpenAI-compatible endpoint (`qurl.generator=judge`:
an API model or experiments.serve builds the rubrics). Tests use a scripted implementation. `load_language_model` is the one place this package loads a model,
through rubric_jax.loader: a Hugging Face directory, or (the tiny default, which ships config.json and a
tokenizer only) a seeded random init, built directly in the decode layout.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

from rubric_jax import data, loader, sampling, sharding
from rubric_jax.judges.backends import HttpBackend, SamplerBackend
from rubric_jax.judges.http_backend import COMMON_SPECIAL_TOKENS, HttpCounters
from rubric_jax.judges.llm_judge import Judge, special_tokens
from rubric_jax.models.config import ModelConfig
from rubric_jax.qurl.templates import ChatPrompt

FINISH_STOP, FINISH_LENGTH, FINISH_TOO_LONG, FINISH_ERROR = "stop", "length", "too_long", "error"


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generated text and why it ended: "stop" (eos), "length" (max_new_tokens), "too_long" (not sent) or
    "error" (an endpoint gave no answer after its retries; `error` says why)."""

    text: str
    finish: str
    error: str = ""


class TextGenerator(Protocol):
    """Chat prompts -> n generations each, one batched call; `reserved` strings must never appear in
    untrusted text put into a prompt (the tokenizer's special tokens)."""

    reserved: tuple[str, ...]

    def __call__(self, prompts: Sequence[ChatPrompt], key: jax.Array, *, n: int,
                 max_new_tokens: int) -> list[Generation]: ...


@dataclasses.dataclass(frozen=True)
class LanguageModel:
    """A loaded model's Weights placed in `layout`, with its tokenizer (chat template, pad and eos)."""

    name: str
    weights: loader.Weights
    tokenizer: Any
    layout: sharding.Layout

    @property
    def max_positions(self) -> int:
        return self.weights.cfg.max_position_embeddings


@dataclasses.dataclass(frozen=True)
class ModelTextGenerator:
    """TextGenerator over a LanguageModel and `sampling.generate` (replaceable, for counting calls in tests)."""

    model: LanguageModel
    sampler: str
    generate_fn: Callable[..., Any] = sampling.generate

    def __post_init__(self) -> None:
        sampling.parse_sampler(self.sampler)

    @property
    def reserved(self) -> tuple[str, ...]:
        return tuple(special_tokens(self.model.tokenizer))

    def __call__(self, prompts: Sequence[ChatPrompt], key: jax.Array, *, n: int,
                 max_new_tokens: int) -> list[Generation]:
        tokenizer = self.model.tokenizer
        ids = data.encode_chats(tokenizer, [p.messages for p in prompts])
        limit = self.model.max_positions - max_new_tokens
        sent = [i for i, x in enumerate(ids) if len(x) <= limit]
        out = [Generation("", FINISH_TOO_LONG)] * (len(prompts) * n)
        if not sent:
            return out
        result = self.generate_fn(
            self.model.weights, [ids[i] for i in sent], key=key, n=n,
            max_new_tokens=max_new_tokens, sampler=self.sampler, stop_tokens=[tokenizer.eos_token_id],
            pad_id=tokenizer.pad_token_id, layout=self.model.layout)
        texts = data.decode_responses(tokenizer, result, keep_special_tokens=False)
        truncated = np.asarray(result.finish_reason) == sampling.FINISH_LENGTH
        for row, (text, cut) in enumerate(zip(texts, truncated)):
            out[sent[row // n] * n + row % n] = Generation(text, FINISH_LENGTH if cut else FINISH_STOP)
        return out


@dataclasses.dataclass(frozen=True)
class EndpointTextGenerator:
    """TextGenerator over an OpenAI-compatible endpoint (the judge's: http_backend.HttpJudgeClient). Each of the
    n samples of a prompt is its own request; the endpoint samples with its own seeds, so `key` cannot make a
    build reproducible there (a resumed build still reuses what was saved)."""

    client: Any  # http_backend.HttpJudgeClient
    sampler: str
    stats: HttpCounters = dataclasses.field(default_factory=HttpCounters)  # judge_http_* counters of every call

    @property
    def reserved(self) -> tuple[str, ...]:
        tokenizer = self.client.tokenizer
        return tuple(special_tokens(tokenizer)) if tokenizer is not None else COMMON_SPECIAL_TOKENS

    def __call__(self, prompts: Sequence[ChatPrompt], key: jax.Array, *, n: int,
                 max_new_tokens: int) -> list[Generation]:
        del key  # the endpoint's sampling is its own
        chats = [p.messages for p in prompts for _ in range(n)]
        answers = self.client.answer(chats, sampler=self.sampler, max_tokens=max_new_tokens, stats=self.stats)
        return [Generation(a.text, a.finish) if not a.cause else
                Generation("", FINISH_TOO_LONG if a.cause == "judge_prompt_too_long" else FINISH_ERROR, a.error)
                for a in answers]


def judge_generator(judge: Judge, sampler: str) -> TextGenerator:
    """A judge's backend as a TextGenerator (what writes evolving rubrics): its endpoint (a served or API judge), or its
    in-process weights and tokenizer."""
    if isinstance(judge.backend, HttpBackend):
        return EndpointTextGenerator(judge.backend.client, sampler)
    return ModelTextGenerator(LanguageModel(judge.name, judge.backend.weights, judge.tokenizer, judge.backend.layout),
                              sampler)


def judge_from_model(model: LanguageModel, *, sampler: str, max_new_tokens: int) -> Judge:
    """The same model (same parameter arrays, no copy) as an LLM judge for RubricReward."""
    if max_new_tokens >= model.max_positions:
        raise ValueError(f"judge max_new_tokens={max_new_tokens} leaves no room in the {model.max_positions}-token "
                         f"context of {model.name}")
    return Judge(model.name, model.tokenizer, SamplerBackend(model.weights, sampling.generate, model.layout),
                 sampler=sampler, max_new_tokens=max_new_tokens, max_prompt_tokens=model.max_positions - max_new_tokens)


def load_language_model(*, checkpoint: str, config_json: str, tokenizer_dir: str, layout: sharding.Layout, seed: int,
                        **overrides: Any) -> LanguageModel:
    """A HF checkpoint directory (or, with `checkpoint` empty, a random init from `config_json` seeded by
    `seed`) with parameters built in `layout`; `overrides` set ModelConfig fields."""
    from transformers import AutoTokenizer  # slow import (pulls torch when installed); only loading needs it

    tokenizer_dir = tokenizer_dir or checkpoint
    if not tokenizer_dir or not Path(tokenizer_dir).is_dir():
        raise FileNotFoundError(f"{tokenizer_dir or '(none)'}: tokenizer directory does not exist")
    if checkpoint:
        if not Path(checkpoint).is_dir():
            raise FileNotFoundError(f"{checkpoint}: checkpoint directory does not exist")
        weights = loader.load_weights(checkpoint, layout, **overrides)
        name = checkpoint
    else:
        if not config_json or not Path(config_json).is_file():
            raise FileNotFoundError(f"{config_json or '(none)'}: model config.json does not exist")
        cfg = ModelConfig.from_hf_dict(json.loads(Path(config_json).read_text()), **overrides)
        weights = loader.init_weights(cfg, layout, jax.random.key(seed))
        name = f"random init of {config_json} (seed {seed})"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None or not tokenizer.chat_template:
        raise ValueError(f"{tokenizer_dir}: the tokenizer needs pad and eos tokens and a chat template")
    if len(tokenizer) > weights.cfg.vocab_size:
        raise ValueError(f"{tokenizer_dir}: {len(tokenizer)} tokens but the model's vocab_size is {weights.cfg.vocab_size}")
    return LanguageModel(name, weights, tokenizer, layout)
