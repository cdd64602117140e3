"""Judge throughput: all judge prompts of a step in ONE batched generate call vs one generate call per item.

  PYTHONPATH=. .venv/bin/python benchmarks/bench_judge.py [--items=32] [--max_new_tokens=64] [--repeats=3]

Same run, same tiny judge (the shipped tiny Qwen2 config and tokenizer, random weights, context
extended to fit judge prompts), same prompts (configs/rubrics/medical_qa.yaml's LLM dimensions, with all anchor examples or
`--compact` without them; one prompt per (response, dimension), greedy, no retries). Both paths are warmed up (every prompt/response
bucket compiled) before timing; each measures `llm_judge.judge_rows` end to end (prompt building,
chat template, tokenization, generate, decode, parse). Reports the median over repeats.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import jax
from absl import app, flags
from transformers import AutoTokenizer

from rubric_jax import data, loader, sampling
from rubric_jax.assets import TINY_DIR
from rubric_jax.judges.llm_judge import Judge, judge_rows
from rubric_jax.judges.prompts import single_prompt
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.io import load_rubric

_ITEMS = flags.DEFINE_integer("items", 32, "Judged (response, dimension) items per step.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Judge generation budget per item.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per path (median reported).")
_COMPACT = flags.DEFINE_bool("compact", False, "Drop anchor examples (shorter prompts, decode-dominated).")
RUBRIC = Path(__file__).resolve().parents[1] / "configs" / "rubrics" / "medical_qa.yaml"
RESPONSES = (
    "Cool the burn under cool running water for ten minutes, then cover it loosely with a clean dressing.",
    "Put butter on it and pop any blisters so it heals faster.",
    "用凉水冲洗烫伤处十到二十分钟，不要涂牙膏，若面积大或起泡严重建议就医。",
    "It depends. First, stay calm. Second, think. Finally, decide.",
)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    del argv
    rubric = load_rubric(RUBRIC)
    llm_dims = [d for d in rubric.dimensions if d.kind == "llm"]
    if _COMPACT.value:
        llm_dims = [dataclasses.replace(d, anchors={k: dataclasses.replace(a, positive_examples=(), negative_examples=())
                                                    for k, a in d.anchors.items()}) for d in llm_dims]
    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR / "tokenizer")
    cfg = ModelConfig.from_hf_dir(TINY_DIR, max_position_embeddings=8192)
    judge = Judge("tiny-random", loader.init_weights(cfg, None, jax.random.key(0)), tokenizer, sampling.generate, sampler="greedy",
                  max_new_tokens=_MAX_NEW.value, max_prompt_tokens=8192)
    config = JudgeSpec(samples=1, max_retries=0, shuffle_anchors=False)
    n = _ITEMS.value
    questions = ["How should I treat a mild burn at home?"] * n
    responses = [f"{RESPONSES[i % len(RESPONSES)]} ({i})" for i in range(n)]
    dims = [[llm_dims[i % len(llm_dims)]] for i in range(n)]
    key = jax.random.key(0)
    lengths = [len(ids) for ids in data.encode_chats(tokenizer, [
        single_prompt(q, r, d[0], nonce="0" * 16).messages for q, r, d in zip(questions, responses, dims)])]

    def batched():
        judge_rows([judge], config, questions, responses, dims, key)

    def per_item():
        for i in range(n):
            judge_rows([judge], config, questions[i : i + 1], responses[i : i + 1], dims[i : i + 1], key)

    warm = {"batched": _timed(batched), "per_item": _timed(per_item)}
    times = {"batched": [], "per_item": []}
    for _ in range(_REPEATS.value):
        times["batched"].append(_timed(batched))
        times["per_item"].append(_timed(per_item))
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "items": n, "max_new_tokens": _MAX_NEW.value, "compact": _COMPACT.value,
        "prompt_tokens": [min(lengths), max(lengths)], "repeats": _REPEATS.value,
        "batched_items_per_s": n / median["batched"], "per_item_items_per_s": n / median["per_item"],
        "speedup": median["per_item"] / median["batched"],
        "batched_s": times["batched"], "per_item_s": times["per_item"], "warmup_s": warm,
        "generate_traces": dict(sampling.TRACES), "load_average_1m": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    app.run(main)
