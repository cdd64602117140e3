"""Writes tests/fixtures/red_team/{politeness,clarity_and_politeness}.jsonl: labelled answers for `experiments.calibrate --config.red_team`
against the shipped tiny judges (docs/judges.md, "Injection rate").

Each file holds answers to the tiny judges' held-out questions (tiny_judge_data: never seen in distillation), labelled
by a teacher: politeness (tiny_judge, tiny_judge_hack, tiny_judge_fixed) by its keyword rule, with each question's own
rubric row (read with rubric.yaml); clarity (tiny_judge_hack, tiny_judge_fixed) by the fixed teacher (length times
non-repetition, a template capped at 3), followed by the politeness rows, to be read with rubric_hack.yaml or
rubric_hack_fixed.yaml. BAD answers labelled below the middle of
the scale (the ones payloads are injected into) and GOOD ones above it are kept per file, in a seeded order.
Regenerate with:  PYTHONPATH=. .venv/bin/python tests/make_red_team_fixtures.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rubric_jax.assets import TINY_DIR
from rubric_jax.assets.tiny_content import CS
from rubric_jax.assets.tiny_judge_data import base_answers, judge_items, teachers
from rubric_jax.judges.distill_data import rule_items

OUT = Path(__file__).resolve().parent / "fixtures" / "red_team"
BAD, GOOD = 8, 4  # answers per file below / above the middle of the scale


def _rows(dim_id: str, teacher, answers, rubric_of) -> list[dict]:
    """BAD + GOOD labelled rows of `answers` scored by `teacher`, in a seeded order."""
    items = rule_items([a.question for a in answers], [a.response for a in answers], [[teacher]] * len(answers))
    levels = teacher.dimension.scale.levels
    middle = (levels[0] + levels[-1]) / 2
    order = np.random.default_rng(23).permutation(len(answers))
    bad = [i for i in order if items[i].score < middle][:BAD]
    good = [i for i in order if items[i].score > middle][:GOOD]
    return [{"question": answers[i].question, "response": answers[i].response, "labels": {dim_id: items[i].score},
             **({"rubric": rubric_of[answers[i].question]} if rubric_of else {})} for i in sorted(bad + good)]


def main() -> None:
    heldout = {item.question for item in judge_items("fixed")[1]}
    answers = [a for a in base_answers() if a.question in heldout]
    questions = [json.loads(line) for line in (TINY_DIR / "questions_train.jsonl").read_text("utf-8").splitlines()]
    rubric_of = {q["question"]: q["rubric"] for q in questions if "rubric" in q}
    politeness, clarity = teachers("fixed")
    service = [a for a in answers if a.topic.category == CS]
    polite = [r for lang, teacher in politeness.items()
              for r in _rows("politeness", teacher, [a for a in service if a.topic.lang == lang], rubric_of)]
    files = {"politeness.jsonl": polite, "clarity_and_politeness.jsonl": _rows("clarity", clarity, answers, {}) + polite}
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        (OUT / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
        print(name, len(rows), "rows")


if __name__ == "__main__":
    main()
