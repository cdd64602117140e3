"""QuRL step 1: retrieve reference documents for a question from a local corpus (no network).

QuRL §3.1 asks a search engine for pages about the question and keeps the ones with the highest
click-through rate, a cheap prior for "widely endorsed, probably good". Offline, that is two steps:
  relevance  BM25 over the corpus (Lucene's variant, the one `bm25s` calls "lucene"):
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
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rubric_jax import jsonl
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
    """Postings grouped by term (CSR layout): the documents holding term v are
    `doc_P[start_V1[v]:start_V1[v + 1]]`, with their length-normalised term frequencies in `weight_P`.

    P postings (distinct (term, document) pairs), V vocabulary size, N documents.
    """

    vocabulary: dict[str, int]
    start_V1: np.ndarray  # int64 [V + 1]
    doc_P: np.ndarray  # int64 [P]
    weight_P: np.ndarray  # float64 [P]: tf / (tf + k1 · (1 − b + b · |d| / avgdl))
    idf_V: np.ndarray  # float64 [V]
    num_docs: int

    @classmethod
    def build(cls, token_lists: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75) -> BM25Index:
        """Index N tokenised documents with BM25 parameters k1 >= 0 and b in [0, 1]."""
        if not token_lists:
            raise ValueError("BM25Index.build: no documents")
        if not (math.isfinite(k1) and k1 >= 0 and 0 <= b <= 1):
            raise ValueError(f"BM25Index.build: need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        counts = [Counter(tokens) for tokens in token_lists]
        vocabulary = {t: i for i, t in enumerate(sorted({t for c in counts for t in c}))}
        postings = [(vocabulary[t], d, n) for d, c in enumerate(counts) for t, n in c.items()]
        term_P = np.asarray([p[0] for p in postings], np.int64)
        doc_P = np.asarray([p[1] for p in postings], np.int64)
        tf_P = np.asarray([p[2] for p in postings], np.float64)
        order = np.lexsort((doc_P, term_P))
        term_P, doc_P, tf_P = term_P[order], doc_P[order], tf_P[order]
        length_N = np.asarray([len(tokens) for tokens in token_lists], dtype=np.float64)
        avgdl = max(float(length_N.mean()), 1e-9)
        weight_P = tf_P / (tf_P + k1 * (1.0 - b + b * length_N[doc_P] / avgdl))
        df_V = np.bincount(term_P, minlength=len(vocabulary)).astype(np.float64)
        idf_V = np.log1p((len(token_lists) - df_V + 0.5) / (df_V + 0.5))
        start_V1 = np.concatenate([[0], np.cumsum(df_V.astype(np.int64))])
        return cls(vocabulary, start_V1, doc_P, weight_P, idf_V, len(token_lists))

    def scores(self, query_tokens: Sequence[str]) -> np.ndarray:
        """BM25 score [N] of every document for a tokenised query (repeated terms count once)."""
        terms = sorted({self.vocabulary[t] for t in query_tokens if t in self.vocabulary})
        if not terms:
            return np.zeros((self.num_docs,), np.float64)
        postings = np.concatenate([np.arange(self.start_V1[v], self.start_V1[v + 1]) for v in terms])
        idf_P = np.repeat(self.idf_V[terms], np.diff(self.start_V1)[terms])
        return np.bincount(self.doc_P[postings], weights=idf_P * self.weight_P[postings], minlength=self.num_docs)


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
