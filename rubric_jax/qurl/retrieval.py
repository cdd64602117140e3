"""QuRL step 1: retrieve reference documents for a question from a local corpus (no network).

QuRL §3.1 asks a search engine for pages about the question and keeps the ones with the highest
click-through rate, a cheap prior for "widely endorsed, probably good". Offline, that is two steps:
  relevance  BM25 over the corpus, Lucene's variant as the `bm25s` library computes it (method "lucene", in
             float64; a 76 KB wheel that needs only numpy):
               score(q, d) = Σ_{t ∈ q} idf(t) · tf(t, d) / (tf(t, d) + k1 · (1 − b + b · |d| / avgdl))
               idf(t)      = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))
             with each distinct query term counted once; the `pool` best documents whose score is at
             least `min_relevance` times the best score (and above 0) form the pool;
  prior      the pool is re-ranked by the document's quality prior (higher first; ties by BM25, then
             corpus order) and the first `top_k` are kept.
The relevance floor keeps the prior from promoting a popular page that shares one word with the query;
a document that shares no term with it is never retrieved, however high its prior. The query is built
from the question's keywords, as QuRL does, or from its text when it has none (`query_text`).

Tokens (`tokenize`), as Lucene's analyzers make them: NFKC, case-folded; runs of letters/digits are
words, minus Lucene's English stop words (EnglishAnalyzer), with plurals folded by Lucene's
EnglishMinimalStemmer (Harman's S-stemmer: injuries -> injury, runners -> runner); a run of Han characters gives its
overlapping bigrams, or its one character when it stands alone (CJKAnalyzer: no word segmenter, a
bigram approximates a two-character word such as 阅读, and function characters such as 的 alone never
match).

Corpus file: jsonl, one document per line: {"doc_id": str, "title": str, "text": str, "quality": number}
plus optional "lang" and "url"; ids unique. Errors name the file, line, field and value.
"""

from __future__ import annotations

import dataclasses
import math
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rubric_jax import jsonl

if TYPE_CHECKING:
    import bm25s
from rubric_jax.jsonl import finite_float, shown

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN_RE = re.compile(rf"[{_HAN}]+|[^\W_{_HAN}]+")
_HAN_RE = re.compile(rf"[{_HAN}]")
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                       "there these they this to was will with".split())
_REQUIRED = {"doc_id": str, "title": str, "text": str}
_OPTIONAL = {"lang": str, "url": str}


class CorpusError(ValueError):
    """A corpus file that cannot be used; the message names the file, line and field."""


@dataclasses.dataclass(frozen=True)
class Document:
    """One reference document and its quality prior (e.g. click-through rate; higher = better)."""

    doc_id: str
    title: str
    text: str
    quality: float


@dataclasses.dataclass(frozen=True)
class Retrieved:
    """A retrieved document with its BM25 relevance to the question."""

    document: Document
    bm25: float


def _document(row: dict, where: str) -> Document:
    """A validated Document from one corpus row."""
    for name, kind in _REQUIRED.items():
        if name not in row:
            raise CorpusError(f"{where}: missing field {name!r}")
        if not isinstance(row[name], kind) or not row[name].strip():
            raise CorpusError(f"{where}: field {name!r} must be a non-empty string, got {row[name]!r}")
    quality = row.get("quality")
    if finite_float(quality) is None:
        raise CorpusError(f"{where}: field 'quality' must be a finite number (a quality prior such as a "
                          f"click-through rate), got {shown(quality)}")
    for name, kind in _OPTIONAL.items():
        if name in row and not isinstance(row[name], kind):
            raise CorpusError(f"{where}: field {name!r} must be a {kind.__name__}, got {row[name]!r}")
    unknown = sorted(set(row) - set(_REQUIRED) - set(_OPTIONAL) - {"quality"})
    if unknown:
        raise CorpusError(f"{where}: unknown field(s) {unknown}; allowed: "
                          f"{sorted([*_REQUIRED, 'quality', *_OPTIONAL])}")
    return Document(row["doc_id"], row["title"], row["text"], float(quality))


