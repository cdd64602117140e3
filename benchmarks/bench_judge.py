"""Judge throughput, two comparisons measured in one run each.

--compare=batching (default): all judge prompts of a step in ONE batched generate call vs one generate call per item.
  PYTHONPATH=. .venv/bin/python benchmarks/bench_judge.py [--items=32] [--max_new_tokens=64] [--repeats=3]

Same run, same tiny judge (the shipped tiny Qwen2 config and tokenizer, random weights, context
extended to fit judge prompts), same prompts (configs/rubrics/medical_qa.yaml's LLM dimensions, with all anchor examples or
`--compact` without them; one prompt per (response, dimension), greedy, no retries). Both paths are warmed up (every prompt/response
bucket compiled) before timing; each measures `llm_judge.judge_rows` end to end (prompt building,
chat template, tokenization, generate, decode, parse). Reports the median over repeats.

--compare=layouts: judge.layout=criteria_first (each (response, dimension) prompt prefilled whole) vs shared_prefix
(a response prefilled once, its criteria continuing from its cache), interleaved in one process.
  PYTHONPATH=. .venv/bin/python benchmarks/bench_judge.py --compare=layouts [--items=16] [--response_tokens=512]

The shipped distilled tiny judge (rubric_jax/assets/tiny_judge, its tokenizer; context raised to 2048 for
512-token responses) with configs/judges/tiny.py's settings (compact prompt, greedy, 1 sample, 16 new tokens) and
no retries, the 6 LLM dimensions of configs/rubrics/medical_qa.yaml and customer_service.yaml, responses of
exactly `--response_tokens` tiny-tokenizer tokens cut from rubric_jax/assets/tiny/sft.jsonl. Items/s = responses
(each with 6 verdicts) per second of wall time, median over repeats; CPU time (process_time) beside it; the
agreement of the two layouts' verdicts over every (response, dimension).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags
from transformers import AutoTokenizer

from rubric_jax import data, loader, sampling, sharding
from rubric_jax.assets import TINY_DIR, TINY_JUDGE_DIR
from rubric_jax.judges.backends import SamplerBackend
from rubric_jax.judges.llm_judge import Judge, encode_prompts, judge_rows, special_tokens
from rubric_jax.judges.prompts import compact_single_prompt, single_prompt
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.models.checkpoint import load_tokenizer
from rubric_jax.models.config import ModelConfig
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import dimension_from_dict

_ITEMS = flags.DEFINE_integer("items", 32, "Judged (response, dimension) items per step.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Judge generation budget per item.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per path (median reported).")
_COMPACT = flags.DEFINE_bool("compact", False, "Drop anchor examples (shorter prompts, decode-dominated).")
_COMPARE = flags.DEFINE_enum("compare", "batching", ["batching", "layouts"], "What to compare (module docstring).")
_RESPONSE_TOKENS = flags.DEFINE_integer("response_tokens", 512, "--compare=layouts: tokens per judged response.")
REPO = Path(__file__).resolve().parents[1]
RUBRIC = REPO / "configs" / "rubrics" / "medical_qa.yaml"
LAYOUT_RUBRICS = (RUBRIC, REPO / "configs" / "rubrics" / "customer_service.yaml")
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


def _timed_cpu(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of fn() in this process (CPU: every thread's, XLA's included)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _responses(tokenizer, count: int, tokens: int) -> list[str]:
    """`count` distinct responses of exactly `tokens` tokens: the tiny SFT answers, concatenated from a different
    start each, cut at `tokens` tokens and decoded (the output reports their re-encoded lengths)."""
    answers = [json.loads(line)["response"] for line in (TINY_DIR / "sft.jsonl").read_text().splitlines()]
    out = []
    for i in range(count):
        ids: list[int] = []
        j = i
        while len(ids) < tokens + 8:
            ids += tokenizer(answers[j % len(answers)] + " ", add_special_tokens=False)["input_ids"]
            j += 7
        out.append(tokenizer.decode(ids[:tokens]))
    return out


def _without_examples(dims):
    """The dimensions with their anchors' examples dropped (criteria about a third as long)."""
    return [dataclasses.replace(d, anchors={k: dataclasses.replace(a, positive_examples=(), negative_examples=())
                                            for k, a in d.anchors.items()}) for d in dims]


def compare_layouts() -> dict:
    """criteria_first vs shared_prefix on the tiny judge, interleaved, for the rubric's criteria with their anchor
    examples and without them (`--compact`: without only); see the module docstring."""
    full_dims = [d for path in LAYOUT_RUBRICS for d in load_rubric(path).dimensions if d.kind == "llm"]
    assert len(full_dims) == 6, [d.id for d in full_dims]
    tokenizer = load_tokenizer(TINY_JUDGE_DIR)
    context, max_new = 2048, 16
    weights = loader.to_layout(loader.load_weights(TINY_JUDGE_DIR, max_position_embeddings=context),
                               sharding.single_device_layout(), per_layer=True)
    judge = Judge("tiny_judge", tokenizer, SamplerBackend(weights, sampling.generate), sampler="greedy", max_new_tokens=max_new,
                  max_prompt_tokens=context - max_new)
    n = _ITEMS.value
    responses = _responses(tokenizer, n, _RESPONSE_TOKENS.value)
    response_tokens = [len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in responses]
    questions = ["Please help me with my question."] * n
    specs = {layout: JudgeSpec(prompt="compact", samples=1, sampler="greedy", max_new_tokens=max_new, max_retries=0,
                               layout=layout) for layout in ("criteria_first", "shared_prefix")}
    key = jax.random.key(0)
    reserved = special_tokens(tokenizer)
    variants = {"anchors without examples": _without_examples(full_dims)}
    if not _COMPACT.value:
        variants = {"anchors with examples": full_dims, **variants}
    return {"items": n, "response_tokens": [min(response_tokens), max(response_tokens)], "max_new_tokens": max_new,
            "repeats": _REPEATS.value, **{name: _compare(judge, specs, questions, responses, dims, key, reserved)
                                          for name, dims in variants.items()},
            "own task (politeness, customer-service SFT answers)": _own_task_agreement(judge, specs, key),
            "generate_traces": dict(sampling.TRACES), "load_average_1m": os.getloadavg()[0]}


