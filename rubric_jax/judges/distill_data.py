"""Judge distillation data: items a teacher scored, rendered in the judge's own prompt and verdict format.

An item is a (question, response) to be judged on one LLM dimension, with the teacher's score on that
dimension's raw scale. Teachers (RubricRL 7: distil a small judge from a larger one to cut judge cost):
  rules   a quality function q(responses) in [0, 1] per dimension, e.g. a rule judge (rules.py) or a mix of
          them, mapped onto the scale like `rules.rule_scores`; a rule dimension's judge learns its LLM twin
          (the same text with kind "llm": what the judge's prompt shows);
  judge   another LLM judge through the scoring path training uses (llm_judge.judge_rows: samples, median);
  labels  scores given per item (e.g. a labels file).
A score is rounded to the nearest level (verdicts are integers); an item the teacher could not score is left out.
An item's response is the part of the response its dimension reads (`Dimension.reads`, rubric_jax/text.py): the
teacher scores and the student is shown exactly what the judge is shown at scoring time.

A training example is the prompt `llm_judge.judge_rows` sends at scoring time in "per_dimension" mode (a fresh
nonce and a shuffled anchor order per rendering, the judge tokenizer's special tokens fenced out) and a
verdict the strict parser accepts: the chosen level's anchor description, then `SCORE: <level>`. So the
student learns the exact format it is parsed with, and to find the level whatever order the anchors come in.
A group example (`group_examples`: items of one question on one dimension) is the group layout's prompt
(prompts.group_prompt) in a fresh shown order, nonce and anchor order, and its `R<k>: <level>` lines in label order.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rubric_jax import data, padding, text
from rubric_jax.judges.llm_judge import Judge, judge_rows, special_tokens
from rubric_jax.judges.parser import SINGLE_KEY, parse_single, parse_verdict
from rubric_jax.judges.prompts import JudgePrompt, compact_single_prompt, group_labels, group_prompt, single_prompt
from rubric_jax.judges.rules import make_rule
from rubric_jax.judges.scorers import split_by_reads
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.rubrics import kinds
from rubric_jax.rubrics.schema import Dimension, Rubric, canonical_json, dimension_to_dict

Group = tuple["JudgeItem", ...]  # items of one question on one dimension, judged in one group-layout prompt
QualityFn = Callable[[Sequence[str]], np.ndarray]  # responses -> q_N in [0, 1] (a rules.Rule is one)
NONCE_BYTES = 8  # llm_judge draws 8 random bytes per prompt: a 16-hex-digit fence nonce


@dataclasses.dataclass(frozen=True)
class JudgeItem:
    """One response to judge on one LLM dimension, with the teacher's score (a level of the dimension's scale);
    `response` is the part of the response the dimension reads."""

    question: str
    response: str
    dimension: Dimension
    score: int

    def __post_init__(self) -> None:
        if not self.dimension.judged:
            raise ValueError(f"judge item: dimension {self.dimension.id!r} must be an llm dimension (see llm_twin)")
        if self.score not in self.dimension.scale.levels:
            raise ValueError(f"judge item: score {self.score!r} is not a level of dimension {self.dimension.id!r} "
                             f"{list(self.dimension.scale.levels)}")


def llm_twin(dim: Dimension) -> Dimension:
    """The dimension as an LLM judge reads it: same id, text, scale, anchors and weight, kind "llm"."""
    return dim if dim.judged else dataclasses.replace(dim, kind=kinds.LLM.name, rule=None, params={})


def to_level(dim: Dimension, raw_N: np.ndarray) -> np.ndarray:
    """Raw scores [N] on the dimension's range rounded half up to its nearest level (int64; NaN stays NaN as -1)."""
    lo, hi = dim.scale.raw_range
    raw_N = np.asarray(raw_N, dtype=np.float64)
    levels_N = np.clip(np.floor(np.nan_to_num(raw_N, nan=lo) + 0.5), lo, hi).astype(np.int64)
    return np.where(np.isnan(raw_N), -1, levels_N)


