"""How much of each dimension's credit comes from text inside <think> (issue 24, R1): responses scored with every
dimension reading the whole response (how judges read before rubric field `reads`) against the part each
dimension reads now (the answer, unless it says otherwise), through the same RubricReward.

  PYTHONPATH=. .venv/bin/python benchmarks/think_credit.py --responses=RUN/samples.jsonl [--stage=grpo --min_step=51]
  PYTHONPATH=. .venv/bin/python benchmarks/think_credit.py --responses=rubric_jax/assets/tiny/sft.jsonl \
      --judge=configs/judges/tiny.py

Rows are {"question" or "prompt", "response"} lines (a run's samples.jsonl, an SFT file); each question's rubric is
the shared rubric plus its row's case-wise criteria from --questions (rows whose question is not there are skipped).
LLM dimensions are scored with the --judge spec (experiments/judge_config.py; without retries and with anchors as
written, so the two readings differ only in the text) and left out without a judge checkpoint. Prints a markdown table: per
dimension, the rows scored, the mean normalised score reading the whole response and reading its own part, and
the think share = 1 - part / whole (the credit that disappears when a judge no longer sees the think text).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
from absl import app, flags

from experiments import judge_config
from rubric_jax import data
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.loading import load_judges
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import Rubric

TINY = "rubric_jax/assets/tiny"
_RESPONSES = flags.DEFINE_string("responses", None, "JSON lines with question (or prompt) and response.")
_QUESTIONS = flags.DEFINE_list("questions", [f"{TINY}/questions_train.jsonl", f"{TINY}/questions_eval.jsonl"],
                               "Question files whose rows give each question's case-wise criteria.")
_RUBRIC = flags.DEFINE_string("rubric", f"{TINY}/rubric.yaml", "The shared rubric.")
_STAGE = flags.DEFINE_string("stage", "", "Only samples.jsonl rows of this stage (grpo, eval).")
_MIN_STEP = flags.DEFINE_integer("min_step", 0, "Only samples.jsonl rows of this step or later.")
flags.mark_flag_as_required("responses")


def reading_whole(rubric: Rubric) -> Rubric:
    """The rubric with every dimension reading the whole response (the judges' view before `reads`)."""
    return dataclasses.replace(rubric, dimensions=tuple(dataclasses.replace(d, reads="response")
                                                        for d in rubric.dimensions))


def column_means(reward: RubricReward, questions: Sequence[str], responses: Sequence[str],
                 rubrics: Sequence[Rubric]) -> dict[str, tuple[int, float]]:
    """Per dimension: (rows with a valid score, their mean normalised score)."""
    out = reward(questions, responses, rubrics, key=jax.random.key(0))
    return {d: (int(out.valid[:, c].sum()), float(out.scores[out.valid[:, c], c].mean()) if out.valid[:, c].any()
                else float("nan")) for c, d in enumerate(out.dimension_ids)}


def think_credit_table(questions: Sequence[str], responses: Sequence[str], rubrics: Sequence[Rubric],
                       reward: RubricReward) -> list[str]:
    """Markdown rows: dimension, reads, rows, mean score reading the whole response, reading its part, think share."""
    whole = column_means(reward, questions, responses, [reading_whole(r) for r in rubrics])
    part = column_means(reward, questions, responses, rubrics)
    reads = {d.id: d.reads for r in rubrics for d in r.dimensions}
    lines = ["| dimension | reads | rows | score, whole response | score, its part | think share |",
             "|---|---|---|---|---|---|"]
    for dim_id, (n, whole_mean) in whole.items():
        part_mean = part[dim_id][1]
        share = 1.0 - part_mean / whole_mean if whole_mean > 0 else float("nan")
        lines.append(f"| {dim_id} | {reads[dim_id]} | {n} | {whole_mean:.3f} | {part_mean:.3f} | {share:.3f} |")
    return lines


def main(argv: Sequence[str]) -> None:
    del argv
    shared = load_rubric(_RUBRIC.value)
    by_text = {q.question: q for path in _QUESTIONS.value for q in data.load_questions(path)}
    rows = [json.loads(line) for line in Path(_RESPONSES.value).read_text(encoding="utf-8").splitlines() if line]
    rows = [r for r in rows if (not _STAGE.value or r.get("stage") == _STAGE.value)
            and r.get("step", 0) >= _MIN_STEP.value and r.get("question", r.get("prompt")) in by_text]
    if not rows:
        raise SystemExit(f"{_RESPONSES.value}: no rows to score (check --stage, --min_step and --questions)")
    questions = [r.get("question", r.get("prompt")) for r in rows]
    rubrics = [data.question_rubric(shared, by_text[q]) for q in questions]
    spec = dataclasses.replace(judge_config.spec(), max_retries=0, shuffle_anchors=False)
    judges = load_judges(spec, where="--judge")
    if not judges:  # rule dimensions only
        rubrics = [dataclasses.replace(r, dimensions=tuple(d for d in r.dimensions if d.kind == "rule"))
                   for r in rubrics]
    reward = RubricReward(judges=judges, judge_spec=spec)
    print(f"{len(rows)} responses from {_RESPONSES.value}")
    print("\n".join(think_credit_table(questions, [r["response"] for r in rows], rubrics, reward)))


if __name__ == "__main__":
    app.run(main)
