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
VerdictStore per process (an SQLite connection must not cross a fork); within it, any thread may use it (one-step
off-policy judges on a judging thread, evals on the main one): a lock takes the threads' reads and writes one at a
time. A file that is not a verdict
store (garbage bytes, another SQLite database, another format version) is a StoreError naming it.

The stored text is the truth: llm_judge parses a stored answer's verdict again (an edited or undecodable `scores`
changes nothing and is counted), and a record whose answer or finish reason is not text is a StoreError naming it.
A store that cannot be written (a read-only file, directory or file system) is opened read-only: its answers are
read, the answers judged anew are not stored (llm_judge counts them in judge_store_unsaved), and `open_store`
says so on stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import sqlite3
import sys
import threading
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
        self.path, self.judge_hash, self.read_only = Path(path), judge_hash, False
        self._lock = threading.Lock()  # the connection is used by one thread at a time (`_errors`)
        if self.path.is_dir():
            raise StoreError(f"verdict store {self.path}: is a directory")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"verdict store {self.path}: cannot open: {e}") from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            self._init_schema()
        except sqlite3.Error as e:
            self._db.close()
            if not (self.path.is_file() and _cannot_write(e)):
                raise StoreError(f"verdict store {self.path}: cannot open: {e} (move the file away to start a new "
                                 "store)") from None
            self._open_read_only()
            with self._errors("cannot open"):
                self._check_schema()

    def _open_read_only(self) -> None:
        """Opens the file read-only (SQLite's immutable mode when a read-only directory leaves no room for the
        WAL's shared-memory file: nothing can write a file this process cannot)."""
        self.read_only = True
        for flags in ("mode=ro", "mode=ro&immutable=1"):
            try:
                self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?{flags}", uri=True, isolation_level=None,
                                           check_same_thread=False)
                self._db.execute("SELECT name FROM sqlite_master").fetchall()
                return
            except sqlite3.Error as e:
                error = e
        raise StoreError(f"verdict store {self.path}: cannot open read-only: {error}") from None

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Holds the connection for this thread and turns any SQLite error into one StoreError line naming the
        file."""
        try:
            with self._lock:
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

    def _tables(self) -> set[str]:
        tables = {name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "store_meta" not in tables:
            raise StoreError(f"verdict store {self.path}: an SQLite database but not a verdict store "
                             f"(tables {sorted(tables)})")
        return tables

    def _init_schema(self) -> None:
        self._tables()
        with self._transaction():
            for statement in _SCHEMA:
                self._db.execute(statement)
            self._db.execute("INSERT OR IGNORE INTO store_meta VALUES ('format', ?), ('format_version', ?)",
                             (FORMAT, str(FORMAT_VERSION)))
        self._check_format()

    def _check_schema(self) -> None:
        """A read-only store's tables and format (nothing is created: an empty file is no store to read)."""
        if not {"store_meta", "verdicts"} <= self._tables():
            raise StoreError(f"verdict store {self.path}: read-only and not a verdict store (no verdicts table)")
        self._check_format()

    def _check_format(self) -> None:
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
                    if not isinstance(text, str) or not isinstance(finish_reason, str):
                        raise StoreError(f"verdict store {self.path}: the record of judge {key[0]!r}, prompt "
                                         f"{key[1][:16]}..., sample {key[2]} holds a {type(text).__name__} answer "
                                         f"and a {type(finish_reason).__name__} finish reason, not text; delete that "
                                         "record or move the file away to start a new store")
                    found[key] = StoredAnswer(text, finish_reason, bool(valid), _decoded_scores(scores), str(reason))
        return found

    def put(self, answers: Iterable[tuple[EntryKey, StoredAnswer]]) -> None:
        """Writes `answers` under this judge hash in one transaction (all or none); never on a read-only store."""
        if self.read_only:
            raise StoreError(f"verdict store {self.path}: opened read-only, nothing can be stored")
        rows = [(self.judge_hash, *key, a.text, a.finish_reason, int(a.valid),
                 json.dumps([None if math.isnan(s) else float(s) for s in a.scores]), a.reason)
                for key, a in answers]
        with self._errors("cannot write"), self._transaction():
            self._db.executemany(_INSERT, rows)

    def meta(self, key: str) -> str | None:
        """The store's meta value under `key` (None when absent), e.g. a served judge's fingerprint."""
        with self._errors("cannot read"):
            row = self._db.execute("SELECT value FROM store_meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Writes the meta value `key` (one transaction)."""
        with self._errors("cannot write"), self._transaction():
            self._db.execute("INSERT OR REPLACE INTO store_meta VALUES (?, ?)", (key, value))

    def count(self) -> int:
        """Records stored under this judge hash."""
        with self._errors("cannot read"):
            return self._db.execute("SELECT COUNT(*) FROM verdicts WHERE judge_hash = ?",
                                    (self.judge_hash,)).fetchone()[0]

    def close(self) -> None:
        self._db.close()


def _cannot_write(error: sqlite3.Error) -> bool:
    """Whether opening a store for writing failed for want of write access (file, directory or file system)."""
    return "readonly" in str(error) or getattr(error, "sqlite_errorname", "").startswith("SQLITE_READONLY")


def _decoded_scores(raw: object) -> tuple[float, ...]:
    """A record's stored scores (NaN for null), or () when they do not decode as a list of numbers: only compared
    with the verdict parsed again from the answer text (llm_judge), never used as a score."""
    try:
        values = json.loads(raw)
        return tuple(math.nan if v is None else float(v) for v in values)
    except (TypeError, ValueError):
        return ()


def open_store(path: str, judge_hash: str) -> VerdictStore | None:
    """The store at `path` under `judge_hash`, or None when `path` is "" (no store); a read-only one is said on
    stderr."""
    if not path:
        return None
    store = VerdictStore(path, judge_hash)
    if store.read_only:
        print(f"verdict store {path}: read-only: its verdicts are read, the ones judged anew are not stored "
              "(judge_store_unsaved counts them)", file=sys.stderr)
    return store