def load_corpus(path: str | Path) -> list[Document]:
    """Every document of a corpus jsonl, validated; duplicate ids and an empty corpus are errors."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: corpus file does not exist")
    documents: list[Document] = []
    first_line: dict[str, int] = {}
    for lineno, row in jsonl.read_jsonl(path, CorpusError):
        where = f"{path}:{lineno}"
        doc = _document(row, where)
        if doc.doc_id in first_line:
            raise CorpusError(f"{where}: duplicate doc_id {doc.doc_id!r} (first on line {first_line[doc.doc_id]})")
        first_line[doc.doc_id] = lineno
        documents.append(doc)
    if not documents:
        raise CorpusError(f"{path}: no documents")
    return documents


def s_stem(word: str) -> str:
    """Harman's S-stemmer as Lucene's EnglishMinimalStemmer: -ies -> -y, -es -> -e, -s -> '' (with its exceptions)."""
    if len(word) < 3 or word[-1] != "s" or word[-2] in "us":
        return word
    if word[-2] == "e":
        if len(word) > 3 and word[-3] == "i" and word[-4] not in "ae":
            return word[:-3] + "y"
        if word[-3] in "iaoe":
            return word
    return word[:-1]


def tokenize(text: str) -> list[str]:
    """Case-folded words without stop words, and Han bigrams (see the module docstring)."""
    tokens: list[str] = []
    for run in _TOKEN_RE.findall(unicodedata.normalize("NFKC", text).casefold()):
        if _HAN_RE.match(run):
            tokens.extend([run] if len(run) == 1 else [run[i:i + 2] for i in range(len(run) - 1)])
        elif run not in STOP_WORDS:
            tokens.append(s_stem(run))
    return tokens


@dataclasses.dataclass(frozen=True)
class BM25Index:
    """bm25s's Lucene BM25 over N tokenised documents, in float64, queried one distinct term at a time."""

    engine: bm25s.BM25 | None  # None when no document has a token (bm25s needs a vocabulary): every score is 0
    num_docs: int

    @classmethod
    def build(cls, token_lists: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75) -> BM25Index:
        """Index N tokenised documents with BM25 parameters k1 >= 0 and b in [0, 1]."""
        if not token_lists:
            raise ValueError("BM25Index.build: no documents")
        if not (math.isfinite(k1) and k1 >= 0 and 0 <= b <= 1):
            raise ValueError(f"BM25Index.build: need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        if not any(token_lists):
            return cls(None, len(token_lists))
        # Imported here, not with this module: importing bm25s runs a jax computation (bm25s/selection.py, a top_k
        # on the default device), which starts jax's backend in whatever process imports it: before
        # jax.distributed.initialize on a multi-host run, or in a process that forks workers afterwards.
        import bm25s

        engine = bm25s.BM25(method="lucene", k1=k1, b=b, dtype="float64")
        engine.index([list(tokens) for tokens in token_lists], show_progress=False)
        return cls(engine, len(token_lists))

    def scores(self, query_tokens: Sequence[str]) -> np.ndarray:
        """BM25 score [N] of every document for a tokenised query (repeated terms count once)."""
        terms = sorted({t for t in query_tokens if self.engine is not None and t in self.engine.vocab_dict})
        if not terms:
            return np.zeros((self.num_docs,), np.float64)
        return self.engine.get_scores(terms)


def query_text(question: str, keywords: Sequence[str]) -> str:
    """The search query: the question's keywords (QuRL §3.1), or its text when it has none."""
    return " ".join(keywords) if keywords else question


def retrieve(index: BM25Index, documents: Sequence[Document], query: str, *, top_k: int, pool: int,
             min_relevance: float) -> list[Retrieved]:
    """The `top_k` documents of the BM25 pool with the highest quality prior (module docstring)."""
    if len(documents) != index.num_docs:
        raise ValueError(f"retrieve: {len(documents)} documents for an index of {index.num_docs}")
    scores_N = index.scores(tokenize(query))
    best = scores_N.max()
    relevant = np.flatnonzero((scores_N > 0) & (scores_N >= min_relevance * best))
    by_relevance = relevant[np.lexsort((relevant, -scores_N[relevant]))][:pool]
    by_prior = sorted(by_relevance.tolist(), key=lambda i: (-documents[i].quality, -scores_N[i], i))
    return [Retrieved(documents[i], float(scores_N[i])) for i in by_prior[:top_k]]
