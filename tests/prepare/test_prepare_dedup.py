"""Dedup: n-gram values vs string n-grams, MinHash vs exact Jaccard, LSH recall, keep-first removal, the
exact cross-split search vs brute force."""

import itertools

import numpy as np
import pytest

from rubric_jax.prepare import dedup

PAIRS = [  # (a, b): English, Chinese and mixed, from identical to unrelated
    ("How do I get a refund for my order?", "How do I get a refund for my orders?"),
    ("How do I get a refund for my order?", "how do i get a refund for my order ?!"),
    ("What can I do about a headache?", "What can I do about my headache?"),
    ("What can I do about a headache?", "How do I get a refund for my order?"),
    ("怎么申请退款？快递一直没到。", "怎么申请退款？快递到现在还没到。"),
    ("怎么申请退款？", "退款多久到账？"),
    ("晒伤了怎么处理？", "How do I treat a sunburn?"),
    ("My knee hurts after running downhill. Should I rest it or keep running?",
     "My knee hurts after running uphill. Should I rest it or keep training?"),
    ("The quick brown fox jumps over the lazy dog near the river bank.",
     "The quick brown fox leaps over the lazy dog near the old river bank."),
    ("Summarize the following article about climate policy in Europe.",
     "Summarize the following article about energy policy in Asia."),
]


def _exact(a: str, b: str, n: int = 3) -> float:
    return dedup.jaccard(dedup.char_ngrams(a, n), dedup.char_ngrams(b, n))


def test_normalize_and_jaccard():
    assert dedup.normalize_text("Ｈow  do I?") == dedup.normalize_text("how do i") == "howdoi"
    assert dedup.normalize_text("怎么申请退款？") == "怎么申请退款"
    assert dedup.normalize_text("café_①②") == dedup.normalize_text("cafe\u0336_12") == "cafe12"  # marks fold away
    a, b = dedup.char_ngrams("abcd", 2), dedup.char_ngrams("abce", 2)  # {ab,bc,cd} vs {ab,bc,ce}
    assert dedup.jaccard(a, b) == pytest.approx(2 / 4)
    assert dedup.char_ngrams("ab", 3) == frozenset({"ab"})


def test_a_homoglyph_copy_is_a_duplicate():
    """Issue 24, S5: a copy with a Cyrillic о (or zero-width spaces) is the same question, within a split and across
    splits (a golden or eval question cannot leak into training this way)."""
    original = "How do I get a refund for my order?"
    copies = ["Hоw dо I get a refund fоr my оrder?", "How do I get a re\u200bfund for my order?"]
    assert {dedup.normalize_text(c) for c in copies} == {dedup.normalize_text(original)}
    kept, pairs = dedup.find_duplicates([original, *copies])
    assert kept == [0] and [(p.removed, p.kind) for p in pairs] == [(1, "exact"), (2, "exact")]
    assert [(q, c) for q, c, _ in dedup.cross_duplicates(copies, [original], 0.7)] == [(0, 0), (1, 0)]
    assert dedup.normalize_text("首先申请退款") == "首先申请退款"


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shingle_values_are_the_ngram_sets(n):
    for a, b in PAIRS:
        va, vb = dedup.shingle_values(a, n), dedup.shingle_values(b, n)
        assert len(va) == len(dedup.char_ngrams(a, n))
        assert dedup.values_jaccard(va, vb) == pytest.approx(_exact(a, b, n), abs=1e-12)


def test_minhash_estimates_the_exact_jaccard():
    hasher = dedup.MinHasher(256, seed=3)
    for a, b in PAIRS:
        exact = _exact(a, b)
        estimate = dedup.estimated_jaccard(hasher.signature(dedup.shingle_values(a, 3)),
                                           hasher.signature(dedup.shingle_values(b, 3)))
        sigma = np.sqrt(exact * (1 - exact) / 256)
        assert abs(estimate - exact) <= 4 * sigma + 1e-9, (a, b, exact, estimate)


def test_minhash_is_unbiased_over_seeds():
    a, b = PAIRS[0]  # |A| = 24, |B| = 25, A ⊂ B: Jaccard 24/25
    va, vb = dedup.shingle_values(a, 3), dedup.shingle_values(b, 3)
    assert _exact(a, b) == pytest.approx(0.96)
    estimates = [dedup.estimated_jaccard(h.signature(va), h.signature(vb))
                 for h in (dedup.MinHasher(128, seed) for seed in range(40))]
    # 40 x 128 draws: the mean's standard error is sqrt(0.96 * 0.04 / 5120) = 0.0027.
    assert np.mean(estimates) == pytest.approx(0.96, abs=0.012)
    # Structured values (consecutive integers) too: a weak hash family (e.g. (a·x + b) mod p with small a)
    # orders them nearly monotonically and overestimates or underestimates. Jaccard 500 / 1500.
    x, y = np.arange(1000, dtype=np.uint64), np.arange(500, 1500, dtype=np.uint64)
    estimates = [dedup.estimated_jaccard(h.signature(x), h.signature(y))
                 for h in (dedup.MinHasher(128, seed) for seed in range(40))]
    assert np.mean(estimates) == pytest.approx(1 / 3, abs=0.025)  # standard error 0.0066


