"""Judge tokens per item, pointwise vs group (listwise) judging, on the shipped politeness labels.

  PYTHONPATH=. .venv/bin/python benchmarks/bench_group_judge.py [--labels=tests/fixtures/red_team/politeness.jsonl]
      [--rubric=rubric_jax/assets/tiny/rubric.yaml] [--checkpoint=rubric_jax/assets/tiny_judge_group]

The shipped tiny judge (rubric_jax/assets/tiny_judge, or the judge directory --checkpoint names, e.g. the
group-capable tiny_judge_group; configs/judges/tiny.py's settings: greedy, 1 sample; no
retries, so that each layout's cost is one pass whatever its parse failures) scores every labelled item (one response
on its politeness criterion) through the training reward (judges/reward.RubricReward) in three layouts: pointwise
with its distilled compact prompt (16 new tokens), pointwise with the full prompt, and group (judge.layout=group, the
full prompt, 48 new tokens: a group's rows are the file's rows of one question). The judge's generate function is
wrapped to count the prompt tokens it is sent (fillers left out) and the tokens it writes. Per item: prompt, answer
and total judge tokens, the prompts sent, the items with a valid verdict, and the exact agreement of the valid
verdicts with the labels. Then, for groups of G = 1, 2, 3, 4, 8 (the tiny default's rl.group_size) of the file's
first answers on its first row's criterion, the prompt tokens per item of one group prompt against the mean of their
pointwise (full and compact) prompts.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import numpy as np
from absl import app, flags

from configs.judges.tiny import get_config as tiny_judge_config
from rubric_jax.calibration.labels import read_items
from rubric_jax import text
from rubric_jax.judges.llm_judge import Judge, encode_prompts, load_judge, special_tokens
from rubric_jax.judges.prompts import compact_single_prompt, group_prompt, single_prompt
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.rubrics.io import load_rubric

_LABELS = flags.DEFINE_string("labels", "tests/fixtures/red_team/politeness.jsonl", "A calibration labels file.")
_RUBRIC = flags.DEFINE_string("rubric", "rubric_jax/assets/tiny/rubric.yaml", "The rubric its rows extend.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "A judge directory in place of configs/judges/tiny.py's.")
LAYOUTS = {"pointwise compact": {}, "pointwise full": {"prompt": "full"},
           "group full": {"prompt": "full", "layout": "group", "max_new_tokens": 48}}


@dataclasses.dataclass
class Counter:
    """A generate function that counts the prompt tokens it is sent (one-token fillers left out) and writes."""

    generate: Any
    prompt_tokens: int = 0
    answer_tokens: int = 0

    def __call__(self, weights: Any, prompt_ids: list[list[int]], **kwargs: Any) -> Any:
        result = self.generate(weights, prompt_ids, **kwargs)
        real = [len(ids) > 1 for ids in prompt_ids]
        self.prompt_tokens += sum(len(ids) for ids, r in zip(prompt_ids, real) if r)
        self.answer_tokens += int(np.asarray(result.lengths)[np.asarray(real)].sum())
        return result


def measure(spec: JudgeSpec, items: list, judge: Judge) -> dict[str, Any]:
    """Tokens per item, prompts, valid verdicts and exact agreement of `judge` under `spec` on `items`."""
    counter = Counter(judge.backend.generate_fn)
    counted = dataclasses.replace(judge, backend=dataclasses.replace(judge.backend, generate_fn=counter))
    out = RubricReward(judges=[counted], judge_spec=spec)([i.question for i in items], [i.response for i in items],
                                                          [i.rubric for i in items], key=jax.random.key(0))
    column = out.dimension_ids.index("politeness")
    judged = out.details["raw_scores"][:, column]
    labels = np.asarray([i.labels["politeness"] for i in items])
    valid = ~np.isnan(judged)
    n = len(items)
    return {"items": n, "prompts_sent": out.details["judge_prompts"], "valid": int(valid.sum()),
            "prompt_tokens_per_item": counter.prompt_tokens / n, "answer_tokens_per_item": counter.answer_tokens / n,
            "judge_tokens_per_item": (counter.prompt_tokens + counter.answer_tokens) / n,
            "exact_agreement_of_valid": float((judged[valid] == labels[valid]).mean()) if valid.any() else None,
            "invalid_examples": out.details["judge_invalid_examples"][:2]}


def prompt_tokens_by_group_size(items: list, judge: Judge) -> dict[int, dict[str, float]]:
    """Prompt tokens per item of a group of the first G answers vs their pointwise prompts (one nonce)."""
    dim = next(d for d in items[0].rubric.dimensions if d.id == "politeness")
    answers = [text.read(i.response, dim.reads) for i in items]
    reserved, nonce = special_tokens(judge.tokenizer), "ab" * 8

    def tokens(prompts: list) -> list[int]:
        return [len(ids) for ids in encode_prompts(judge.tokenizer, prompts)[0]]

    out = {}
    for size in (1, 2, 3, 4, 8):
        group = answers[:size]
        out[size] = {
            "group": tokens([group_prompt(items[0].question, group, dim, nonce=nonce, reserved=reserved)])[0] / size,
            "pointwise full": float(np.mean(tokens([single_prompt(items[0].question, a, dim, nonce=nonce,
                                                                  reserved=reserved) for a in group]))),
            "pointwise compact": float(np.mean(tokens([compact_single_prompt(a, dim, nonce=nonce, reserved=reserved)
                                                       for a in group])))}
    return out


def main(argv: list[str]) -> None:
    del argv
    base = JudgeSpec.from_config(tiny_judge_config())
    base = dataclasses.replace(base, checkpoints=(_CHECKPOINT.value,)) if _CHECKPOINT.value else base
    items = read_items(_LABELS.value, load_rubric(_RUBRIC.value))
    results = {}
    for name, fields in LAYOUTS.items():
        spec = dataclasses.replace(base, max_retries=0, **fields)
        judge = load_judge(spec.checkpoints[0], sampler=spec.sampler, max_new_tokens=spec.max_new_tokens)
        results[name] = measure(spec, items, judge)
    by_size = prompt_tokens_by_group_size(items, judge)
    print(json.dumps({"judge": base.checkpoints[0], "labels": _LABELS.value, **results,
                      "prompt_tokens_per_item_by_group_size": by_size}, indent=1))


if __name__ == "__main__":
    app.run(main)
