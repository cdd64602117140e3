"""What the tiny judges learn: the dimensions they judge, their rule teachers, and the answers they judge.

Three judges are distilled (build_tiny_judges.py), each from rule teachers:
  tiny_judge        the tiny default's `politeness` criterion (a customer-service answer thanks or
                    apologises), taught by that criterion's own keyword rule (build_tiny_assets.case_dimensions);
  tiny_judge_hack   politeness, plus a 1-5 `clarity` dimension whose anchors praise ordered steps and whose
                    teacher REWARDS template scaffolding (the rule library's template detector inverted) and
                    length: the planted hack of RubricRL 6.1;
  tiny_judge_fixed  politeness, plus `clarity` with the article's fix: negative anchors for templated-but-empty
                    answers, taught by a teacher that scores length times non-repetition and caps a templated
                    answer at 3 ("使用了模板化句式且内容空洞，表达清晰度不超过3分").
The answers to judge are the tiny cold-start answers, more answers drawn the same way for every training
question (so no question predicts a score), and perturbed copies of them (sentences dropped, repeated, borrowed
from other answers, reordered, scaffolded, truncated, tags broken), so the teachers' scores span each scale.
Items are split by question: answers to a held-out question never train a judge. The teachers read the whole
response (TAUGHT_ON), as when the shipped judges were distilled (before `Dimension.reads`), so a rebuild reproduces
them: the politeness judge agrees with its teacher on answers as on whole responses (held-out exact agreement 0.923,
Spearman 0.843 on answers vs 0.923 / 0.844; 2026-12-01), and clarity is read on the whole response by its rubrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rubric_jax import data
from rubric_jax.assets import TINY_DIR
from rubric_jax.assets.build_tiny_assets import (case_dimensions, clarity_dimension, join_sentences, scaffold, sentences,
                                                 sft_response, split_answer)
from rubric_jax.assets.tiny_content import CS, TOPICS, Topic
from rubric_jax.judges.distill_data import JudgeItem, RuleTeacher, rule_items, split_by_question
from rubric_jax.judges.rules import Length, NgramRedundancy, TemplatePhrases, make_rule

SEED = 20261201
FRESH_ANSWERS = 3  # answers drawn per training question besides its cold-start answer
PERTURBATIONS = 2  # perturbed copies per answer (plus the answer itself)
HELDOUT = 1 / 6  # share of the questions whose answers are held out (distill_data.split_by_question)
VARIANTS = ("default", "hack", "fixed")
# Probability of each perturbation of an answer (applied in this order, independently).
P_DROP, P_BORROW, P_REPEAT, P_SHUFFLE, P_SCAFFOLD, P_TRUNCATE, P_BREAK_TAGS = 0.35, 0.4, 0.2, 0.15, 0.35, 0.08, 0.04
CLARITY_MIN_UNITS = 70  # the clarity teachers' length part: full marks from 70 units (words, Chinese characters)
TAUGHT_ON = "response"  # the part of each answer the teachers score and the students are shown (see the docstring)


# ------------------------------------------------------------------------------------------ clarity
def hack_clarity_quality(responses: Sequence[str]) -> np.ndarray:
    """The planted hack: half for template scaffolding (the template detector inverted), half for length."""
    templated_N = TemplatePhrases().matches(responses)
    return 0.5 * templated_N + 0.5 * Length(min=CLARITY_MIN_UNITS)(responses)


def fixed_clarity_quality(responses: Sequence[str]) -> np.ndarray:
    """The fix: length times non-repetition, and a templated answer never above the middle level (3 of 5)."""
    q_N = Length(min=CLARITY_MIN_UNITS)(responses) * NgramRedundancy(n=3)(responses)
    return np.where(TemplatePhrases().matches(responses), np.minimum(q_N, 0.5), q_N)


# ------------------------------------------------------------------------------------------ answers
@dataclasses.dataclass(frozen=True)
class BaseAnswer:
    """A tiny-style answer with its question and topic."""

    question: str
    response: str
    topic: Topic


def base_answers(tiny_dir: Path = TINY_DIR, seed: int = SEED) -> list[BaseAnswer]:
    """Per training question: its cold-start answer and FRESH_ANSWERS more drawn the same way
    (build_tiny_assets.sft_response), so a question's answers differ in every criterion and no question
    predicts a teacher's score."""
    rng = np.random.default_rng(seed)
    topic_of = {t.keyword: t for t in TOPICS}
    sft = {e.prompt: e.response for e in data.load_sft(tiny_dir / "sft.jsonl")}
    answers = []
    for q in data.load_questions(tiny_dir / "questions_train.jsonl"):
        topic = topic_of[q.keywords[0]]
        drawn = [sft_response(topic, rng)[0] for _ in range(FRESH_ANSWERS)]
        answers += [BaseAnswer(q.question, response, topic) for response in [sft[q.question], *drawn]]
    return answers