@dataclasses.dataclass(frozen=True)
class RuleTeacher:
    """Scores one LLM dimension with a quality function q in [0, 1], mapped to lo + q (hi - lo) and rounded."""

    dimension: Dimension
    quality: QualityFn

    def __post_init__(self) -> None:
        object.__setattr__(self, "dimension", llm_twin(self.dimension))

    def levels(self, responses: Sequence[str]) -> np.ndarray:
        """The teacher's level [N] for each response."""
        q_N = np.asarray(self.quality(list(responses)), dtype=np.float64)
        if q_N.shape != (len(responses),) or not np.all((q_N >= 0.0) & (q_N <= 1.0)):
            raise ValueError(f"rule teacher of {self.dimension.id!r}: quality must be [N] values in [0, 1]")
        lo, hi = self.dimension.scale.raw_range
        return to_level(self.dimension, lo + q_N * (hi - lo))


def rule_teachers_per_row(rubrics: Sequence[Rubric], dimension_ids: Sequence[str]) -> list[list[RuleTeacher]]:
    """Per row, a RuleTeacher for each listed dimension its rubric has (one teacher object per distinct dimension,
    so rows sharing a dimension are scored in one batch); every listed id must be a rule dimension of some row."""
    teachers: dict[Dimension, RuleTeacher] = {}
    per_row = []
    for rubric in rubrics:
        row = []
        for dim in rubric.dimensions:
            if dim.id not in dimension_ids:
                continue
            if not dim.takes_rule:
                raise ValueError(f"rubric {rubric.name!r}: dimension {dim.id!r} is an {dim.kind} dimension; "
                                 "a rule teacher needs a rule dimension")
            if dim not in teachers:
                teachers[dim] = RuleTeacher(dim, make_rule(dim.rule, dim.params))
            row.append(teachers[dim])
        per_row.append(row)
    missing = sorted(set(dimension_ids) - {d.id for d in teachers})
    if missing:
        raise ValueError(f"no row's rubric has the dimension(s) {missing}")
    return per_row


def rule_items(questions: Sequence[str], responses: Sequence[str], teachers_per_row: Sequence[Sequence[RuleTeacher]]
               ) -> list[JudgeItem]:
    """One item per (row, teacher), scored by the teacher on the part its dimension reads; rows are grouped per
    teacher (rules are batched)."""
    if not len(questions) == len(responses) == len(teachers_per_row):
        raise ValueError(f"rule_items: {len(questions)} questions, {len(responses)} responses, "
                         f"{len(teachers_per_row)} teacher lists")
    by_teacher: dict[int, tuple[RuleTeacher, list[int]]] = {}
    for n, teachers in enumerate(teachers_per_row):
        for teacher in teachers:
            by_teacher.setdefault(id(teacher), (teacher, []))[1].append(n)
    scored: dict[tuple[int, str], int] = {}
    for teacher, rows in by_teacher.values():
        for n, level in zip(rows, teacher.levels([text.read(responses[n], teacher.dimension.reads) for n in rows])):
            scored[(n, teacher.dimension.id)] = int(level)
    return [JudgeItem(questions[n], text.read(responses[n], t.dimension.reads), t.dimension,
                      scored[(n, t.dimension.id)]) for n, teachers in enumerate(teachers_per_row) for t in teachers]


