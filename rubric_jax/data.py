"""Question and SFT datasets, the one prompt encoder and response decoder (policy, judges, CLIs), prompt
and SFT batches, a resumable shuffle, data hygiene.

RubricRL trains on questions only (article section 5.1): this module reads them from jsonl, turns them
into left-padded prompt batches whose lengths fall in a few buckets (rubric_jax/padding.py: jitted steps
compile a bounded number of times), walks them in a seeded per-epoch shuffle whose position (seed, epoch,
index) is saved with a checkpoint, and builds cold-start SFT batches (QuRL: `<think>…</think><answer>…</answer>`
responses, loss on response tokens only). A question set is a jsonl file or a split of a tfds dataset
written by `experiments.prepare_data` (rubric_jax/prepare/: PII scrubbing, dedup, difficulty mix).

Shape legend: B batch, P prompt bucket, R response bucket, T = P + R.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rubric_jax import jsonl, padding
from rubric_jax.jsonl import shown

from rubric_jax.rubrics.schema import (Dimension, Rubric, RubricError, RubricWarning, case_rubric, check_rubric_identities,
                                      parse_row_rubric)

SYSTEM_PROMPT = "Think briefly inside <think></think>, then reply inside <answer></answer>."
RESPONSE_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
TFDS_PREFIX = "tfds:"

_QUESTION_FIELDS = {"id": str, "question": str, "category": str, "lang": str}
_QUESTION_OPTIONAL = {"keywords", "difficulty", "rubric", "reference", "labels"}
_ROW_FIELD = {"extra_dimensions": "rubric", "replace_rubric": "rubric"}  # Question field -> the row field it is from
_SFT_FIELDS = {"id": str, "prompt": str, "response": str}
_SFT_OPTIONAL = {"category", "lang"}


class DataError(ValueError):
    """A data file or batch that cannot be used as asked (the message names the file, line or field)."""


@dataclasses.dataclass(frozen=True)
class Question:
    """One training/eval question with its optional case-wise criteria (QuRL R*(q)) and reference answer.

    A row's "rubric" field is {"extra": [dimension, ...]} (criteria added to the shared rubric) or
    {"replace": rubric} (a whole rubric of its own), in the rubric schema's dict format. "reference" is
    a reference answer where the source has one (BiGGen-Bench, HealthBench ideal completions); "labels"
    ({"<dimension id>": number}, golden sets) are people's scores of that reference answer on each
    dimension's raw scale, checked against the question's rubric where the golden set is loaded.
    """

    id: str
    question: str
    category: str
    lang: str
    keywords: tuple[str, ...] = ()
    difficulty: str | None = None
    extra_dimensions: tuple[Dimension, ...] = ()
    replace_rubric: Rubric | None = None
    reference: str | None = None
    labels: Mapping[str, float] = dataclasses.field(default_factory=dict)
    source: str = dataclasses.field(default="", compare=False)  # where it was read ("q.jsonl:12"), for errors


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """One cold-start pair: a user prompt and a formatted `<think>…</think><answer>…</answer>` response."""

    id: str
    prompt: str
    response: str
    source: str = dataclasses.field(default="", compare=False)  # where it was read ("sft.jsonl:12"), for errors


@dataclasses.dataclass(frozen=True)
class SFTBatch:
    """Prompt left-padded to P then response right-padded to R; loss_mask marks response tokens (incl. eos)."""

    tokens_BxT: np.ndarray
    input_mask_BxT: np.ndarray
    loss_mask_BxT: np.ndarray


# ----------------------------------------------------------------------------------------------- files
def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line of a data file; a bad line is a DataError naming file and line."""
    return jsonl.read_jsonl(path, DataError)


