"""QuRL steps 4-5 on a finished build's saved state: filter and merge each question's candidates (pure
functions of the state), then the output rows `{"rubric": {"replace": R*(q)}}` and the construction report.

The report (report.json) holds the settings the build ran with (prompt versions and hashes included),
per-step counts (`summary`: documents, meta-descriptions, candidates, answers, judge, filter, merge, and
the step each dropped question stopped at; "invalid"/"retried"/"failed" count samples, "generate_calls"
the batched calls), and one entry per question: its documents (BM25, prior, meta-description outcome),
every candidate (invalid with its reasons, or its rewards, std, spread and kept/dropped with the reason),
and R*(q)'s criteria (support, the candidate criteria merged into each, the documents they cite).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_jax.data import Question
from rubric_jax.qurl import construction, filtering
from rubric_jax.qurl.config import BuildConfig
from rubric_jax.qurl.templates import PromptTemplate
from rubric_jax.rubrics.schema import ChangelogEntry, Rubric, rubric_from_dict, rubric_to_dict

RUBRIC_VERSION = "1.0.0"


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """Question rows with R*(q) (kept questions only, in input order) and the construction report."""

    rows: list[dict[str, Any]]
    report: dict[str, Any]


def changelog_entry(cfg: BuildConfig, templates: Mapping[str, PromptTemplate], change: str) -> ChangelogEntry:
    """The changelog entry of a built rubric: what made it, with the prompt versions and settings."""
    tags = ", ".join(templates[name].tag for name in ("meta_description", "rubric_generation", "answer"))
    reason = (f"QuRL construction with prompts {tags}; K={cfg.num_candidates}, answers={cfg.num_answers}, "
              f"min_std={cfg.min_std}, min_spread={cfg.min_spread}, merge_threshold={cfg.merge_threshold}, "
              f"seed={cfg.seed}")
    return ChangelogEntry(RUBRIC_VERSION, change, reason)


def finish(questions: Sequence[Question], saved: Sequence[dict], settings: Mapping[str, Any], config: BuildConfig,
           templates: Mapping[str, PromptTemplate]) -> BuildResult:
    """Filter and merge every question's candidates (saved batch states in order); the kept rows and the report."""
    states = [s for batch in saved for s in batch["questions"]]
    rows, entries = [], []
    for question, state in zip(questions, states, strict=True):
        row, entry = _finish_question(config, templates, question, state)
        entries.append(entry)
        if row is not None:
            rows.append(row)
    report = {"settings": dict(settings), "summary": _summary(states, entries, saved), "questions": entries}
    return BuildResult(rows, json.loads(json.dumps(report, allow_nan=False)))  # plain JSON values, no NaN