def judge_items(judges: Sequence[Judge], config: JudgeSpec, questions: Sequence[str], responses: Sequence[str],
                dims_per_row: Sequence[Sequence[Dimension]], key: jax.Array, batch_size: int = 64,
                refiners: Sequence[Judge] = ()) -> tuple[list[JudgeItem], int]:
    """Items scored by teacher judges through judge_rows (one batched call per `batch_size` rows and round; each
    dimension shown the part it reads), and how many scores the teachers could not give (those items are left out).
    `refiners`: the teacher's cascade judges (loading.load_cascade), when `config` has a cascade."""
    rows, dims_per_part = split_by_reads([[llm_twin(d) for d in dims] for dims in dims_per_row])
    views = [text.read(responses[n], reads) for n, reads in rows]
    items, missing = [], 0
    starts = range(0, len(rows), batch_size)
    for start, batch_key in zip(starts, jax.random.split(key, len(starts))):
        part = slice(start, start + batch_size)
        out = judge_rows(judges, config, [questions[n] for n, _ in rows[part]], views[part], dims_per_part[part],
                         batch_key, refiners=refiners)
        for k, (dims, raw) in enumerate(zip(dims_per_part[part], out.scores), start=start):
            for dim, x in zip(dims, raw):
                level = int(to_level(dim, np.asarray([x]))[0])
                if level < 0:
                    missing += 1
                else:
                    items.append(JudgeItem(questions[rows[k][0]], views[k], dim, level))
    return items, missing


def label_items(question: str, response: str, rubric: Rubric, labels: Mapping[str, float]) -> list[JudgeItem]:
    """Items from one labelled row: each labelled dimension of the row's rubric (shown the part it reads), its label
    rounded to a level."""
    return [JudgeItem(question, text.read(response, rubric.dimension(dim_id).reads), llm_twin(rubric.dimension(dim_id)),
                      int(to_level(rubric.dimension(dim_id), np.asarray([value]))[0]))
            for dim_id, value in labels.items()]


def split_by_question(items: Sequence[JudgeItem], heldout: float) -> tuple[list[JudgeItem], list[JudgeItem]]:
    """(training, held-out) items: a question is held out, with every response to it, when the sha256 of its text
    falls in the first `heldout` fraction (a split that does not depend on item order)."""
    if not 0.0 < heldout < 1.0:
        raise ValueError(f"held-out fraction must lie strictly between 0 and 1, got {heldout!r}")
    split: tuple[list[JudgeItem], list[JudgeItem]] = ([], [])
    for item in items:
        digest = hashlib.sha256(item.question.encode("utf-8")).digest()
        split[int.from_bytes(digest[:8], "big") < heldout * 2**64].append(item)
    return split


# ------------------------------------------------------------------------------------- examples
def verdict_text(dim: Dimension, level: int) -> str:
    """The target answer: the level's anchor description as the justification, then `SCORE: <level>`."""
    description = " ".join(dim.anchors[level].description.split())  # one line: the verdict must be the last line
    text = f"{description}\n{SINGLE_KEY}: {level}"
    lo, hi = dim.scale.raw_range
    verdict = parse_single(text, lo, hi)
    if not verdict.valid:
        raise ValueError(f"dimension {dim.id!r}, level {level}: target verdict does not parse ({verdict.reason})")
    return text


def scoring_prompt(item: JudgeItem, rng: np.random.Generator, reserved: Sequence[str], prompt: str = "full"
                   ) -> JudgePrompt:
    """The prompt judge_rows sends for this item in "per_dimension" mode with JudgeSpec.prompt = `prompt`: a fresh nonce
    and a shuffled anchor order."""
    nonce = rng.bytes(NONCE_BYTES).hex()
    order = rng.permutation(len(item.dimension.anchors)).tolist()
    if prompt == "compact":
        return compact_single_prompt(item.response, item.dimension, nonce=nonce, anchor_order=order, reserved=reserved)
    return single_prompt(item.question, item.response, item.dimension, nonce=nonce, anchor_order=order,
                         reserved=reserved)


