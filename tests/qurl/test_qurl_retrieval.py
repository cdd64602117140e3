"""QuRL retrieval: BM25 (bm25s) against hand-computed values and the formula, EN/ZH tokens, prior re-ranking,
corpus errors."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.data import load_questions
from rubric_jax.qurl import retrieval as R

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "rubric_jax" / "assets" / "qurl"


def test_bm25_matches_hand_computed_scores():
    # N = 3 documents, lengths 3, 2, 1 -> avgdl 2; k1 = 1.5, b = 0.75.
    index = R.BM25Index.build([["a", "b", "a"], ["b", "c"], ["d"]], k1=1.5, b=0.75)
    idf_a = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))  # n(a) = 1: ln(8/3)
    idf_b = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # n(b) = 2: ln(1.6)
    norm_d0, norm_d1 = 1.5 * (0.25 + 0.75 * 3 / 2), 1.5 * (0.25 + 0.75 * 2 / 2)  # k1 (1 - b + b |d| / avgdl)
    expected = [idf_a * 2 / (2 + norm_d0) + idf_b * 1 / (1 + norm_d0), idf_b * 1 / (1 + norm_d1), 0.0]
    np.testing.assert_allclose(index.scores(["a", "b"]), expected, rtol=1e-12)
    np.testing.assert_allclose(expected, [0.6363404, 0.1880015, 0.0], atol=1e-7)  # the numbers written out
    np.testing.assert_array_equal(index.scores(["a", "a", "b"]), index.scores(["b", "a"]))  # a term counts once
    np.testing.assert_array_equal(index.scores(["zzz"]), [0.0, 0.0, 0.0])


def _lucene_bm25(tokens, query_tokens, k1, b):
    """The module docstring's formula, term by term in float64: each distinct query term once."""
    avgdl = sum(map(len, tokens)) / len(tokens)
    scores = np.zeros(len(tokens))
    for term in sorted(set(query_tokens)):
        df = sum(term in doc for doc in tokens)
        for d, doc in enumerate(tokens):
            if df and doc.count(term):
                tf = doc.count(term)
                idf = math.log(1 + (len(tokens) - df + 0.5) / (df + 0.5))
                scores[d] += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
    return scores


def test_bm25_equals_the_lucene_formula_in_float64_on_the_shipped_corpus():
    """bm25s (float32 by default) is asked for float64 and given each distinct query term once."""
    documents = R.load_corpus(ASSETS / "corpus.jsonl")
    tokens = [R.tokenize(f"{d.title}\n{d.text}") for d in documents]
    index = R.BM25Index.build(tokens, k1=1.2, b=0.6)
    for q in load_questions(ASSETS / "questions.jsonl"):
        for query in (q.question, " ".join(q.keywords), f"{q.question} {q.question}"):
            np.testing.assert_allclose(index.scores(R.tokenize(query)),
                                       _lucene_bm25(tokens, R.tokenize(query), 1.2, 0.6), rtol=1e-13, atol=0)
    no_words = R.BM25Index.build([["a"], []]), R.BM25Index.build([[], []])  # a document of stop words only
    np.testing.assert_array_equal(no_words[1].scores(["a"]), [0.0, 0.0])
    assert no_words[0].scores(["a"])[0] > 0 == no_words[0].scores(["a"])[1]


def test_tokenize_english_and_chinese():
    assert R.tokenize("The Runners' injuries, and 2 trees!") == ["runner", "injury", "2", "trees"]
    assert R.tokenize("如何培养孩子的阅读习惯？书") == ["如何", "何培", "培养", "养孩", "孩子", "子的", "的阅", "阅读",
                                                  "读习", "习惯", "书"]
    assert R.tokenize("ＡＢＣ 阅读app") == ["abc", "阅读", "app"]  # NFKC folds full-width letters
    assert [R.s_stem(w) for w in ("cities", "shoes", "boss", "bus", "runs", "aries", "is")] == [
        "city", "shoes", "boss", "bus", "run", "ary", "is"]  # Lucene's EnglishMinimalStemmer


