"""Importers of public rubric formats into `Rubric`s (one per question or per category).

HealthBench        criteria with signed points (-10..+10)  -> one points dimension per criterion,
                   aggregation 'healthbench_points' (../shared/data/healthbench/FORMULA.md)
Prometheus/BiGGen  {criteria, score1..score5_description}  -> one 1-5 llm dimension with five anchors
HelloBench         per-category checklists + weights       -> one 0-4 dimension per item (the judge's
                   0/0.25/0.5/0.75/1 times 4), weights from checklist_weights.json, weighted sum
RaR                Essential/Important/Optional/Pitfall     -> one points dimension per item, grouped by
                   items with integer weights                  category; Pitfall items must carry negative
                                                               weights (met = the pitfall is present)
LongBench-Write    {prompt, type, length} rows              -> the six 1-5 quality dimensions of its judge
                                                               (LongWriter evaluation/judge.txt), shared

Benchmark readers used by evaluation (rubric_jax/evaluation) and data preparation alike:
`import_longbench_write`, `hellobench_task_file`, `read_hellobench_judgements` (the published per-item
judge scores). Errors name the file and line ('FILE:LINE: record i ...').

Every imported dimension reads the answer (`Dimension.reads` default): these benchmarks grade what the user
is shown, never a model's reasoning.

Checklist formats (HealthBench, RaR) grade each item separately, so their rubrics routinely exceed the
7-dimension advice of RubricRL; importers silence that RubricWarning for them (the advice is about one
judge call weighing many dimensions at once).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rubric_jax.files import MAX_INPUT_BYTES, PathError, open_input, read_text
from rubric_jax.jsonl import read_jsonl
from rubric_jax.rubrics.schema import (
    Aggregation,
    Anchor,
    ChangelogEntry,
    Dimension,
    Rubric,
    RubricError,
    RubricWarning,
    Scale,
)

IMPORT_VERSION = "1.0.0"
HELLOBENCH_TASKS = ("open_ended_qa", "summarization", "chat", "text_completion", "heuristic_text_generation")
RAR_CATEGORIES = ("essential", "important", "optional", "pitfall")
_RAR_PREFIX_RE = re.compile(r"^\s*(Essential|Important|Optional|Pitfall)\s+Criteri(?:a|on)\s*:\s*", re.IGNORECASE)
_PROMETHEUS_RUBRIC_RE = re.compile(
    r"###Score Rubrics?:\s*\n\[(?P<criteria>.+?)\]\s*\n" + "".join(
        rf"Score {k}:\s*(?P<s{k}>.+?)\s*\n" for k in range(1, 6)), re.DOTALL)
_PROMETHEUS_INSTRUCTION_RE = re.compile(
    r"###The instruction to evaluate:\s*\n(?P<q>.*?)\n+###Response to evaluate:", re.DOTALL)
_PROMETHEUS_RESPONSE_RE = re.compile(
    r"###Response to evaluate:\s*\n(?P<r>.*?)\n+###(?:Reference Answer|Score Rubrics?)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class RubricCase:
    """One imported question with its rubric: prompt (text or chat turns), optional reference, source metadata."""

    case_id: str
    prompt: str | tuple[Mapping[str, str], ...]
    rubric: Rubric
    reference: str | None = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _imported(name: str, source: str, dims: Sequence[Dimension], aggregation: Aggregation) -> Rubric:
    """A version-1.0.0 rubric whose changelog records where it was imported from."""
    entry = ChangelogEntry(IMPORT_VERSION, f"imported from {source}", "public benchmark rubric, unchanged text")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RubricWarning)
        return Rubric(name, IMPORT_VERSION, (entry,), tuple(dims), aggregation)


def _article(word: str) -> str:
    """'an essential' / 'a pitfall'."""
    return ("an " if word[0] in "aeiou" else "a ") + word


def _read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(location 'FILE:LINE: record i', row) per record of a JSON-lines file; errors name the file and line."""
    return [(f"{path}:{lineno}: record {i}", row) for i, (lineno, row) in enumerate(read_jsonl(path, RubricError))]


def _read_json(path: Path) -> Any:
    """The JSON value of a file; a missing or malformed file raises naming it."""
    try:
        return json.loads(read_text(path, "JSON", MAX_INPUT_BYTES))
    except PathError as e:
        raise RubricError(str(e)) from None
    except json.JSONDecodeError as e:
        raise RubricError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None


