"""Exact and near-duplicate questions: MinHash signatures with LSH banding, checked by exact Jaccard.

Texts are compared as sets of character n-grams of their normalised form (rubric_jax/text.py's `fold`:
invisible characters removed, NFKC, Latin lookalikes such as a Cyrillic о made ASCII, case-folded; then
letters and digits only), so Chinese and English work alike and a homoglyph copy is a copy. Each n-gram becomes a 64-bit value: for n <= 3
the code points packed side by side (no collisions), then a bijective mix (splitmix64). MinHash maps
each set to the minima of `num_perm` seeded hash functions (seeds drawn from `seed`); LSH
groups signatures by bands so that only texts sharing a band are compared. A candidate pair is a
duplicate when its exact Jaccard (on the n-gram values) reaches the threshold: the estimate only
proposes pairs, so its noise cannot remove a question below the threshold. Removed pairs carry both
numbers.

`cross_duplicates` is the exact search (an inverted index over n-gram values, vectorised) used where a
miss is not allowed: no held-out question may be a near duplicate of a training one.

Why MinHash and LSH are numpy here and not datasketch 2.0.0 (measured on the 2-core CPU machine, 3,273 texts: the
questions of rubric_jax/assets plus a near copy of each, one character dropped): datasketch's MinHashLSH picks its
bands by a weighted false-positive/false-negative area, which for 128 permutations at Jaccard 0.7 is 14 bands of 9
rows, a pair at the threshold found with probability 0.44; `lsh_bands` asks for recall 0.99 there (17 bands of 4
rows: 0.991). Given our bands (`params=`), datasketch keeps and removes exactly the same texts, but in 4.6 s against
1.3 s here (it hashes every n-gram with SHA-1 in Python) and imports in 0.37 s after numpy against 20 ms; the
normalisation, the exact Jaccard check and `cross_duplicates` are not in it. What it would replace is `MinHasher`
and a dict of band buckets, about 20 lines.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from rubric_jax import text as text_forms

_PACK_BITS = 21  # every code point is < 2^21, so up to three of them pack into one 63-bit value exactly
_ROLL = np.uint64(0x100000001B3)  # FNV-64 prime, for n > 3
_NOT_LETTER_OR_DIGIT = re.compile(r"[\W_]+")  # \w is str.isalnum() (Unicode L* and N*) plus '_'


class DedupError(ValueError):
    """Invalid deduplication settings."""


def normalize_text(text: str) -> str:
    """`text.fold` (combining marks removed, NFKC, lookalikes made ASCII, case-folded), letters and digits only:
    what two copies of one question still share."""
    return _NOT_LETTER_OR_DIGIT.sub("", text_forms.fold(text))


def char_ngrams(text: str, n: int) -> frozenset[str]:
    """Character n-grams of the normalised text (the whole text when it is shorter than n)."""
    norm = normalize_text(text)
    if len(norm) <= n:
        return frozenset([norm])
    return frozenset(norm[i:i + n] for i in range(len(norm) - n + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b| (1.0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def _splitmix64(x_K: np.ndarray) -> np.ndarray:
    """A bijection of uint64 that spreads every input bit over the output (Steele et al., 2014)."""
    z_K = x_K + np.uint64(0x9E3779B97F4A7C15)
    z_K = (z_K ^ (z_K >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z_K = (z_K ^ (z_K >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z_K ^ (z_K >> np.uint64(31))


def shingle_values(text: str, n: int) -> np.ndarray:
    """Sorted distinct uint64 values of `char_ngrams(text, n)`: one value per n-gram, exact for n <= 3."""
    return _normalized_shingle_values(normalize_text(text), n)


def _normalized_shingle_values(norm: str, n: int) -> np.ndarray:
    codes = np.frombuffer(norm.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    width = max(1, min(n, len(codes)))
    count = max(1, len(codes) - width + 1)
    packed_K = np.zeros(count, dtype=np.uint64)
    factor = np.uint64(1 << _PACK_BITS) if n <= 3 else _ROLL
    for k in range(min(width, len(codes))):
        packed_K = packed_K * factor + codes[k:k + count]
    return np.unique(_splitmix64(packed_K))


def values_jaccard(a_K: np.ndarray, b_L: np.ndarray) -> float:
    """Jaccard of two sorted distinct value arrays."""
    at_K = np.minimum(np.searchsorted(b_L, a_K), len(b_L) - 1)
    inter = int(np.count_nonzero(b_L[at_K] == a_K))
    return inter / (len(a_K) + len(b_L) - inter)


class MinHasher:
    """`num_perm` seeded hash functions x -> splitmix64(x XOR s_p), one random 64-bit seed s_p each."""

    def __init__(self, num_perm: int, seed: int):
        if num_perm < 1:
            raise DedupError(f"num_perm must be >= 1, got {num_perm}")
        self.num_perm = num_perm
        self._seeds_P = np.random.default_rng(seed).integers(0, np.iinfo(np.uint64).max, num_perm, dtype=np.uint64,
                                                             endpoint=True)

    def signature(self, values_K: np.ndarray, chunk: int = 4096) -> np.ndarray:
        """uint64[num_perm]: the minimum of each hash function over the set."""
        sig_P = np.full(self.num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
        for start in range(0, len(values_K), chunk):
            h_PxC = _splitmix64(self._seeds_P[:, None] ^ values_K[None, start:start + chunk])
            sig_P = np.minimum(sig_P, h_PxC.min(axis=1))
        return sig_P


def estimated_jaccard(sig_a_P: np.ndarray, sig_b_P: np.ndarray) -> float:
    """The fraction of equal MinHash values: an unbiased estimate of the Jaccard similarity."""
    return float(np.mean(sig_a_P == sig_b_P))


def lsh_bands(num_perm: int, threshold: float, recall: float = 0.99) -> tuple[int, int]:
    """(bands, rows), bands·rows <= num_perm: a pair at the threshold shares a band with probability >= recall.

    A pair of similarity s shares a band with probability 1 − (1 − s^rows)^bands. Among the settings that
    reach `recall` at s = threshold, the one with the fewest candidates below the threshold (the smallest
    area under that curve on [0, threshold]) wins; if none reaches it, the one with the highest recall.
    """
    s_low = np.linspace(0.0, threshold, 201)
    best, best_key = (1, 1), (np.inf, np.inf)
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            at_threshold = 1.0 - (1.0 - threshold**rows) ** bands
            extra = float(np.trapezoid(1.0 - (1.0 - s_low**rows) ** bands, s_low))
            key = (0.0, extra) if at_threshold >= recall else (1.0 - at_threshold, extra)
            if key < best_key:
                best, best_key = (bands, rows), key
    return best


@dataclasses.dataclass(frozen=True)
class DuplicatePair:
    """`removed` (an index into the texts) duplicates the earlier, kept `kept`."""

    kept: int
    removed: int
    kind: str  # "exact" (same normalised text) or "near"
    jaccard: float  # on the n-gram values
    jaccard_estimate: float  # from the MinHash signatures (1.0 for exact duplicates)


def find_duplicates(texts: Sequence[str], threshold: float = 0.7, n: int = 3, num_perm: int = 128,
                    seed: int = 0) -> tuple[list[int], list[DuplicatePair]]:
    """(indices kept, pairs removed): each text is dropped when an earlier kept one duplicates it."""
    if not 0.0 < threshold <= 1.0:
        raise DedupError(f"threshold must be in (0, 1], got {threshold}")
    if n < 1:
        raise DedupError(f"n-gram size must be >= 1, got {n}")
    hasher = MinHasher(num_perm, seed)
    bands, rows = lsh_bands(num_perm, threshold)
    first_of_text: dict[str, int] = {}
    buckets: dict[tuple[int, bytes], list[int]] = {}
    values: dict[int, np.ndarray] = {}
    signatures: dict[int, np.ndarray] = {}
    kept: list[int] = []
    pairs: list[DuplicatePair] = []
    for i, text in enumerate(texts):
        norm = normalize_text(text)
        if norm in first_of_text:
            pairs.append(DuplicatePair(first_of_text[norm], i, "exact", 1.0, 1.0))
            continue
        values_K = _normalized_shingle_values(norm, n)
        sig_P = hasher.signature(values_K)
        keys = [(band, sig_P[band * rows:(band + 1) * rows].tobytes()) for band in range(bands)]
        candidates = sorted({k for key in keys for k in buckets.get(key, ())})
        scored = [(values_jaccard(values[k], values_K), -k) for k in candidates]
        best = max(scored, default=(0.0, 0))
        if best[0] >= threshold:
            k = -best[1]
            pairs.append(DuplicatePair(k, i, "near", best[0], estimated_jaccard(signatures[k], sig_P)))
            continue
        first_of_text[norm] = i
        kept.append(i)
        values[i], signatures[i] = values_K, sig_P
        for key in keys:
            buckets.setdefault(key, []).append(i)
    return kept, pairs


def cross_duplicates(queries: Sequence[str], corpus: Sequence[str], threshold: float,
                     n: int = 3) -> list[tuple[int, int, float]]:
    """Every (query index, corpus index, Jaccard) with Jaccard >= threshold: exact, no pair is missed."""
    if not queries or not corpus:
        return []
    corpus_values = [shingle_values(t, n) for t in corpus]
    sizes_C = np.array([len(v) for v in corpus_values])
    flat_V = np.concatenate(corpus_values)
    owner_V = np.repeat(np.arange(len(corpus)), sizes_C)
    order_V = np.argsort(flat_V, kind="stable")
    flat_V, owner_V = flat_V[order_V], owner_V[order_V]
    hits = []
    for q, text in enumerate(queries):
        values_K = shingle_values(text, n)
        lo_K = np.searchsorted(flat_V, values_K, side="left")
        count_K = np.searchsorted(flat_V, values_K, side="right") - lo_K
        total = int(count_K.sum())
        starts_K = np.cumsum(count_K) - count_K
        positions = np.repeat(lo_K - starts_K, count_K) + np.arange(total)
        inter_C = np.bincount(owner_V[positions], minlength=len(corpus))
        jaccard_C = inter_C / (len(values_K) + sizes_C - inter_C)
        hits.extend((q, int(c), float(jaccard_C[c])) for c in np.nonzero(jaccard_C >= threshold)[0])
    return hits


# ------------------------------------------------------------------------------------------ semantic
# Near-duplicate questions that share meaning but few characters ("How do I reset my password?" / "How can I reset
# my password?": character 3-gram Jaccard 0.62, under the 0.7 threshold). Two signals, either one marks a pair:
#   words      Jaccard of the content words: folded words (rubric_jax/text.fold) minus function words
#              (EN_FUNCTION_WORDS), a plural -s stripped; Chinese text minus its function words (ZH_FUNCTION_WORDS),
#              then character bigrams of each remaining run (a one-character run counts as itself). Paraphrases that
#              swap function words keep their content words; questions that differ in one content word do not.
#   embedding  cosine of sentence embeddings (rubric_jax/prepare/embedding.py) from a model the caller loads.
# Measured on tests/fixtures/dedup/paraphrase_pairs.jsonl (24 paraphrase and 24 near-topic non-paraphrase pairs, EN
# and ZH; docs/data.md "Semantic deduplication"): words at 0.7 have precision 1.0 and recall 0.25; the shipped tiny
# models' embeddings rank non-paraphrases above paraphrases (AUC < 0.5), so no embedding model is a default.
EN_FUNCTION_WORDS = frozenset("""
a an the i me my mine we us our ours you your yours he him his she her hers it its they them their theirs this that
these those am is are was were be been being do does did doing done have has had having can could will would shall
should may might must how what when where why which who whom whose whether if then than so and or but not no nor of
to in on at by for with from about into onto over under as up down out off again there here any some all each every
both either neither too very just also only own same such get got please ok okay s t don doesn didn isn aren wasn
weren hasn haven hadn can't won wouldn shouldn couldn
""".split())
ZH_FUNCTION_WORDS = (
    "为什么", "怎么样", "怎么办", "能不能", "可不可以", "什么", "怎么", "怎样", "如何", "哪里", "哪儿", "可以", "应该", "需要",
    "一般", "通常", "我们", "你们", "他们", "时候", "的话", "还是", "或者", "已经", "现在", "一下", "这个", "那个",
    "我", "你", "他", "她", "它", "的", "了", "吗", "呢", "吧", "啊", "呀", "么", "是", "在", "有", "和", "与", "就", "都", "也",
    "很", "还", "要", "会", "能", "该", "把", "被", "给", "让", "到", "这", "那", "个", "些", "得", "着", "过", "又", "再", "才",
    "对", "从", "向", "以", "之", "其", "或", "及", "而", "且", "但", "若",
)
_ZH_FUNCTION_RE = re.compile("|".join(map(re.escape, sorted(ZH_FUNCTION_WORDS, key=len, reverse=True))))
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_WORD = re.compile(r"[^\W_]+")


def content_words(text: str) -> frozenset[str]:
    """The content words of `text` (see the comment above): what two phrasings of one question still share."""
    folded = _ZH_FUNCTION_RE.sub(" ", text_forms.fold(text))
    words: set[str] = set()
    for token in _WORD.findall(folded):
        for run in _CJK_RUN.findall(token):
            words.update(run[i:i + 2] for i in range(max(1, len(run) - 1)))
        for latin in _CJK_RUN.split(token):
            if latin and latin not in EN_FUNCTION_WORDS:
                words.add(latin[:-1] if len(latin) > 3 and latin.endswith("s") and not latin.endswith("ss") else latin)
    return frozenset(words)


@dataclasses.dataclass(frozen=True)
class SemanticPair:
    """`removed` means what the earlier, kept `kept` means: its content-word Jaccard and embedding cosine (None
    without embeddings); `signal` names what reached its threshold ("words" or "embedding")."""

    kept: int
    removed: int
    signal: str
    word_jaccard: float
    cosine: float | None


def semantic_duplicates(texts: Sequence[str], word_threshold: float, embeddings_NxD: np.ndarray | None = None,
                        embedding_threshold: float = 1.0) -> tuple[list[int], list[SemanticPair]]:
    """(indices kept, pairs removed): each text is dropped when an earlier kept one reaches `word_threshold` in
    content-word Jaccard (0 = the signal is off) or, with unit-length `embeddings_NxD`, `embedding_threshold` in
    cosine; the kept text with the highest Jaccard (then cosine) is named."""
    if not 0.0 <= word_threshold <= 1.0 or not -1.0 <= embedding_threshold <= 1.0:
        raise DedupError(f"semantic thresholds: words in [0, 1], embedding cosine in [-1, 1]; got {word_threshold}, "
                         f"{embedding_threshold}")
    if embeddings_NxD is not None and len(embeddings_NxD) != len(texts):
        raise DedupError(f"{len(embeddings_NxD)} embeddings for {len(texts)} texts")
    postings: dict[str, list[int]] = {}
    words = [content_words(t) for t in texts]
    kept: list[int] = []
    pairs: list[SemanticPair] = []
    for i, words_i in enumerate(words):
        shared: dict[int, int] = {}
        for word in words_i:
            for k in postings.get(word, ()):
                shared[k] = shared.get(k, 0) + 1
        jaccard_K = np.array([shared.get(k, 0) / max(len(words_i) + len(words[k]) - shared.get(k, 0), 1)
                              for k in kept])
        cosine_K = (embeddings_NxD[kept] @ embeddings_NxD[i] if embeddings_NxD is not None and kept
                    else np.full(len(kept), np.nan))
        by_words = word_threshold > 0 and jaccard_K.size and jaccard_K.max() >= word_threshold
        by_embedding = embeddings_NxD is not None and cosine_K.size and cosine_K.max() >= embedding_threshold
        if by_words or by_embedding:
            best = int(np.argmax(jaccard_K if by_words else cosine_K))
            cosine = None if embeddings_NxD is None else float(cosine_K[best])
            pairs.append(SemanticPair(kept[best], i, "words" if by_words else "embedding", float(jaccard_K[best]),
                                      cosine))
            continue
        kept.append(i)
        for word in words_i:
            postings.setdefault(word, []).append(i)
    return kept, pairs


def precision_recall(scores_P: np.ndarray, paraphrase_P: np.ndarray, threshold: float) -> dict[str, float | int]:
    """Precision and recall of "duplicate when score >= threshold" on labelled pairs (a threshold's report)."""
    predicted_P = np.asarray(scores_P) >= threshold
    truth_P = np.asarray(paraphrase_P, bool)
    tp, fp = int((predicted_P & truth_P).sum()), int((predicted_P & ~truth_P).sum())
    fn = int((~predicted_P & truth_P).sum())
    return {"threshold": threshold, "precision": tp / (tp + fp) if tp + fp else float("nan"),
            "recall": tp / (tp + fn) if tp + fn else float("nan"), "true_positives": tp, "false_positives": fp,
            "pairs": int(truth_P.size)}