def _own_task_agreement(judge, specs, key) -> dict:
    """The layouts' verdict agreement on the task the tiny judge was distilled on: the LLM-judged politeness
    criterion of the tiny default's customer-service questions, over the tiny SFT set's customer-service answers."""
    rows = [json.loads(line) for line in (TINY_DIR / "questions_train.jsonl").read_text().splitlines()]
    politeness = next(dimension_from_dict(d) for row in rows for d in row["rubric"]["extra"] if d["id"] == "politeness")
    answers = [json.loads(line) for line in (TINY_DIR / "sft.jsonl").read_text().splitlines()]
    answers = [a for a in answers if a["category"] == "customer_service"]
    scores = {layout: np.concatenate(judge_rows([judge], spec, [a["prompt"] for a in answers],
                                                [a["response"] for a in answers], [[politeness]] * len(answers),
                                                key).scores) for layout, spec in specs.items()}
    first, shared = scores.values()
    both = ~np.isnan(first) & ~np.isnan(shared)
    return {"items": len(answers), "valid_share": {k: float(np.mean(~np.isnan(v))) for k, v in scores.items()},
            "agreement_exact": float(np.mean(first[both] == shared[both])), "both_valid_share": float(np.mean(both)),
            "mean_score": {k: float(np.nanmean(v)) for k, v in scores.items()}}


def _compare(judge, specs, questions, responses, dims, key, reserved) -> dict:
    """One rubric variant: the two layouts' prefill tokens per item, items/s, CPU time and verdict agreement."""
    n, tokenizer = len(responses), judge.tokenizer
    prefill = {}
    for layout in specs:  # tokens prefilled per response: every prompt whole, or the shared part once
        prompts = [compact_single_prompt(responses[0], d, nonce="0" * 16, reserved=reserved,
                                         response_first=layout == "shared_prefix") for d in dims]
        ids, shared = encode_prompts(tokenizer, prompts)
        prefill[layout] = sum(len(x) - k for x, k in zip(ids, shared)) + max(shared)

    def judge_all(layout):
        return judge_rows([judge], specs[layout], questions, responses, [dims] * n, key)

    warm = {layout: _timed_cpu(lambda layout=layout: judge_all(layout))[0] for layout in specs}
    times = {layout: [] for layout in specs}
    outs = {}
    for _ in range(_REPEATS.value):
        for layout in specs:
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            outs[layout] = judge_all(layout)
            times[layout].append((time.perf_counter() - start_wall, time.process_time() - start_cpu))
    wall = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    first, shared = (np.stack(outs[k].scores) for k in specs)
    both = ~np.isnan(first) & ~np.isnan(shared)
    return {
        "dimensions": [d.id for d in dims], "prefill_tokens_per_item": prefill,
        "items_per_s": {k: n / v for k, v in wall.items()}, "cpu_s_per_item": {k: v / n for k, v in cpu.items()},
        "speedup_wall": wall["criteria_first"] / wall["shared_prefix"],
        "speedup_cpu": cpu["criteria_first"] / cpu["shared_prefix"],
        "valid_share": {k: float(np.mean(~np.isnan(np.stack(outs[k].scores)))) for k in specs},
        "agreement_exact": float(np.mean(first[both] == shared[both])) if both.any() else float("nan"),
        "agreement_all": float(np.mean((first == shared) | (np.isnan(first) & np.isnan(shared)))),
        "both_valid_share": float(np.mean(both)),
        "mean_abs_difference": float(np.mean(np.abs(first[both] - shared[both]))) if both.any() else float("nan"),
        "per_dimension_agreement": {d.id: float(np.mean(first[both[:, i], i] == shared[both[:, i], i]))
                                    if both[:, i].any() else float("nan") for i, d in enumerate(dims)},
        "wall_s": {k: [round(w, 3) for w, _ in v] for k, v in times.items()},
        "cpu_s": {k: [round(c, 3) for _, c in v] for k, v in times.items()}, "warmup_s": warm,
    }


def main(argv: list[str]) -> None:
    del argv
    if _COMPARE.value == "layouts":
        print(json.dumps(compare_layouts(), indent=1))
        return
    rubric = load_rubric(RUBRIC)
    llm_dims = [d for d in rubric.dimensions if d.kind == "llm"]
    if _COMPACT.value:
        llm_dims = _without_examples(llm_dims)
    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR / "tokenizer")
    cfg = ModelConfig.from_hf_dir(TINY_DIR, max_position_embeddings=8192)
    judge = Judge("tiny-random", tokenizer, SamplerBackend(loader.init_weights(cfg, None, jax.random.key(0)), sampling.generate),
                  sampler="greedy",
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