def _require(row: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    """Raise naming the record when required keys are absent."""
    missing = [k for k in keys if k not in row]
    if missing:
        raise RubricError(f"{where}: missing field(s) {missing}")


def _criterion_dimension(dim_id: str, criterion: str, points: int, group: str | None, where: str) -> Dimension:
    """A met/not-met llm criterion worth `points` (negative points: met means the undesirable behaviour)."""
    if isinstance(points, bool) or not isinstance(points, int) or points == 0:
        raise RubricError(f"{where}: field 'points': expected a non-zero integer, got {points!r}")
    if points > 0:
        anchors = {1: Anchor(f"Met: the response does this: {criterion}"),
                   0: Anchor(f"Not met: the response does not do this: {criterion}")}
    else:
        anchors = {1: Anchor(f"Met (undesirable): the response does this: {criterion}"),
                   0: Anchor(f"Not met (good): the response avoids this: {criterion}")}
    try:
        return Dimension(dim_id, criterion, "llm", Scale.signed_points(points), anchors,
                         weight=float(abs(points)), group=group)
    except RubricError as e:
        raise RubricError(f"{where}: {e}") from None


# ------------------------------------------------------------------------------------------ HealthBench

def healthbench_rubric(items: Sequence[Mapping[str, Any]], name: str, source: str = "HealthBench",
                       missing: str = "drop") -> Rubric:
    """HealthBench `rubrics` list -> points rubric; dimension k is 'c<k>', grouped by its axis tag.

    missing='drop' by default: HealthBench re-asks the grader until every criterion has a verdict, so a
    reward computed over a subset of criteria would not be a HealthBench score.
    """
    dims = []
    for k, item in enumerate(items):
        where = f"{source}: rubric item {k}"
        _require(item, ("criterion", "points", "tags"), where)
        axes = [t.split(":", 1)[1] for t in item["tags"] if t.startswith("axis:")]
        dims.append(_criterion_dimension(f"c{k:02d}", item["criterion"], item["points"],
                                         axes[0] if len(axes) == 1 else None, where))
    return _imported(name, source, dims, Aggregation("healthbench_points", {}, missing))


def import_healthbench(path: str | Path, missing: str = "drop") -> list[RubricCase]:
    """HealthBench jsonl (oss_eval schema, or the RuscaRL copy with row_index) -> one case per record."""
    path = Path(path)
    cases = []
    for i, (where, row) in enumerate(_read_jsonl(path)):
        _require(row, ("prompt", "rubrics"), where)
        case_id = str(row.get("prompt_id", row.get("row_index", i)))
        rubric = healthbench_rubric(row["rubrics"], f"healthbench/{case_id}", f"{where} (prompt_id {case_id})", missing)
        meta = {"example_tags": list(row.get("example_tags", [])),
                "criterion_tags": {d.id: list(item["tags"]) for d, item in zip(rubric.dimensions, row["rubrics"])}}
        ideal = row.get("ideal_completions_data")
        cases.append(RubricCase(case_id, tuple(dict(m) for m in row["prompt"]), rubric,
                                ideal["ideal_completion"] if ideal else None, meta))
    return cases


# ------------------------------------------------------------------------------------------ Prometheus

def prometheus_rubric(score_rubric: Mapping[str, Any], name: str, source: str = "Prometheus") -> Rubric:
    """{criteria, score1_description..score5_description} -> one 1-5 llm dimension 'criteria'."""
    keys = ("criteria",) + tuple(f"score{k}_description" for k in range(1, 6))
    _require(score_rubric, keys, f"{source}: score_rubric")
    unknown = sorted(set(score_rubric) - set(keys))
    if unknown:
        raise RubricError(f"{source}: score_rubric: unknown field(s) {unknown}")
    anchors = {k: Anchor(score_rubric[f"score{k}_description"]) for k in range(1, 6)}
    try:
        dim = Dimension("criteria", score_rubric["criteria"], "llm", Scale.integer(1, 5), anchors)
    except RubricError as e:
        raise RubricError(f"{source}: {e}") from None
    return _imported(name, source, [dim], Aggregation("weighted_sum", {}, "drop"))


def parse_prometheus_rubric_text(text: str, source: str) -> dict[str, str]:
    """The '###Score Rubrics:' block of a rendered Prometheus prompt -> the score_rubric dict."""
    m = _PROMETHEUS_RUBRIC_RE.search(text)
    if m is None:
        raise RubricError(f"{source}: no '###Score Rubrics:' block with '[criteria]' and 'Score 1..5:' lines")
    out = {"criteria": m.group("criteria").strip()}
    out.update({f"score{k}_description": m.group(f"s{k}") for k in range(1, 6)})
    return out


def import_biggen_bench(path: str | Path) -> list[RubricCase]:
    """BiGGen-Bench jsonl (id, input, system_prompt, reference_answer, score_rubric, ...) -> cases."""
    path = Path(path)
    cases = []
    for i, (where, row) in enumerate(_read_jsonl(path)):
        _require(row, ("id", "input", "score_rubric"), where)
        rubric = prometheus_rubric(row["score_rubric"], f"biggen/{row['id']}", f"{where} (id {row['id']})")
        meta = {k: row[k] for k in ("capability", "task", "system_prompt") if k in row}
        cases.append(RubricCase(row["id"], row["input"], rubric, row.get("reference_answer"), meta))
    return cases


def import_vicuna_eval(path: str | Path) -> list[RubricCase]:
    """Prometheus vicuna_eval.json (rendered absolute prompts + 3 GPT-4 scores) -> cases; scores and the
    graded response (cut from the rendered prompt) in meta."""
    path = Path(path)
    records = _read_json(path)
    cases = []
    for i, rec in enumerate(records):
        where = f"{path}: record {i}"
        _require(rec, ("idx", "response_source", "instruction", "gpt4_score"), where)
        q = _PROMETHEUS_INSTRUCTION_RE.search(rec["instruction"])
        r = _PROMETHEUS_RESPONSE_RE.search(rec["instruction"])
        if q is None or r is None:
            raise RubricError(f"{where}: no '###The instruction to evaluate:' or '###Response to evaluate:' section")
        case_id = f"{rec['idx']}/{rec['response_source']}"
        rubric = prometheus_rubric(parse_prometheus_rubric_text(rec["instruction"], where), f"vicuna/{rec['idx']}", where)
        meta = {"gpt4_score": list(rec["gpt4_score"]), "response": r.group("r").strip(),
                "response_source": rec["response_source"],
                "category": rec.get("category"), "rendered_prompt": rec["instruction"]}
        cases.append(RubricCase(case_id, q.group("q").strip(), rubric, None, meta))
    return cases


# ------------------------------------------------------------------------------------------ HelloBench

def hellobench_rubric(category: str, items: Sequence[str], weights: Sequence[float], source: str = "HelloBench") -> Rubric:
    """One category's checklist -> 0-4 llm dimensions 'item<k>' with the regression weights (sum 100)."""
    if len(items) != len(weights):
        raise RubricError(f"{source}: category {category!r}: {len(items)} checklist items but {len(weights)} weights")
    levels = ("does not satisfy the item at all", "satisfies a small part of the item",
              "half satisfies the item", "satisfies most of the item", "fully satisfies the item")
    dims = []
    for k, (item, w) in enumerate(zip(items, weights)):
        anchors = {lvl: Anchor(f"Score {lvl}/4 (HelloBench {lvl / 4:g}): the response {text}.")
                   for lvl, text in enumerate(levels)}
        try:
            dims.append(Dimension(f"item{k}", item, "llm", Scale.integer(0, 4), anchors, weight=w))
        except RubricError as e:
            raise RubricError(f"{source}: category {category!r}: {e}") from None
    return _imported(f"hellobench/{category}", source, dims, Aggregation("weighted_sum", {}, "drop"))


def hellobench_rubrics(data_dir: str | Path) -> dict[str, Rubric]:
    """HelloBench folder (checklists/*_checklist.json + checklist_weights.json) -> rubric per category."""
    data_dir = Path(data_dir)
    weights_path = data_dir / "checklist_weights.json"
    weights = _read_json(weights_path)
    out: dict[str, Rubric] = {}
    for task in HELLOBENCH_TASKS:
        path = data_dir / "checklists" / f"{task}_checklist.json"
        for category, items in _read_json(path).items():
            if category in out:
                raise RubricError(f"{path}: category {category!r} appears in two tasks")
            if category not in weights:
                raise RubricError(f"{weights_path}: no weights for category {category!r} of {path}")
            out[category] = hellobench_rubric(category, items, weights[category], f"{path} + {weights_path}")
    return out


def hellobench_task_file(data_dir: str | Path, task: str) -> Path:
    """`<task>.jsonl`, or for summarization the `summarization_reconstructed.jsonl` that ../shared/data
    ships when the original (>= 4 MiB, see its SOURCE.txt) is absent."""
    data_dir = Path(data_dir)
    path = data_dir / f"{task}.jsonl"
    reconstructed = data_dir / f"{task}_reconstructed.jsonl"
    return reconstructed if not path.exists() and reconstructed.exists() else path


def import_hellobench(data_dir: str | Path, task: str, file_name: str | None = None) -> list[RubricCase]:
    """One HelloBench task file (default `hellobench_task_file`) -> cases sharing their category's rubric
    (HelloBench is not case-wise)."""
    if task not in HELLOBENCH_TASKS:
        raise RubricError(f"HelloBench task: expected one of {HELLOBENCH_TASKS}, got {task!r}")
    data_dir = Path(data_dir)
    rubrics = hellobench_rubrics(data_dir)
    path = data_dir / file_name if file_name else hellobench_task_file(data_dir, task)
    cases = []
    for where, row in _read_jsonl(path):
        _require(row, ("id", "category", "instruction"), where)
        if row["category"] not in rubrics:
            raise RubricError(f"{where}: unknown category {row['category']!r}")
        cases.append(RubricCase(row["id"], row["instruction"], rubrics[row["category"]], None,
                                {"task": task, "category": row["category"]}))
    return cases


# ------------------------------------------------------------------------------------------ RaR

def rar_rubric(items: Sequence[Mapping[str, Any]], name: str, source: str = "RaR", missing: str = "renormalize") -> Rubric:
    """RaR items {title, description?, weight} -> points dims 'r<k>' grouped by category.

    The category comes from an 'Essential|Important|Optional|Pitfall Criteria:' prefix of the title or,
    failing that, the description; the criterion is '<title>: <description>' without the prefix. Pitfall weights must be negative and
    the others positive. Aggregation 'healthbench_points': sum of met points over sum of positive points.
    """
    dims = []
    for k, item in enumerate(items):
        where = f"{source}: item {k}"
        _require(item, ("weight",), where)
        unknown = sorted(set(item) - {"title", "description", "weight"})
        if unknown:
            raise RubricError(f"{where}: unknown field(s) {unknown}")
        texts = [item.get(f) for f in ("title", "description") if isinstance(item.get(f), str)]
        found = [(_RAR_PREFIX_RE.match(t), t) for t in texts]
        found = [(m, t) for m, t in found if m]
        if not found:
            raise RubricError(f"{where}: no 'Essential|Important|Optional|Pitfall Criteria:' prefix in title or description")
        m, text = found[0]
        category = m.group(1).lower()
        body = text[m.end():].strip()
        title, description = item.get("title"), item.get("description")
        if text is title and isinstance(description, str) and description.strip():
            criterion = f"{body}: {description.strip()}"
        elif text is description and isinstance(title, str) and title.strip():
            criterion = f"{title.strip()}: {body}"
        else:
            criterion = body
        weight = item["weight"]
        if isinstance(weight, float) and weight.is_integer():
            weight = int(weight)
        if isinstance(weight, (int, float)) and not isinstance(weight, bool) and (weight < 0) != (category == "pitfall"):
            sign = "a negative" if category == "pitfall" else "a positive"
            raise RubricError(f"{where}: field 'weight': expected {sign} weight for {_article(category)} criterion, "
                              f"got {weight!r}")
        dims.append(_criterion_dimension(f"r{k:02d}", criterion, weight, category, where))
    return _imported(name, source, dims, Aggregation("healthbench_points", {}, missing))


def import_rar(path: str | Path, missing: str = "renormalize") -> list[RubricCase]:
    """RaR-style jsonl rows {id?, question|prompt, rubric: [items], reference_answer?} -> cases."""
    path = Path(path)
    cases = []
    for i, (where, row) in enumerate(_read_jsonl(path)):
        _require(row, ("rubric",), where)
        question = row.get("question", row.get("prompt"))
        if not isinstance(question, str):
            raise RubricError(f"{where}: expected a 'question' or 'prompt' string")
        case_id = str(row.get("id", i))
        cases.append(RubricCase(case_id, question, rar_rubric(row["rubric"], f"rar/{case_id}", where, missing),
                                row.get("reference_answer")))
    return cases


@dataclasses.dataclass(frozen=True)
class HelloBenchJudgement:
    """One row of HelloBench's published judgements: a judge's per-checklist scores (0..1) for one answer."""

    where: str  # 'FILE:LINE'
    model: str
    task: str
    case_id: str
    category: str
    scores: tuple[float, ...]


_JUDGEMENT_FIELDS = ("model", "task", "id", "category", "checklist_scores")


def read_hellobench_judgements(path: str | Path) -> list[HelloBenchJudgement]:
    """The judgements CSV (model, task, id, category, checklist_scores as a JSON list of numbers in [0, 1]);
    a malformed row raises naming the file, line, field and value."""
    path = Path(path)
    try:
        f = io.TextIOWrapper(open_input(path, "judgements CSV"), encoding="utf-8", newline="")
    except PathError as e:
        raise RubricError(str(e)) from None
    with f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not set(_JUDGEMENT_FIELDS) <= set(reader.fieldnames):
            raise RubricError(f"{path}:1: expected the columns {list(_JUDGEMENT_FIELDS)}, got {reader.fieldnames}")
        rows = []
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if None in row or any(row[k] is None for k in _JUDGEMENT_FIELDS):
                raise RubricError(f"{where}: expected {len(reader.fieldnames)} columns")
            if row["task"] not in HELLOBENCH_TASKS:
                raise RubricError(f"{where}: field 'task': expected one of {HELLOBENCH_TASKS}, got {row['task']!r}")
            for key in ("model", "id", "category"):
                if not row[key].strip():
                    raise RubricError(f"{where}: field {key!r} is empty")
            try:
                scores = json.loads(row["checklist_scores"])
            except json.JSONDecodeError as e:
                raise RubricError(f"{where}: field 'checklist_scores': not valid JSON ({e.msg})") from None
            if (not isinstance(scores, list) or not scores
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in scores)):
                raise RubricError(f"{where}: field 'checklist_scores': expected a non-empty list of numbers in "
                                  f"[0, 1], got {row['checklist_scores'][:80]!r}")
            rows.append(HelloBenchJudgement(where, row["model"], row["task"], row["id"], row["category"],
                                            tuple(float(x) for x in scores)))
    return rows