def _check_fields(row: dict[str, Any], required: Mapping[str, type], optional: set[str], where: str) -> None:
    """Required fields present with the right type and no unknown fields (a typo is an error, not a default)."""
    for name, kind in required.items():
        if name not in row:
            raise DataError(f"{where}: missing field {name!r}")
        if not isinstance(row[name], kind) or not row[name].strip():
            raise DataError(f"{where}: field {name!r} must be a non-empty {kind.__name__}, got {row[name]!r}")
    unknown = set(row) - set(required) - optional
    if unknown:
        raise DataError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(set(required) | optional)}")


def question_from_row(row: dict[str, Any], where: str) -> Question:
    """A validated Question from a question row; errors name `where` (e.g. 'questions.jsonl:12') and the field."""
    _check_fields(row, _QUESTION_FIELDS, _QUESTION_OPTIONAL, where)
    keywords = row.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) and k.strip() for k in keywords):
        raise DataError(f"{where}: field 'keywords' must be a list of non-empty strings, got {keywords!r}")
    difficulty = row.get("difficulty")
    if difficulty is not None and not isinstance(difficulty, str):
        raise DataError(f"{where}: field 'difficulty' must be a string, got {difficulty!r}")
    reference = row.get("reference")
    if reference is not None and (not isinstance(reference, str) or not reference.strip()):
        raise DataError(f"{where}: field 'reference' must be a non-empty string, got {reference!r}")
    labels = row.get("labels", {})
    if not isinstance(labels, dict):
        raise DataError(f"{where}: field 'labels' must map dimension ids to finite numbers, got {shown(labels)}")
    for k, v in labels.items():  # JSON keys are strings; a value may be an integer no float holds (10**400)
        if jsonl.finite_float(v) is None:
            raise DataError(f"{where}: field 'labels' must map dimension ids to finite numbers, got {k!r}: {shown(v)}")
    if labels and reference is None:
        raise DataError(f"{where}: field 'labels' scores the reference answer; the row has no 'reference'")
    try:
        extra, replace = parse_row_rubric(row.get("rubric"), where)
    except RubricError as e:
        raise DataError(str(e)) from e
    return Question(
        id=row["id"], question=row["question"], category=row["category"], lang=row["lang"],
        keywords=tuple(keywords), difficulty=difficulty, extra_dimensions=extra, replace_rubric=replace,
        reference=reference, labels={k: float(v) for k, v in labels.items()}, source=where,
    )


def question_rubric(shared: Rubric, question: Question) -> Rubric:
    """The rubric that scores answers to `question`: shared, shared + its extra criteria, or its replacement."""
    try:
        return case_rubric(shared, question.id, extra=question.extra_dimensions, replace=question.replace_rubric)
    except RubricError as e:
        raise DataError(f"question {question.id!r}: {e}") from e