def _corpus(*rows):
    return [R.Document(doc_id, "t", text, quality) for doc_id, text, quality in rows]


def test_pool_by_relevance_then_order_by_quality_prior():
    documents = _corpus(("weak", "tree", 0.9), ("strong", "tree tree shade city", 0.1),
                        ("middle", "tree shade", 0.5), ("popular_offtopic", "bread flour", 0.99))
    index = R.BM25Index.build([R.tokenize(d.text) for d in documents])
    scores = index.scores(R.tokenize("tree shade city"))
    assert scores[1] > scores[2] > scores[0] > 0 == scores[3]
    found = R.retrieve(index, documents, "tree shade city", top_k=2, pool=3, min_relevance=0.0)
    assert [r.document.doc_id for r in found] == ["weak", "middle"]  # the pool of 3, by prior: 0.9, 0.5, 0.1
    found = R.retrieve(index, documents, "tree shade city", top_k=3, pool=2, min_relevance=0.0)
    assert [r.document.doc_id for r in found] == ["middle", "strong"]  # the pool of the 2 most relevant
    floor = scores[0] / scores[1] + 1e-6  # just above 'weak': the floor keeps it out of the pool
    found = R.retrieve(index, documents, "tree shade city", top_k=3, pool=4, min_relevance=floor)
    assert [r.document.doc_id for r in found] == ["middle", "strong"]
    assert [r.bm25 for r in found] == [scores[2], scores[1]]
    assert R.retrieve(index, documents, "bicycle", top_k=3, pool=4, min_relevance=0.0) == []


def test_query_is_the_keywords_or_else_the_question():
    assert R.query_text("Why plant trees?", ("trees", "cost")) == "trees cost"
    assert R.query_text("Why plant trees?", ()) == "Why plant trees?"


@pytest.mark.parametrize("line, message", [
    ('{"doc_id": "x", "title": "t", "text": "body"', "not valid JSON"),
    ('{"doc_id": "x", "title": "t", "text": "body"}', "field 'quality' must be a finite number"),
    ('{"doc_id": "x", "title": "t", "text": "body", "quality": NaN}', "field 'quality' must be a finite number"),
    ('{"doc_id": "x", "title": "", "text": "body", "quality": 1}', "field 'title' must be a non-empty string"),
    ('{"doc_id": "x", "text": "body", "quality": 1}', "missing field 'title'"),
    ('{"doc_id": "x", "title": "t", "text": "b", "quality": 1, "clicks": 3}', "unknown field(s) ['clicks']"),
    ('{"doc_id": "a", "title": "t", "text": "b", "quality": 1}', "duplicate doc_id 'a' (first on line 1)"),
])
def test_corpus_errors_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"doc_id": "a", "title": "t", "text": "b", "quality": 0.5}) + "\n\n" + line + "\n")
    with pytest.raises(R.CorpusError) as e:
        R.load_corpus(path)
    assert str(e.value).startswith(f"{path}:3: ") and message in str(e.value)


def test_missing_or_empty_corpus(tmp_path):
    with pytest.raises(R.CorpusError, match="corpus file does not exist"):
        R.load_corpus(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(R.CorpusError, match="no documents"):
        R.load_corpus(tmp_path / "empty.jsonl")


def test_importing_the_qurl_pipeline_starts_no_jax_backend():
    """Importing bm25s runs a jax computation (its selection module), which starts jax's backend in the importing
    process: before jax.distributed.initialize on a multi-host run, or before the command servers of the tests
    fork their children (whose first compile then hung). The pipeline imports it only when it builds an index."""
    code = ("import rubric_jax.qurl.pipeline, sys\nfrom jax._src import xla_bridge\n"
            "sys.exit(f'backend started at import: {list(xla_bridge._backends)}' if xla_bridge._backends else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
