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
    """`text.fold` (NFKC, lookalikes made ASCII, case-folded), letters and digits only: what two copies of one
    question still share."""
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
