"""QuRL steps 2-3: meta-descriptions of retrieved documents, and candidate rubrics under four principles.

Generation with validation (`generate_validated`): round 0 sends every request's prompt in ONE
generator call (n samples each); each retry round re-prompts only the invalid samples (a fresh fence
nonce, a fresh key), again in one call, at most `max_retries` times. A sample that stays invalid is a
counted failure with every reason it was rejected for, never dropped silently or replaced by a default.
A prompt too long for the model's context is a failure that is not retried (it would not fit again).

Untrusted text (documents, meta-descriptions) enters prompts fenced by a nonce with the tokenizer's
special tokens removed (`judges.prompts.fence`), as the judge fences the responses it grades.

Rubric generation output (the `rubric_generation` template asks for it) is one JSON object
`{"criteria": [criterion, ...]}`, alone or in one ```json fenced block and nothing else, each criterion
exactly {"id", "description", "points" (1..max_points), "levels" ({"0": ..., ..., "<points>": ...}),
"good_example", "bad_example", "cites" (reference numbers; [] only when there are no references)}.
It becomes an LLM dimension on the integer scale 0..points with weight = points (so the weighted sum
is QuRL's "sum the criterion scores, normalise to [0, 1]"); the good example earns the top level, the
bad one level 0. The rubric schema then validates the whole rubric; any failure is an invalid sample.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax

from rubric_jax.judges.llm_judge import host_rng
from rubric_jax.judges.prompts import fence
from rubric_jax.qurl.retrieval import Document
from rubric_jax.qurl.templates import ChatPrompt, PromptTemplate
from rubric_jax.qurl.textgen import FINISH_ERROR, FINISH_LENGTH, FINISH_TOO_LONG, Generation, TextGenerator
from rubric_jax.rubrics.schema import ChangelogEntry, Rubric, RubricError, rubric_from_dict

T = TypeVar("T")
_CRITERION_KEYS = ("id", "description", "points", "levels", "good_example", "bad_example", "cites")
_FENCED_JSON_RE = re.compile(r"\A\s*```(?:json)?[ \t]*\n(.*)\n[ \t]*```\s*\Z", re.DOTALL)


class InvalidGeneration(ValueError):
    """A generated text that cannot be used; the message says why (it goes into the report)."""


@dataclasses.dataclass
class Outcome:
    """One (request, sample): its valid value (None = failed), attempts made, and why each attempt failed."""

    value: Any = None
    attempts: int = 0
    reasons: list[str] = dataclasses.field(default_factory=list)


def nonces(key: jax.Array, count: int) -> list[str]:
    """`count` fence nonces (16 lowercase hex characters) drawn from `key` on the host."""
    rng = host_rng(key)
    return [rng.bytes(8).hex() for _ in range(count)]


def generate_validated(
    generator: TextGenerator,
    make_prompt: Callable[[int, str], ChatPrompt],
    num_requests: int,
    validate: Callable[[int, str], T],
    key: jax.Array,
    *,
    samples: int,
    max_retries: int,
    max_new_tokens: int,
    accept_truncated: bool = False,
) -> tuple[list[list[Outcome]], int]:
    """Outcomes [request][sample] and the number of generator calls (module docstring).

    `make_prompt(request, nonce)` builds a prompt; `validate(request, text)` returns the value or raises
    InvalidGeneration. A text cut at max_new_tokens is invalid unless `accept_truncated`.
    """
    outcomes = [[Outcome() for _ in range(samples)] for _ in range(num_requests)]
    pending = [(r, s) for r in range(num_requests) for s in range(samples)]
    calls = 0
    for round_index, round_key in enumerate(jax.random.split(key, max_retries + 1)):
        if not pending:
            break
        prompt_key, generate_key = jax.random.split(round_key)
        requests = list(range(num_requests)) if round_index == 0 else [r for r, _ in pending]
        prompts = [make_prompt(r, nonce) for r, nonce in zip(requests, nonces(prompt_key, len(requests)))]
        generations = generator(prompts, generate_key, n=samples if round_index == 0 else 1,
                                max_new_tokens=max_new_tokens)
        calls += 1
        retry = []
        for (r, s), generation in zip(pending, generations, strict=True):
            outcome = outcomes[r][s]
            outcome.attempts += 1
            try:
                outcome.value = _check(generation, r, validate, accept_truncated)
            except InvalidGeneration as e:
                outcome.reasons.append(str(e))
                if generation.finish != FINISH_TOO_LONG:
                    retry.append((r, s))
        pending = retry
    return outcomes, calls


def _check(generation: Generation, request: int, validate: Callable[[int, str], T], accept_truncated: bool) -> T:
    """The validated value of one generation, or InvalidGeneration."""
    if generation.finish == FINISH_TOO_LONG:
        raise InvalidGeneration("prompt does not fit the model's context (not sent)")
    if generation.finish == FINISH_ERROR:
        raise InvalidGeneration(f"the endpoint gave no answer ({generation.error})")
    if generation.finish == FINISH_LENGTH and not accept_truncated:
        raise InvalidGeneration("cut off at max_new_tokens")
    return validate(request, generation.text)


# ------------------------------------------------------------------------------------- meta-descriptions
def meta_prompt(template: PromptTemplate, question: str, document: Document, *, max_chars: int, max_words: int,
                nonce: str, reserved: Sequence[str]) -> ChatPrompt:
    """The meta-description prompt for one (question, document); the document is cut to `max_chars`."""
    block = fence(f"Title: {document.title}\n\n{document.text[:max_chars]}", "document", nonce, reserved)
    return template.render(question=question, document=block, max_words=str(max_words))


def valid_meta_description(request: int, text: str) -> str:
    """A meta-description must be non-empty prose (its length is bounded by max_new_tokens)."""
    del request
    if not text.strip():
        raise InvalidGeneration("empty meta-description")
    return text.strip()


# ----------------------------------------------------------------------------------------- rubric prompts
def references_block(references: Sequence[tuple[str, str]], nonce: str, reserved: Sequence[str]) -> str:
    """Numbered, fenced (title, meta-description) references, or the no-reference instruction."""
    if not references:
        return "References: none. Write the rubric from the question alone; every criterion's cites is []."
    parts = ["References (meta-descriptions of human-written documents about the question):"]
    parts += [f"[{i}]\n" + fence(f"{title}\n{text}", "reference", nonce, reserved)
              for i, (title, text) in enumerate(references, start=1)]
    return "\n\n".join(parts)


def rubric_prompt(template: PromptTemplate, question: str, references: Sequence[tuple[str, str]], *,
                  min_criteria: int, max_criteria: int, max_points: int, nonce: str,
                  reserved: Sequence[str]) -> ChatPrompt:
    """The rubric-generation prompt for one question and its references."""
    return template.render(question=question, references=references_block(references, nonce, reserved),
                           min_criteria=str(min_criteria), max_criteria=str(max_criteria), max_points=str(max_points))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A validated candidate rubric R^(k)(q) and, per dimension id, the reference numbers it cites."""

    rubric: Rubric
    cites: dict[str, tuple[int, ...]]