def _number(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


def _document_entry(doc: dict) -> dict[str, Any]:
    """A retrieved document in the report: relevance, prior, and what became of its meta-description."""
    if doc["meta"] is not None:
        outcome = "ok"
    else:
        outcome = f"failed after {doc['attempts']} attempt(s): {doc['reasons'][-1]}"
    return {"doc_id": doc["doc_id"], "bm25": round(doc["bm25"], 6), "quality": doc["quality"],
            "truncated": doc["truncated"], "meta_description": outcome}


def _candidate_entries(cfg: BuildConfig, state: dict) -> tuple[list[dict], list[tuple[int, construction.Candidate]],
                                                                list[float]]:
    """Each candidate's report entry (invalid, or scored and kept/dropped by the filter), and the kept ones
    as (index, Candidate) with their reward stds."""
    entries, kept, stds = [], [], []
    for k, c in enumerate(state.get("candidates", [])):
        entry: dict[str, Any] = {"index": k, "attempts": c["attempts"], "invalid_reasons": c["reasons"]}
        entries.append(entry)
        if c["rubric"] is None:
            entry["status"] = "invalid"
            continue
        rewards = [None if x is None else round(x, 6) for x in state["rewards"][k]]
        d = filtering.discrimination(np.asarray([np.nan if x is None else x for x in state["rewards"][k]]))
        reason = filtering.filter_reason(d, min_valid_answers=cfg.min_valid_answers, min_std=cfg.min_std,
                                         min_spread=cfg.min_spread)
        entry.update(status="kept" if reason is None else "dropped", reason=reason,
                     criteria=[dim["id"] for dim in c["rubric"]["dimensions"]], valid_scores=d.valid,
                     std=_number(d.std), spread=_number(d.spread), rewards=rewards)
        if reason is None:
            cites = {dim_id: tuple(v) for dim_id, v in c["cites"].items()}
            kept.append((k, construction.Candidate(rubric_from_dict(c["rubric"]), cites)))
            stds.append(d.std)
    return entries, kept, stds


def _question_row(question: Question, rubric: Rubric) -> dict[str, Any]:
    """The question as a data row (rubric_jax.data.load_questions) with `{"rubric": {"replace": R*(q)}}`."""
    row = {"id": question.id, "question": question.question, "category": question.category, "lang": question.lang}
    if question.keywords:
        row["keywords"] = list(question.keywords)
    if question.difficulty is not None:
        row["difficulty"] = question.difficulty
    row["rubric"] = {"replace": rubric_to_dict(rubric)}
    return row


def _finish_question(cfg: BuildConfig, templates: Mapping[str, PromptTemplate], question: Question, state: dict
                     ) -> tuple[dict | None, dict]:
    """(output row or None, report entry) of one question: filter its candidates, merge the kept ones."""
    candidates, kept, stds = _candidate_entries(cfg, state)
    entry: dict[str, Any] = {"id": question.id, "status": "dropped", "reason": state["dropped"],
                             "documents": [_document_entry(d) for d in state.get("documents", [])],
                             "candidates": candidates}
    if state["dropped"] is not None:
        return None, entry
    if not kept:
        entry["reason"] = f"filter: none of the {len(candidates)} candidate rubric sets discriminates between answers"
        return None, entry
    merged = filtering.merge_criteria([c for _, c in kept], stds, threshold=cfg.merge_threshold,
                                      min_support=cfg.min_support, max_criteria=cfg.max_criteria)
    entry["merge"] = {"groups": merged.groups, "unsupported": merged.unsupported, "capped": merged.capped}
    need = min(cfg.min_support, len(kept))
    if not merged.criteria:
        entry["reason"] = f"merge: no criterion recurs in {need} of the {len(kept)} kept candidate sets"
        return None, entry
    doc_ids = [d["doc_id"] for d in state["documents"] if d["meta"] is not None]
    change = (f"built for question {question.id!r} from reference documents {doc_ids}: {len(kept)} of "
              f"{len(candidates)} candidate sets kept, {len(merged.criteria)} criteria recurring in >= {need} of them")
    rubric = Rubric(f"qurl/{question.id}", RUBRIC_VERSION, (changelog_entry(cfg, templates, change),),
                    tuple(m.dimension for m in merged.criteria))
    entry.update(status="kept", reason=None, rubric_hash=rubric.content_hash, criteria=[
        {"id": m.dimension.id, "support": m.support, "members": [f"candidate {kept[p][0]}: {i}" for p, i in m.members],
         "cites": [doc_ids[c - 1] for c in m.cites]} for m in merged.criteria])
    return _question_row(question, rubric), entry


def _summary(states: Sequence[dict], entries: Sequence[dict], saved: Sequence[dict]) -> dict[str, Any]:
    """Per-step counts over every question (and generate calls over every batch)."""
    docs = [d for s in states for d in s.get("documents", [])]
    cands = [c for s in states for c in s.get("candidates", [])]
    answers = [a for s in states for a in s.get("answers", [])]
    scored = [c for e in entries for c in e["candidates"] if c["status"] != "invalid"]

    def calls(step: str, field: str = "generate_calls") -> int:
        return sum(batch["calls"].get(step, {}).get(field, 0) for batch in saved)

    def outcomes(items: Sequence[dict], value: str, step: str) -> dict[str, Any]:
        reasons = [r for x in items for r in x["reasons"]]
        return {"requests": len(items), "generate_calls": calls(step), "attempts": sum(x["attempts"] for x in items),
                "invalid": len(reasons), "retried": sum(max(x["attempts"] - 1, 0) for x in items),
                "failed": sum(x[value] is None for x in items),
                "prompt_too_long": sum(r.startswith("prompt does not fit") for r in reasons),
                "invalid_examples": reasons[:5]}

    meta = outcomes(docs, "meta", "meta_description")
    generation = outcomes(cands, "rubric", "rubric_generation")
    judge_fields = ("judge_prompts", "judge_generate_calls", "judge_invalid", "judge_retried", "judge_prompt_too_long",
                    "judge_scores", "judge_failed_scores")
    drop_steps = [e["reason"].split(":", 1)[0] for e in entries if e["status"] == "dropped"]
    merged = [e["merge"] for e in entries if "merge" in e]
    return {
        "questions": len(states), "kept": len(entries) - len(drop_steps), "dropped": len(drop_steps),
        "dropped_at": {step: drop_steps.count(step) for step in dict.fromkeys(drop_steps)},
        "retrieval": {"documents": len(docs), "truncated": sum(d["truncated"] for d in docs)},
        "meta_description": meta,
        "rubric_generation": generation,
        "answers": {"sampled": len(answers), "failed": sum(a["text"] is None for a in answers),
                    "generate_calls": calls("scoring")},
        "judge": {"reward_rows": calls("scoring", "reward_rows")} | {f: calls("scoring", f) for f in judge_fields} | {
            "judge_invalid_examples": [x for b in saved for x in b["calls"].get("scoring", {}).get(
                "judge_invalid_examples", [])][:5]},
        "filter": {"scored": len(scored), "kept": sum(c["status"] == "kept" for c in scored),
                   "dropped": sum(c["status"] == "dropped" for c in scored)},
        "merge": {"groups": sum(m["groups"] for m in merged), "unsupported": sum(m["unsupported"] for m in merged),
                  "capped": sum(m["capped"] for m in merged),
                  "criteria": sum(len(e["criteria"]) for e in entries if e["status"] == "kept")},
    }