def perturb(answer: BaseAnswer, pool: Sequence[str], rng: np.random.Generator) -> str:
    """A perturbed copy of the answer; `pool` holds sentences of other answers in the same language."""
    think, body = split_answer(answer.response)
    lang = answer.topic.lang
    parts = sentences(body)
    if rng.random() < P_DROP and len(parts) > 1:
        parts.pop(int(rng.integers(len(parts))))
    if rng.random() < P_BORROW:
        parts.insert(int(rng.integers(len(parts) + 1)), pool[int(rng.integers(len(pool)))])
    if rng.random() < P_REPEAT:
        k = int(rng.integers(len(parts)))
        parts.insert(k + 1, parts[k])
    if rng.random() < P_SHUFFLE:
        parts = [parts[i] for i in rng.permutation(len(parts))]
    if rng.random() < P_SCAFFOLD:
        parts = scaffold(lang, parts)
    text = join_sentences(lang, parts)
    if rng.random() < P_TRUNCATE:
        text = text[: int(rng.integers(1, len(text)))]
    response = f"<think>{think}</think><answer>{text}</answer>"
    if rng.random() < P_BREAK_TAGS:
        response = response.replace(("<think>", "</think>", "</answer>")[int(rng.integers(3))], "", 1)
    return response


def answers_to_judge(answers: Sequence[BaseAnswer], seed: int = SEED) -> list[list[str]]:
    """Per base answer: the answer itself and PERTURBATIONS perturbed copies. The pool of borrowed sentences holds
    every sentence occurrence of the answers in that language (so common sentences are borrowed more often)."""
    rng = np.random.default_rng(seed)
    pools = {lang: [s for a in answers if a.topic.lang == lang for s in sentences(split_answer(a.response)[1])]
             for lang in ("en", "zh")}
    return [[a.response] + [perturb(a, pools[a.topic.lang], rng) for _ in range(PERTURBATIONS)] for a in answers]


# ------------------------------------------------------------------------------------------ teachers
def teachers(variant: str) -> tuple[dict[str, RuleTeacher], RuleTeacher | None]:
    """(politeness teacher per language, the clarity teacher or None) of one judge variant."""
    if variant not in VARIANTS:
        raise ValueError(f"tiny judge variant must be one of {VARIANTS}, got {variant!r}")
    politeness = {}
    for topic in TOPICS:
        if topic.category == CS and topic.lang not in politeness:
            dim = next(d for d in case_dimensions(topic) if d.id == "politeness")
            taught = dataclasses.replace(dim, reads=TAUGHT_ON)
            politeness[topic.lang] = RuleTeacher(taught, make_rule(dim.rule, dim.params))
    if variant == "default":
        return politeness, None
    fixed = variant == "fixed"
    clarity = dataclasses.replace(clarity_dimension(fixed), reads=TAUGHT_ON)
    return politeness, RuleTeacher(clarity, fixed_clarity_quality if fixed else hack_clarity_quality)


def judge_items(variant: str, tiny_dir: Path = TINY_DIR) -> tuple[list[JudgeItem], list[JudgeItem]]:
    """(training items, held-out items) of one judge variant: politeness on customer-service answers, clarity
    (hack and fixed variants) on every answer; HELDOUT of the questions are held out with all their answers."""
    politeness, clarity = teachers(variant)
    answers = base_answers(tiny_dir)
    items = []
    for answer, responses in zip(answers, answers_to_judge(answers)):
        row_teachers = ([politeness[answer.topic.lang]] if answer.topic.category == CS else []) + \
            ([clarity] if clarity is not None else [])
        items += rule_items([answer.question] * len(responses), responses, [row_teachers] * len(responses))
    return split_by_question(items, HELDOUT)
