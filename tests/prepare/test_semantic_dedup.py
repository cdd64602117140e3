"""Semantic deduplication (issue 23 §6): the content-word signal catches the password paraphrase the character
3-gram dedup misses and keeps the near-topic question apart; its precision and recall on the labelled pairs
(tests/fixtures/dedup/paraphrase_pairs.jsonl, 48 pairs EN and ZH) are what docs/data.md reports; the embedding path
marks pairs by cosine, pools only real tokens, and the shipped tiny judge does not separate paraphrases;
prepare_data removes the paraphrase and reports it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.prepare import dedup
from rubric_jax.prepare.pipeline import PrepareConfig, prepare

REPO = Path(__file__).resolve().parents[2]
PAIRS = [json.loads(line) for line in (REPO / "tests/fixtures/dedup/paraphrase_pairs.jsonl").read_text().splitlines()]
PASSWORD = ("How do I reset my password?", "How can I reset my password?")


def _auc(scores: np.ndarray, paraphrase: np.ndarray) -> float:
    """P(a paraphrase pair scores above a non-paraphrase pair), ties half."""
    pos, neg = scores[paraphrase][:, None], scores[~paraphrase][None, :]
    return float(np.mean((pos > neg) + 0.5 * (pos == neg)))


def test_the_password_paraphrase_is_caught_and_the_router_question_kept():
    assert dedup.jaccard(dedup.char_ngrams(PASSWORD[0], 3), dedup.char_ngrams(PASSWORD[1], 3)) < 0.7  # lexical misses
    texts = [PASSWORD[0], "How do I reset my router?", PASSWORD[1], "如何重置我的密码？", "怎么重置我的密码？"]
    kept, pairs = dedup.semantic_duplicates(texts, 0.7)
    assert kept == [0, 1, 3]
    assert [(p.kept, p.removed, p.signal, p.word_jaccard) for p in pairs] == [(0, 2, "words", 1.0),
                                                                               (3, 4, "words", 1.0)]
    assert dedup.content_words(PASSWORD[1]) == {"reset", "password"}
    assert dedup.content_words("如何重置我的密码？") == {"重置", "密码"}
    assert dedup.semantic_duplicates(texts, 0.0)[0] == [0, 1, 2, 3, 4]  # 0 = off


def test_precision_and_recall_on_the_labelled_pairs_are_the_documented_ones():
    assert len(PAIRS) >= 40 and {p["lang"] for p in PAIRS} == {"en", "zh"}
    paraphrase = np.array([p["paraphrase"] for p in PAIRS])
    assert paraphrase.sum() == 24
    words = np.array([dedup.jaccard(dedup.content_words(p["a"]), dedup.content_words(p["b"])) for p in PAIRS])
    chars = np.array([dedup.jaccard(dedup.char_ngrams(p["a"], 3), dedup.char_ngrams(p["b"], 3)) for p in PAIRS])
    assert dedup.precision_recall(words, paraphrase, 0.7) == {
        "threshold": 0.7, "precision": 1.0, "recall": 0.25, "true_positives": 6, "false_positives": 0, "pairs": 48}
    lexical = dedup.precision_recall(chars, paraphrase, 0.7)
    assert (lexical["true_positives"], lexical["false_positives"]) == (0, 2)  # near-topic questions share characters
    assert _auc(words, paraphrase) == pytest.approx(0.734, abs=1e-3) and _auc(chars, paraphrase) < 0.5


def test_embeddings_mark_pairs_by_cosine_when_words_do_not():
    texts = ["Shipping time?", "Delivery duration?", "Refund policy?"]
    e = np.array([[1.0, 0.0], [0.96, 0.28], [0.0, 1.0]])  # unit rows: cos(0, 1) = 0.96
    kept, [pair] = dedup.semantic_duplicates(texts, 0.7, e, embedding_threshold=0.95)
    assert kept == [0, 2] and (pair.kept, pair.removed, pair.signal) == (0, 1, "embedding")
    assert pair.cosine == pytest.approx(0.96) and pair.word_jaccard == 0.0
    assert dedup.semantic_duplicates(texts, 0.7, e, embedding_threshold=0.97)[0] == [0, 1, 2]


def test_tiny_judge_embeddings_pool_real_tokens_only_and_do_not_separate_paraphrases():
    from rubric_jax.prepare.embedding import embed, load_embedder

    embedder = load_embedder(REPO / "rubric_jax/assets/tiny_judge")
    short, long = "Refund?", "How long does a refund take to reach my credit card after I return the parcel?"
    alone = embed(embedder, [short], batch_size=2)
    batched = embed(embedder, [short, long], batch_size=2)
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-5)  # padding of the longer row changes nothing
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    a = embed(embedder, [p["a"] for p in PAIRS])
    b = embed(embedder, [p["b"] for p in PAIRS])
    paraphrase = np.array([p["paraphrase"] for p in PAIRS])
    assert _auc((a * b).sum(axis=1), paraphrase) < 0.5  # docs/data.md: 0.283; a real embedding model is needed


def test_prepare_data_removes_the_paraphrase_and_reports_it(tmp_path):
    rows = [{"id": f"q{i}", "question": q, "category": "cs", "lang": "en"} for i, q in enumerate(
        [PASSWORD[0], "How do I reset my router?", PASSWORD[1], "Where is my parcel?", "Can I pay by card?"])]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = prepare(PrepareConfig(inputs=(f"questions:{path}",), out=tmp_path / "out", name="sem",
                                   difficulty_ratio="none"), log=lambda _: None)
    semantic = report["dedup"]["semantic"]
    assert [(p["kept_id"], p["removed_id"], p["signal"]) for p in semantic["pairs"]] == [("q0", "q2", "words")]
    assert ("semantic dedup", 5, 4) in [(s["step"], s["in"], s["out"]) for s in report["steps"]]
    assert report["splits"]["train"] == 4
    assert "content-word Jaccard >= 0.7: removed 1." in (tmp_path / "out" / "sem" / "report.md").read_text()