# ------------------------------------------------------------------------------------------ LongBench-Write

# LongWriter evaluation/judge.txt: six 1-5 dimensions, each described from its best (5) to its worst (1).
LONGBENCH_WRITE_QUALITY = (
    ("relevance", "Relevance", "highly relevant and fully applicable to the user's request",
     "irrelevant or inapplicable to the request"),
    ("accuracy", "Accuracy", "completely accurate, with no factual errors or misleading information",
     "numerous errors and highly misleading"),
    ("coherence", "Coherence", "a clear structure with smooth logical connections",
     "a disorganised structure with no coherence"),
    ("clarity", "Clarity", "clear language, rich in detail and easy to understand",
     "confusing expression with minimal detail"),
    ("breadth_and_depth", "Breadth and Depth", "broad and deep content carrying a lot of information",
     "seriously lacking breadth and depth, minimal information"),
    ("reading_experience", "Reading Experience", "an excellent reading experience: engaging and easy to follow",
     "a very poor reading experience: boring and hard to follow"),
)


def longbench_write_quality_rubric() -> Rubric:
    """LongBench-Write's quality judge as a rubric: six 1-5 llm dimensions (S_q averages them)."""
    dims = []
    for dim_id, name, best, worst in LONGBENCH_WRITE_QUALITY:
        anchors = {5: Anchor(f"Best: {best}."), 4: Anchor(f"Good: {best}, with minor lapses."),
                   3: Anchor(f"Mixed: partly {best}, partly {worst}."),
                   2: Anchor(f"Poor: largely {worst}, with a few redeeming parts."), 1: Anchor(f"Worst: {worst}.")}
        description = (f"{name} of a response to a writing request, from {best} (5) to {worst} (1). Be strict. "
                       "Do not consider whether the response meets the requested length.")
        dims.append(Dimension(dim_id, description, "llm", Scale.integer(1, 5), anchors))
    return _imported("longbench_write/quality", "LongWriter evaluation/judge.txt", dims,
                     Aggregation("weighted_sum", {}, "renormalize"))


def import_longbench_write(path: str | Path) -> list[RubricCase]:
    """LongBench-Write / LongWrite-Ruler jsonl ({prompt, type, length}) -> cases '<file stem>/<record>' with
    the quality rubric; meta holds the category ('type') and the required length in words/characters."""
    path = Path(path)
    rubric = longbench_write_quality_rubric()
    cases = []
    for i, (where, row) in enumerate(_read_jsonl(path)):
        _require(row, ("prompt", "type", "length"), where)
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise RubricError(f"{where}: field 'prompt': expected a non-empty string, got {row['prompt']!r}")
        length = row["length"]
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise RubricError(f"{where}: field 'length': expected a positive integer, got {length!r}")
        cases.append(RubricCase(f"{path.stem}/{i:03d}", row["prompt"], rubric, None,
                                {"type": row["type"], "length": length}))
    return cases
