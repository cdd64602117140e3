"""Inputs of prepare_data -> question rows (the jsonl schema of rubric_jax.data), each with where it came from.

An input is KIND:PATH. `questions` is the project's own question jsonl, kept as written (a row without
"lang" gets the language guessed from its question's script, as the benchmarks do; the log says so). The public
benchmarks go through rubrics/importers.py and become rows with their per-question rubric as
{"replace": rubric}, a category, a language guessed from the script (the benchmarks do not label it)
and the reference answer where the benchmark has one:

  hellobench:DIR        the five task files (summarization from its reconstruction when the original is
                        absent); category = HelloBench category; the category's checklist rubric
  biggen:FILE           BiGGen-Bench; category = capability; reference = reference_answer
  healthbench:FILE      HealthBench (oss_eval or the RuscaRL copy); category = theme; reference = the
                        ideal completion; a multi-turn conversation becomes one 'role: content' text
  longbench_write:FILE  LongBench-Write / LongWrite-Ruler; category = type; the quality rubric plus a
                        length rule, so the reward is the paper's (S_l + S_q) / 2

Ids are '<kind>/<benchmark id>' (with the file name when the benchmark numbers its lines).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rubric_jax import data
from rubric_jax.files import PathError, check_input_file
from rubric_jax.jsonl import finite_float, read_jsonl, shown
from rubric_jax.rubrics.importers import (
    HELLOBENCH_TASKS,
    RubricCase,
    hellobench_task_file,
    import_biggen_bench,
    import_healthbench,
    import_hellobench,
    import_longbench_write,
)
from rubric_jax.rubrics.schema import Aggregation, Anchor, Dimension, Rubric, RubricWarning, Scale, rubric_to_dict

INPUT_KINDS = ("questions", "hellobench", "biggen", "healthbench", "longbench_write")
HEALTHBENCH_THEMES = ("emergency_referrals", "context_seeking", "global_health", "health_data_tasks", "hedging",
                      "communication", "complex_responses")
_LETTER = re.compile(r"[^\W\d_]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HANGUL = re.compile(r"[\uac00-\ud7af]")
_ASCII_LETTER = re.compile(r"[A-Za-z]")
_WORD = re.compile(r"[^\W\d_]+")
_ENGLISH_FUNCTION_WORDS = frozenset(
    "a an the and or but if of to in on at by for with from as is are was were be been it its this that these "
    "those i you he she we they my your our their me him her us them what which who how why when where do does "
    "did can could should would will not no".split())


class InputError(ValueError):
    """An input that cannot be read as asked; the message names the input, file and line or record."""


@dataclasses.dataclass(frozen=True)
class SourceRow:
    """One question row, where it came from ('FILE:LINE' or 'FILE: record I') and its input kind."""

    row: dict[str, Any]
    where: str
    kind: str


def parse_input_spec(spec: str) -> tuple[str, Path]:
    """'KIND:PATH' -> (kind, path); the kind must be one of INPUT_KINDS and the path must exist."""
    kind, sep, path = spec.partition(":")
    if not sep or not path:
        raise InputError(f"--input={spec}: expected KIND:PATH with KIND one of {', '.join(INPUT_KINDS)}")
    if kind not in INPUT_KINDS:
        raise InputError(f"--input={spec}: unknown input kind {kind!r}; expected one of {', '.join(INPUT_KINDS)}")
    if not Path(path).exists():
        raise InputError(f"--input={spec}: {path} does not exist")
    if kind == "hellobench":
        if not Path(path).is_dir():
            raise InputError(f"--input={spec}: expected a directory")
    else:  # a FIFO would block the read forever, /dev/zero fill memory
        try:
            check_input_file(path, kind)
        except PathError as e:
            raise InputError(f"--input={spec}: {e}") from None
    return kind, Path(path)


def guess_lang(text: str) -> str:
    """'zh', 'ja', 'ko', 'en' or 'und' from the letters' scripts. English: the letters outside CJK scripts
    are ASCII and >= 15% of the words are English function words (so Spanish or German is 'und'). The
    first 4,000 characters decide."""
    text = text[:4000]
    letters = len(_LETTER.findall(text))
    kana, hangul, han = (len(p.findall(text)) for p in (_KANA, _HANGUL, _HAN))
    if letters == 0:
        return "und"
    if kana >= 0.1 * letters:
        return "ja"
    if hangul >= 0.3 * letters:
        return "ko"
    if han >= 0.3 * letters:
        return "zh"
    if len(_ASCII_LETTER.findall(text)) < 0.95 * (letters - kana - hangul - han):
        return "und"
    words = _WORD.findall(text.casefold())
    return "en" if sum(w in _ENGLISH_FUNCTION_WORDS for w in words) >= 0.15 * len(words) else "und"


def render_conversation(turns: Sequence[Mapping[str, str]]) -> str:
    """A single user turn as itself; a longer conversation as 'user: …' / 'assistant: …' paragraphs."""
    if len(turns) == 1 and turns[0]["role"] == "user":
        return turns[0]["content"]
    return data.conversation_text(turns)


def healthbench_theme(case: RubricCase) -> str:
    """The example's 'theme:' tag, else the theme its 'cluster:' criteria name, else 'unknown'."""
    tags = list(case.meta.get("example_tags", []))
    tags += [t for item_tags in case.meta.get("criterion_tags", {}).values() for t in item_tags]
    for tag in tags:
        if tag.startswith("theme:"):
            return tag.removeprefix("theme:")
    for tag in tags:
        if tag.startswith("cluster:"):
            cluster = tag.removeprefix("cluster:")
            for theme in HEALTHBENCH_THEMES:
                if cluster == theme or cluster.startswith(theme + "_"):
                    return theme
    return "unknown"