def group_examples(items: Sequence[JudgeItem], max_size: int, repeats: int, rng: np.random.Generator) -> list[Group]:
    """Groups as the group layout judges them (one question's items on one dimension): per (question, dimension),
    `repeats` passes over its items in a fresh order, cut into consecutive groups of 1..`max_size` (uniform), so
    each item is judged in `repeats` groups of varied sizes and companions."""
    if max_size < 1 or repeats < 1:
        raise ValueError(f"group_examples: max_size and repeats must be >= 1, got {max_size}, {repeats}")
    members: dict[tuple[str, str], list[JudgeItem]] = {}
    for item in items:
        members.setdefault((item.question, canonical_json(dimension_to_dict(item.dimension))), []).append(item)
    groups = []
    for group_items in members.values():
        for _ in range(repeats):
            order, start = rng.permutation(len(group_items)), 0
            while start < len(order):
                size = int(rng.integers(1, max_size + 1))
                groups.append(tuple(group_items[i] for i in order[start : start + size]))
                start += size
    return groups


def group_verdict_text(dim: Dimension, levels: Sequence[int]) -> str:
    """A group's target answer: one `R<k>: <level>` line per shown response, in label order (what the strict group
    parser reads; no justification, as a distilled judge's rules are in its weights)."""
    labels = group_labels(len(levels))
    text = "\n".join(f"{label}: {level}" for label, level in zip(labels, levels))
    verdict = parse_verdict(text, labels, [dim.scale.raw_range] * len(labels))
    if not verdict.valid:
        raise ValueError(f"dimension {dim.id!r}, levels {list(levels)}: target verdict does not parse ({verdict.reason})")
    return text


def group_scoring_example(group: Group, rng: np.random.Generator, reserved: Sequence[str]) -> tuple[JudgePrompt, str]:
    """The group-layout prompt judge_rows sends for this group (a fresh nonce, anchor order and shown order) and its
    target answer: the items' levels in shown order."""
    nonce = rng.bytes(NONCE_BYTES).hex()
    dim = group[0].dimension
    order = rng.permutation(len(dim.anchors)).tolist()
    shown = [group[m] for m in rng.permutation(len(group))]
    prompt = group_prompt(shown[0].question, [i.response for i in shown], dim, nonce=nonce, anchor_order=order,
                          reserved=reserved)
    return prompt, group_verdict_text(dim, [i.score for i in shown])


def encode_examples(tokenizer: Any, examples: Sequence[JudgeItem | Group], rng: np.random.Generator,
                    prompt: str = "full") -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, verdict ids + eos) per example, each prompt freshly rendered from `rng`: an item in the
    JudgeSpec.prompt style `prompt`, a group (a tuple of items) in the group layout."""
    reserved = special_tokens(tokenizer)
    rendered = [group_scoring_example(e, rng, reserved) if isinstance(e, tuple) else
                (scoring_prompt(e, rng, reserved, prompt), verdict_text(e.dimension, e.score)) for e in examples]
    prompt_ids = data.encode_chats(tokenizer, [p.messages for p, _ in rendered])
    target_ids = data.encode_responses(tokenizer, [target for _, target in rendered])
    return prompt_ids, target_ids


def example_batch(tokenizer: Any, items: Sequence[JudgeItem | Group], rng: np.random.Generator,
                  prompt_buckets: Sequence[int], verdict_buckets: Sequence[int], prompt: str = "full"
                  ) -> dict[str, np.ndarray]:
    """An SFT batch [left-padded prompt | right-padded verdict + eos] with the loss on the verdict tokens only."""
    prompt_ids, target_ids = encode_examples(tokenizer, items, rng, prompt)
    pad = tokenizer.pad_token_id
    prompts_BxP, prompt_mask_BxP = padding.pad_left(prompt_ids, pad, prompt_buckets)
    verdicts_BxR, verdict_mask_BxR = padding.pad_right(target_ids, pad, verdict_buckets)
    return {"tokens": np.concatenate([prompts_BxP, verdicts_BxR], axis=1),
            "input_mask": np.concatenate([prompt_mask_BxP, verdict_mask_BxR], axis=1),
            "loss_mask": np.concatenate([np.zeros_like(prompt_mask_BxP), verdict_mask_BxR], axis=1)}