def test_signatures_are_deterministic_given_the_seed():
    values = dedup.shingle_values(PAIRS[3][0], 3)
    assert np.array_equal(dedup.MinHasher(64, 7).signature(values), dedup.MinHasher(64, 7).signature(values))
    assert not np.array_equal(dedup.MinHasher(64, 7).signature(values), dedup.MinHasher(64, 8).signature(values))
    chunked = dedup.MinHasher(64, 7).signature(values, chunk=5)
    assert np.array_equal(chunked, dedup.MinHasher(64, 7).signature(values))


@pytest.mark.parametrize("num_perm, threshold", [(128, 0.7), (128, 0.9), (64, 0.5), (256, 0.8)])
def test_lsh_bands_reach_the_recall_at_the_threshold(num_perm, threshold):
    bands, rows = dedup.lsh_bands(num_perm, threshold)
    assert bands * rows <= num_perm
    assert 1 - (1 - threshold**rows) ** bands >= 0.99
    # The cheapest such setting: one more row per band (fewer extra candidates) would miss the recall.
    bands_for_more_rows = num_perm // (rows + 1)
    assert 1 - (1 - threshold ** (rows + 1)) ** bands_for_more_rows < 0.99


def test_lsh_bands_take_the_best_recall_when_none_reaches_it():
    assert dedup.lsh_bands(1, 0.5) == (1, 1)
    assert dedup.lsh_bands(4, 0.3) == (4, 1)  # 1 - 0.7^4 = 0.76: every hash its own band


def test_find_duplicates_keeps_the_first_of_each_group():
    texts = [
        "How do I get a refund for my order?",
        "how do i get a refund for my order ?!",  # exact after normalisation
        "How do I get a refund for my orders?",  # near duplicate
        "What can I do about a headache?",
        "怎么申请退款？",
        "怎么申请退款?",  # full-width vs ASCII question mark
        "退款多久到账？",
    ]
    kept, pairs = dedup.find_duplicates(texts)
    assert kept == [0, 3, 4, 6]
    assert [(p.kept, p.removed, p.kind) for p in pairs] == [(0, 1, "exact"), (0, 2, "near"), (4, 5, "exact")]
    near = pairs[1]
    assert near.jaccard == pytest.approx(0.96) and 0.0 < near.jaccard_estimate <= 1.0
    assert dedup.find_duplicates(texts, threshold=1.0)[0] == [0, 2, 3, 4, 6]
    with pytest.raises(dedup.DedupError, match="threshold"):
        dedup.find_duplicates(texts, threshold=0.0)


def _greedy_exact(texts, threshold):
    """Reference: keep a text unless an earlier kept one has exact n-gram Jaccard >= threshold."""
    kept = []
    for i, t in enumerate(texts):
        if all(_exact(texts[k], t) < threshold for k in kept):
            kept.append(i)
    return kept


def _corpus(seed: int, size: int) -> list[str]:
    """Distinct sentences plus lightly edited copies (one word changed) of some of them."""
    rng = np.random.default_rng(seed)
    words = ("refund order parcel courier invoice account password headache fever allergy knee sleep water "
             "coffee diet running weekend morning doctor pharmacy delivery address discount coupon").split()
    base = [" ".join(rng.choice(words, 14)) for _ in range(size)]
    copies = []
    for k in rng.choice(size, size // 3, replace=False):
        tokens = base[k].split()
        tokens[int(rng.integers(len(tokens)))] = str(rng.choice(words))
        copies.append(" ".join(tokens))
    texts = base + copies
    return [texts[i] for i in rng.permutation(len(texts))]


def test_find_duplicates_matches_the_exact_greedy_reference():
    texts = _corpus(seed=0, size=60)
    kept, pairs = dedup.find_duplicates(texts, threshold=0.6, num_perm=128, seed=1)
    assert kept == _greedy_exact(texts, 0.6)
    assert len(pairs) >= 10  # the edited copies were found
    for p in pairs:
        assert p.jaccard == pytest.approx(_exact(texts[p.kept], texts[p.removed])) and p.jaccard >= 0.6


def test_cross_duplicates_is_exact():
    texts = _corpus(seed=1, size=40)
    queries, corpus = texts[:15], texts[15:]
    for threshold in (0.3, 0.6, 0.9):
        brute = sorted((q, c, _exact(a, b)) for (q, a), (c, b) in itertools.product(enumerate(queries),
                                                                                   enumerate(corpus))
                       if _exact(a, b) >= threshold)
        found = sorted(dedup.cross_duplicates(queries, corpus, threshold))
        assert [(q, c) for q, c, _ in found] == [(q, c) for q, c, _ in brute]
        assert [j for *_, j in found] == pytest.approx([j for *_, j in brute])
    assert dedup.cross_duplicates([], corpus, 0.5) == []