def case_row(row_id: str, question: str, case: RubricCase, category: str) -> dict[str, Any]:
    """A question row for an imported case: its rubric as {"replace": ...} and its reference if any."""
    row: dict[str, Any] = {"id": row_id, "question": question, "category": category, "lang": guess_lang(question),
                           "rubric": {"replace": rubric_to_dict(case.rubric)}}
    if case.reference and case.reference.strip():
        row["reference"] = case.reference
    return row


def _hellobench_rows(data_dir: Path, notes: dict[str, Any]) -> list[SourceRow]:
    rows = []
    for task in HELLOBENCH_TASKS:
        path = hellobench_task_file(data_dir, task)
        if not path.exists():
            raise InputError(f"{data_dir}: HelloBench task file {path.name} does not exist")
        if path.name != f"{task}.jsonl":
            notes.setdefault("reconstructed_files", []).append(path.name)
        for i, case in enumerate(import_hellobench(data_dir, task)):
            rows.append(SourceRow(case_row(f"hellobench/{case.case_id}", case.prompt, case, case.meta["category"]),
                                  f"{path}: record {i}", "hellobench"))
    return rows


def longbench_write_rubric(case: RubricCase) -> Rubric:
    """The quality rubric plus a `length` rule at the required length, weighing as much as the six together.

    The rule is S_l / 100 (1 at the required length, 0 at a third of it or four times it) and a 1-5
    dimension normalises as (s - 1) / 4 = S_q's (mean - 1) * 25 / 100, so the weighted sum is the
    paper's S = (S_l + S_q) / 2 on [0, 1]. The rule counts CJK characters and letter runs of any script,
    LongBench-Write CJK characters and [a-zA-Z]+ runs.
    """
    required = case.meta["length"]
    quality = case.rubric.dimensions
    length = Dimension(
        "length", f"The response is {required} units long (CJK characters + words), as requested.", "rule",
        Scale.binary(), {0: Anchor("A third of the requested length or less, or four times it or more."),
                         1: Anchor("Exactly the requested length.")},
        weight=float(sum(d.weight for d in quality)), rule="length",
        params={"min": required, "max": required, "unit": "auto"})
    return dataclasses.replace(case.rubric, name=f"longbench_write/{case.case_id}", dimensions=(length, *quality),
                               aggregation=Aggregation("weighted_sum", {}, "drop"))