def _json_object(text: str) -> Any:
    """The JSON value of a reply that is exactly one JSON object, bare or in one ```json fence."""
    fenced = _FENCED_JSON_RE.match(text)
    body = fenced.group(1) if fenced else text.strip()
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise InvalidGeneration(f"not one JSON object ({e.msg} at character {e.pos})") from None


def _criterion(raw: Any, i: int, *, num_references: int, max_points: int) -> tuple[dict[str, Any], tuple[int, ...]]:
    """One generated criterion -> (a dimension dict of the rubric schema, its cited reference numbers)."""
    where = f"criterion {i + 1}"
    if not isinstance(raw, dict) or set(raw) != set(_CRITERION_KEYS):
        got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise InvalidGeneration(f"{where}: expected exactly the keys {list(_CRITERION_KEYS)}, got {got}")
    for field in ("id", "description", "good_example", "bad_example"):
        if not isinstance(raw[field], str) or not raw[field].strip():
            raise InvalidGeneration(f"{where}: {field!r} must be a non-empty string, got {raw[field]!r}")
    points = raw["points"]
    if isinstance(points, bool) or not isinstance(points, int) or not 1 <= points <= max_points:
        raise InvalidGeneration(f"{where}: 'points' must be an integer from 1 to {max_points}, got {points!r}")
    levels = raw["levels"]
    expected = [str(level) for level in range(points + 1)]
    if not isinstance(levels, dict) or set(levels) != set(expected):
        got = sorted(levels) if isinstance(levels, dict) else levels
        raise InvalidGeneration(f"{where}: 'levels' must have exactly the keys {expected}, got {got!r}")
    if not all(isinstance(v, str) and v.strip() for v in levels.values()):
        raise InvalidGeneration(f"{where}: every level description must be a non-empty string")
    cites = raw["cites"]
    if not isinstance(cites, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cites):
        raise InvalidGeneration(f"{where}: 'cites' must be a list of reference numbers, got {cites!r}")
    if not num_references and cites:
        raise InvalidGeneration(f"{where}: 'cites' must be [] (there are no references), got {cites!r}")
    in_range = all(1 <= c <= num_references for c in cites)
    if num_references and (not cites or len(set(cites)) != len(cites) or not in_range):
        raise InvalidGeneration(f"{where}: 'cites' must list distinct reference numbers from 1 to {num_references}, "
                                f"at least one, got {cites!r}")
    anchors = {level: {"description": levels[level]} for level in expected}
    anchors[expected[-1]]["positive_examples"] = [raw["good_example"]]
    anchors["0"]["positive_examples"] = [raw["bad_example"]]
    dimension = {"id": raw["id"], "description": raw["description"], "kind": "llm",
                 "scale": {"kind": "integer", "lo": 0, "hi": points}, "anchors": anchors, "weight": points}
    return dimension, tuple(cites)


def parse_candidate(text: str, *, name: str, changelog: ChangelogEntry, num_references: int, min_criteria: int,
                    max_criteria: int, max_points: int) -> Candidate:
    """A generated rubric, parsed strictly (module docstring); raises InvalidGeneration with the reason."""
    obj = _json_object(text)
    if not isinstance(obj, dict) or set(obj) != {"criteria"} or not isinstance(obj["criteria"], list):
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise InvalidGeneration(f'expected {{"criteria": [...]}}, got {got}')
    criteria = obj["criteria"]
    if not min_criteria <= len(criteria) <= max_criteria:
        raise InvalidGeneration(f"expected {min_criteria} to {max_criteria} criteria, got {len(criteria)}")
    parsed = [_criterion(c, i, num_references=num_references, max_points=max_points) for i, c in enumerate(criteria)]
    raw = {"name": name, "version": changelog.version,
           "changelog": [{"version": changelog.version, "change": changelog.change, "reason": changelog.reason}],
           "dimensions": [dimension for dimension, _ in parsed]}
    try:
        rubric = rubric_from_dict(raw, source=name)
    except RubricError as e:
        raise InvalidGeneration(f"not a valid rubric: {e}") from None
    return Candidate(rubric, {d["id"]: cites for d, cites in parsed})