def questions_from_rows(rows: Iterable[tuple[str, dict[str, Any]]], source: str) -> list[Question]:
    """Questions from (where, row) pairs: each row validated, ids unique, at least one question.

    Per-question rubrics imported from checklist benchmarks routinely draw the same RubricWarning
    (more than 7 dimensions); they are summed up in one warning instead of one per question.
    """
    questions: list[Question] = []
    first_seen: dict[str, str] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RubricWarning)
        for where, row in rows:
            q = question_from_row(row, where)
            if q.id in first_seen:
                raise DataError(f"{where}: duplicate id {q.id!r} (first seen at {first_seen[q.id]})")
            first_seen[q.id] = where
            questions.append(q)
    rubric_warnings = [w for w in caught if issubclass(w.category, RubricWarning)]
    for w in caught:
        if not issubclass(w.category, RubricWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if rubric_warnings:
        warnings.warn(f"{source}: {len(rubric_warnings)} rubric warnings for its questions, e.g. "
                      f"{rubric_warnings[0].message}", RubricWarning, stacklevel=2)
    if not questions:
        raise DataError(f"{source}: no questions")
    check_replace_identities(questions)
    return questions


def check_replace_identities(questions: Sequence[Question], shared: tuple[Rubric, str] | None = None) -> None:
    """Raise DataError if two of the questions' `replace` rubrics (or one and the `shared` (rubric, source)) share a
    name and version but not their content: name@version identifies a rubric in logs, checkpoints and the judge
    store, so two questions with different ids may not give it two meanings."""
    replaced = [(q.replace_rubric, q.source or f"question {q.id!r}") for q in questions if q.replace_rubric is not None]
    try:
        check_rubric_identities(([shared] if shared is not None else []) + replaced)
    except RubricError as e:
        raise DataError(str(e)) from None


def _differences(a: Question, b: Question) -> list[str]:
    """The row fields in which two questions differ ('rubric' for their case-wise criteria)."""
    fields = [f.name for f in dataclasses.fields(Question) if f.compare and getattr(a, f.name) != getattr(b, f.name)]
    return sorted({_ROW_FIELD.get(name, name) for name in fields})


def check_split_ids(first: tuple[str, Sequence[Question]], second: tuple[str, Sequence[Question]]) -> None:
    """Raise unless every id the two (config key, questions) splits share names identical rows.

    A run finds a question's rubric by its id in one table for every split (Experiment.rubric_of), and its logs
    name questions by id: two different rows under one id would score one with the other's rubric. The same file
    used for both splits (identical rows) is fine.
    """
    (first_key, first_rows), (second_key, second_rows) = first, second
    by_id = {q.id: q for q in first_rows}
    clashes = [(by_id[q.id], q) for q in second_rows if q.id in by_id and by_id[q.id] != q]
    if clashes:
        a, b = clashes[0]
        more = f" (and {len(clashes) - 1} more such id{'s' if len(clashes) > 2 else ''})" if len(clashes) > 1 else ""
        raise DataError(f"config.{second_key}: question id {a.id!r} names different rows in config.{first_key} "
                        f"({a.source}) and config.{second_key} ({b.source}), differing in {_differences(a, b)}{more}; "
                        f"a question's rubric is found by its id, so one row would be scored with the other's: give "
                        f"the rows ids of their own, or make them identical")


def load_questions(path: str | Path) -> list[Question]:
    """Reads a question jsonl ({"id","question","category","lang"} + optional keywords, difficulty, rubric,
    reference, labels)."""
    return questions_from_rows(((f"{path}:{lineno}", row) for lineno, row in read_jsonl(path)), str(path))


def load_question_set(spec: str, tfds_dir: str, default_split: str) -> list[Question]:
    """Questions from a jsonl path, or from `tfds:NAME[:SPLIT]` (a dataset in `tfds_dir`; SPLIT defaults
    to `default_split`) written by experiments.prepare_data."""
    if not spec.startswith(TFDS_PREFIX):
        return load_questions(spec)
    name, _, split = spec[len(TFDS_PREFIX):].partition(":")
    split = split or default_split
    if not tfds_dir:
        raise DataError(f"{spec}: config.data.tfds_dir must name the directory that holds tfds dataset {name!r}")
    from rubric_jax.prepare import tfds_dataset  # tensorflow-datasets is imported only when a tfds: set is used

    rows = tfds_dataset.read_split(tfds_dir, name, split)
    return questions_from_rows(((f"{spec} (record {i})", row) for i, row in enumerate(rows)), spec)


def check_response_format(response: str) -> bool:
    """True when the four tags occur exactly once each and in order (think before answer)."""
    positions = [response.find(tag) for tag in RESPONSE_TAGS]
    once = all(response.count(tag) == 1 for tag in RESPONSE_TAGS)
    return once and -1 not in positions and positions == sorted(positions)


def load_sft(path: str | Path) -> list[SFTExample]:
    """Reads an SFT jsonl ({"id","prompt","response"}); every response must be in the think/answer format."""
    examples: list[SFTExample] = []
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        _check_fields(row, _SFT_FIELDS, _SFT_OPTIONAL, where)
        if not check_response_format(row["response"]):
            raise DataError(f"{where}: field 'response' is not '<think>…</think><answer>…</answer>': "
                            f"{row['response'][:80]!r}")
        examples.append(SFTExample(id=row["id"], prompt=row["prompt"], response=row["response"], source=where))
    if not examples:
        raise DataError(f"{path}: no SFT examples")
    return examples


# ----------------------------------------------------------------------------------------- tokenising
def chat_messages(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The conversation a policy sees: the format instruction as system turn, the question as user turn."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def conversation_text(turns: Sequence[Mapping[str, str]]) -> str:
    """A conversation as one text of 'role: content' paragraphs (how HealthBench's grader is shown it)."""
    return "\n\n".join(f"{t['role']}: {t['content']}" for t in turns)


def encode_chats(tokenizer: Any, chats: Sequence[Sequence[Mapping[str, str]]], *,
                 add_generation_prompt: bool = True) -> list[list[int]]:
    """Token ids of each conversation rendered with the tokenizer's chat template, ending in the assistant
    header (or, with add_generation_prompt=False, as the template closes the last turn: a reward model's input)."""
    texts = [tokenizer.apply_chat_template([dict(m) for m in chat], tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
             for chat in chats]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def encode_prompts(tokenizer: Any, questions: Sequence[str], system_prompt: str = SYSTEM_PROMPT) -> list[list[int]]:
    """Token ids of each question as a chat (format instruction as system turn), ending in the assistant header."""
    return encode_chats(tokenizer, [chat_messages(q, system_prompt) for q in questions])


def encode_responses(tokenizer: Any, responses: Sequence[str]) -> list[list[int]]:
    """Token ids of each response followed by eos (the model must learn to stop)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError("tokenizer has no eos_token; the SFT response needs one to learn to stop")
    return [list(ids) + [eos] for ids in tokenizer(list(responses), add_special_tokens=False)["input_ids"]]


def decode_responses(tokenizer: Any, result: Any, stop_tokens: Sequence[int] = (), *,
                     keep_special_tokens: bool = True) -> list[str]:
    """The text of each generated row of a `sampling.GenerationResult` (its first `lengths` tokens), without
    a final stop token. The policy keeps special tokens such as <think> (rules read them); a judge or a
    rubric-construction model drops them (its answer is parsed as plain text)."""
    texts = []
    for tokens_R, length in zip(np.asarray(result.tokens), np.asarray(result.lengths)):
        ids = [int(t) for t in tokens_R[:length]]
        if ids and ids[-1] in stop_tokens:
            ids = ids[:-1]
        texts.append(tokenizer.decode(ids, skip_special_tokens=not keep_special_tokens))
    return texts


# ------------------------------------------------------------------------------------------- batches
def prompt_batch(tokenizer: Any, questions: Sequence[str], buckets: Sequence[int],
                 system_prompt: str = SYSTEM_PROMPT, *, across_processes: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Chat-template prompts, left-padded for generation: (ids_BxP, mask_BxP); with `across_processes`
    (each process batching its own block) the width is the same on every process."""
    return padding.pad_left(encode_prompts(tokenizer, questions, system_prompt), tokenizer.pad_token_id, buckets,
                            across_processes=across_processes)


def check_sft_lengths(tokenizer: Any, examples: Sequence[SFTExample], prompt_buckets: Sequence[int],
                      response_buckets: Sequence[int], max_positions: int, system_prompt: str = SYSTEM_PROMPT) -> None:
    """Every SFT pair fits its padding buckets and the model's positions; else one line naming the file and
    line (checked before the first step, so a long example cannot stop SFT halfway)."""
    prompts = encode_prompts(tokenizer, [e.prompt for e in examples], system_prompt)
    responses = encode_responses(tokenizer, [e.response for e in examples])
    for example, prompt, response in zip(examples, prompts, responses):
        for what, ids, buckets, setting in (("prompt", prompt, prompt_buckets, "config.data.max_prompt_len"),
                                            ("response", response, response_buckets, "config.sft.max_response_len")):
            if len(ids) > max(buckets):
                raise DataError(f"{example.source}: {what} of {example.id!r} is {len(ids)} tokens; {setting} "
                                f"allows {max(buckets)}")
        if len(prompt) + len(response) > max_positions:
            raise DataError(f"{example.source}: {example.id!r} is {len(prompt) + len(response)} tokens (prompt + "
                            f"response), more than the model's max_position_embeddings ({max_positions})")


def sft_batch(tokenizer: Any, examples: Sequence[SFTExample], prompt_buckets: Sequence[int],
              response_buckets: Sequence[int], system_prompt: str = SYSTEM_PROMPT, *,
              across_processes: bool = False) -> SFTBatch:
    """[left-padded prompt | right-padded response+eos], the same layout a GRPO rollout has; with
    `across_processes` the widths are the same on every process."""
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = padding.pad_left(encode_prompts(tokenizer, [e.prompt for e in examples],
                                                              system_prompt), pad, prompt_buckets,
                                               across_processes=across_processes)
    resp_ids, resp_mask = padding.pad_right(encode_responses(tokenizer, [e.response for e in examples]), pad,
                                            response_buckets, across_processes=across_processes)
    return SFTBatch(
        tokens_BxT=np.concatenate([prompt_ids, resp_ids], axis=1),
        input_mask_BxT=np.concatenate([prompt_mask, resp_mask], axis=1),
        loss_mask_BxT=np.concatenate([np.zeros_like(prompt_mask), resp_mask], axis=1),
    )


# ------------------------------------------------------------------------------------------ iterator
@dataclasses.dataclass(frozen=True)
class IteratorState:
    """Position in the endless stream of per-epoch permutations; saved with checkpoints to resume exactly."""

    seed: int
    epoch: int = 0
    index: int = 0

    def __post_init__(self) -> None:
        for name in ("seed", "epoch", "index"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise DataError(f"IteratorState.{name} must be a non-negative int, got {v!r}")

    def to_dict(self) -> dict[str, int]:
        """JSON-serialisable form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> IteratorState:
        """Inverse of to_dict; unknown or missing keys are errors."""
        if set(d) != {"seed", "epoch", "index"}:
            raise DataError(f"iterator state must have keys seed, epoch, index; got {sorted(d)}")
        return cls(seed=d["seed"], epoch=d["epoch"], index=d["index"])


def epoch_permutation(seed: int, epoch: int, num_rows: int) -> np.ndarray:
    """The order of rows in one epoch: a function of (seed, epoch) only."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch])).permutation(num_rows)


def next_batch_indices(state: IteratorState, num_rows: int, batch_size: int) -> tuple[np.ndarray, IteratorState]:
    """The next `batch_size` row indices and the state after them; a batch may run on into the next epoch."""
    if num_rows <= 0 or batch_size <= 0:
        raise DataError(f"num_rows and batch_size must be positive, got {num_rows} and {batch_size}")
    if state.index >= num_rows:
        raise DataError(f"iterator index {state.index} is past the dataset of {num_rows} rows")
    epoch, index, out = state.epoch, state.index, []
    while len(out) < batch_size:
        take = min(batch_size - len(out), num_rows - index)
        out.extend(epoch_permutation(state.seed, epoch, num_rows)[index:index + take].tolist())
        index += take
        if index == num_rows:
            epoch, index = epoch + 1, 0
    return np.asarray(out, dtype=np.int64), IteratorState(seed=state.seed, epoch=epoch, index=index)


class BatchIterator:
    """Endless iterator over lists of rows; `.state` after a batch resumes right after that batch."""

    def __init__(self, rows: Sequence[Any], batch_size: int, state: IteratorState):
        self.rows, self.batch_size, self.state = rows, batch_size, state

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> list[Any]:
        indices, self.state = next_batch_indices(self.state, len(self.rows), self.batch_size)
        return [self.rows[i] for i in indices]
