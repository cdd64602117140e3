"""The verdict store: judge answers in a content-addressed SQLite file, so a re-run judges only what changed.

One record is one judge answer to one rendered prompt, keyed by
  judge_hash   the judge specification's hash (weights' identity, settings, prompt template version): a
               store shared by several judge specifications never hands one's answer to another;
  judge        the judge's name within the specification (its checkpoint), for ensembles;
  prompt       sha256 of the exact token ids sent (the chat-templated prompt, nonce and anchor order included);
  sample       the sample index of the item (samples of one item are independent draws);
  seed         the judge key's data (hex), the seed material that chose the nonce and anchor order;
and holds the raw answer text, the finish reason ("stop" / "length") and the parsed verdict (scores, valid,
the parser's reason when invalid). llm_judge reads it before each generate call and writes every answer
of a call right after it, one transaction per call, so a killed job loses at most one call's work.

Concurrency: WAL journal (readers never block the one writer) and a busy timeout (a writer waits for
another process's write instead of failing), so several processes may share one file. Open one
VerdictStore per process (an SQLite connection must not cross a fork). A file that is not a verdict
store (garbage bytes, another SQLite database, another format version) is a StoreError naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

FORMAT = "rubric_jax.verdict_store"
FORMAT_VERSION = 1
BUSY_TIMEOUT_S = 60.0  # how long a write waits for another process's write before it is an error
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS verdicts (judge_hash TEXT NOT NULL, judge TEXT NOT NULL, prompt TEXT NOT NULL, "
    "sample INTEGER NOT NULL, seed TEXT NOT NULL, answer TEXT NOT NULL, finish_reason TEXT NOT NULL, "
    "valid INTEGER NOT NULL, scores TEXT NOT NULL, reason TEXT NOT NULL, "
    "PRIMARY KEY (judge_hash, judge, prompt, sample, seed)) WITHOUT ROWID",
)
_SELECT = ("SELECT answer, finish_reason, valid, scores, reason FROM verdicts "
           "WHERE judge_hash = ? AND judge = ? AND prompt = ? AND sample = ? AND seed = ?")
_INSERT = "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


class StoreError(ValueError):
    """A verdict store file that cannot be used (not SQLite, not a verdict store, unreadable); names the file."""


@dataclasses.dataclass(frozen=True)
class StoredAnswer:
    """One judge answer: raw text, finish reason, and the parsed verdict (scores NaN where invalid)."""

    text: str
    finish_reason: str
    valid: bool
    scores: tuple[float, ...]
    reason: str


# (judge name, prompt digest, sample index, seed): what identifies an answer under one judge hash.
EntryKey = tuple[str, str, int, str]


def prompt_digest(token_ids: Sequence[int]) -> str:
    """sha256 of the exact token ids sent to the judge (the store's `prompt` field)."""
    return hashlib.sha256(np.asarray(token_ids, dtype=np.int64).tobytes()).hexdigest()


def messages_digest(messages: Sequence[Mapping[str, str]]) -> str:
    """sha256 of a prompt's chat messages (the store's `prompt` field for a served judge without a local
    tokenizer, whose token ids are never seen here)."""
    return hashlib.sha256(json.dumps(list(messages), sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


class VerdictStore:
    """A verdict store file read and written under one judge hash (records of other hashes are never read)."""

    def __init__(self, path: str | Path, judge_hash: str, busy_timeout_s: float = BUSY_TIMEOUT_S):
        if not isinstance(judge_hash, str) or not judge_hash:
            raise ValueError(f"verdict store {path}: judge_hash must be a non-empty string, got {judge_hash!r}")
        self.path, self.judge_hash = Path(path), judge_hash
        if self.path.is_dir():
            raise StoreError(f"verdict store {self.path}: is a directory")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"verdict store {self.path}: cannot open: {e}") from None
        with self._errors("cannot open"):
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            self._init_schema()

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Turns any SQLite error into one StoreError line naming the file."""
        try:
            yield
        except sqlite3.Error as e:
            raise StoreError(f"verdict store {self.path}: {doing}: {e} (move the file away to start a new "
                             "store)") from None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction, taking the write lock at its start (waits up to the busy timeout)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _init_schema(self) -> None:
        tables = {name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "store_meta" not in tables:
            raise StoreError(f"verdict store {self.path}: an SQLite database but not a verdict store "
                             f"(tables {sorted(tables)})")
        with self._transaction():
            for statement in _SCHEMA:
                self._db.execute(statement)
            self._db.execute("INSERT OR IGNORE INTO store_meta VALUES ('format', ?), ('format_version', ?)",
                             (FORMAT, str(FORMAT_VERSION)))
            meta = dict(self._db.execute("SELECT key, value FROM store_meta"))
        if (meta.get("format"), meta.get("format_version")) != (FORMAT, str(FORMAT_VERSION)):
            raise StoreError(f"verdict store {self.path}: format {meta.get('format')!r} version "
                             f"{meta.get('format_version')!r}; this code reads {FORMAT!r} version {FORMAT_VERSION}")

    def get(self, keys: Iterable[EntryKey]) -> dict[EntryKey, StoredAnswer]:
        """The stored answers among `keys` under this judge hash (missing keys are absent)."""
        found = {}
        with self._errors("cannot read"):
            for key in keys:
                row = self._db.execute(_SELECT, (self.judge_hash, *key)).fetchone()
                if row is not None:
                    text, finish_reason, valid, scores, reason = row
                    found[key] = StoredAnswer(text, finish_reason, bool(valid),
                                              tuple(math.nan if s is None else s for s in json.loads(scores)), reason)
        return found

    def put(self, answers: Iterable[tuple[EntryKey, StoredAnswer]]) -> None:
        """Writes `answers` under this judge hash in one transaction (all or none)."""
        rows = [(self.judge_hash, *key, a.text, a.finish_reason, int(a.valid),
                 json.dumps([None if math.isnan(s) else float(s) for s in a.scores]), a.reason)
                for key, a in answers]
        with self._errors("cannot write"), self._transaction():
            self._db.executemany(_INSERT, rows)

    def count(self) -> int:
        """Records stored under this judge hash."""
        with self._errors("cannot read"):
            return self._db.execute("SELECT COUNT(*) FROM verdicts WHERE judge_hash = ?",
                                    (self.judge_hash,)).fetchone()[0]

    def close(self) -> None:
        self._db.close()


def open_store(path: str, judge_hash: str) -> VerdictStore | None:
    """The store at `path` under `judge_hash`, or None when `path` is "" (no store)."""
    return VerdictStore(path, judge_hash) if path else None