def _file_rows(kind: str, path: Path, notes: dict[str, Any]) -> list[SourceRow]:
    rows = []
    if kind == "biggen":
        for i, case in enumerate(import_biggen_bench(path)):
            rows.append(SourceRow(case_row(f"biggen/{case.case_id}", case.prompt, case,
                                           case.meta.get("capability", "biggen")), f"{path}: record {i}", kind))
    elif kind == "healthbench":
        for i, case in enumerate(import_healthbench(path)):
            if len(case.prompt) > 1:
                notes["multi_turn_rendered"] = notes.get("multi_turn_rendered", 0) + 1
            rows.append(SourceRow(case_row(f"healthbench/{path.stem}/{case.case_id}", render_conversation(case.prompt),
                                           case, healthbench_theme(case)), f"{path}: record {i}", kind))
    elif kind == "longbench_write":
        for i, case in enumerate(import_longbench_write(path)):
            case = dataclasses.replace(case, rubric=longbench_write_rubric(case))
            rows.append(SourceRow(case_row(f"longbench_write/{case.case_id}", case.prompt, case,
                                           str(case.meta["type"])), f"{path}: record {i}", kind))
    else:  # questions: the project's own rows, as written (a missing "lang" guessed from the question's script)
        guessed: collections.Counter[str] = collections.Counter()
        for lineno, row in read_jsonl(path, InputError):
            if "lang" not in row and isinstance(row.get("question"), str):
                row = {**row, "lang": guess_lang(row["question"])}
                guessed[row["lang"]] += 1
            rows.append(SourceRow(row, f"{path}:{lineno}", kind))
        if guessed:
            notes["lang_guessed"] = dict(sorted(guessed.items()))
    return rows


def read_input(kind: str, path: Path) -> tuple[list[SourceRow], dict[str, Any]]:
    """(rows, notes) of one input, validated as a question set (errors name file and line or record)."""
    notes: dict[str, Any] = {}
    rows = _hellobench_rows(path, notes) if kind == "hellobench" else _file_rows(kind, path, notes)
    with warnings.catch_warnings():
        if kind != "questions":  # checklist benchmarks exceed 7 criteria by design (see rubrics/importers.py)
            warnings.simplefilter("ignore", RubricWarning)
        data.questions_from_rows(((r.where, r.row) for r in rows), str(path))
    return rows, notes


def read_mean_rewards(path: Path) -> tuple[dict[str, float], dict[str, int]]:
    """{question id: mean reward} from a scores jsonl (experiments.score output with each question's "id").

    Rows whose reward_ok is false carry no reward and are skipped (counted in the returned stats).
    """
    try:
        check_input_file(path, "scores")
    except PathError as e:
        raise InputError(f"--scores={path}: {e}") from None
    sums: dict[str, list[float]] = {}
    stats = {"rows": 0, "skipped_not_ok": 0}
    for lineno, row in read_jsonl(path, InputError):
        where = f"{path}:{lineno}"
        stats["rows"] += 1
        if not isinstance(row.get("id"), str):
            raise InputError(f"{where}: field 'id': expected the question id as a string, got {row.get('id')!r} "
                             f"(keep the question row's id in the responses file)")
        if row.get("reward_ok") is False:
            stats["skipped_not_ok"] += 1
            continue
        reward = row.get("reward")
        number = finite_float(reward)
        if number is None:
            raise InputError(f"{where}: field 'reward': expected a finite number, got {shown(reward)}")
        sums.setdefault(row["id"], []).append(number)
    if not sums:
        raise InputError(f"--scores={path}: no usable rewards")
    return {qid: sum(v) / len(v) for qid, v in sums.items()}, stats
