"""QuRL step 4: keep the candidate rubric sets that discriminate between answers; merge criteria that recur.

Filter. Every candidate R^(k)(q) scores the same M sampled answers through RubricReward, the judge path
training uses. With r_k the rewards of the answers whose reward is usable (`reward_ok`), a set is dropped
when fewer than `min_valid_answers` are usable (the judge could not apply it), when the population
std(r_k) < `min_std`, or when max(r_k) − min(r_k) < `min_spread`: a rubric that gives every answer about
the same score gives GRPO no signal (QuRL's ablation: without the filter 59.3 -> 52.2).

Merge. The criteria of the kept sets are grouped: two criteria are the same when their ids are equal
ignoring case, or when the Jaccard similarity of the character-trigram sets of their descriptions is at
least `threshold` (`prepare.dedup.char_ngrams`: NFKC, case-folded, letters and digits only, so English and Chinese
compare alike). Groups are the connected components of that relation (single-link clustering), in
order of their first criterion; so criteria with equal ids always share a group, and the ids of R*(q)
are unique. A group's support is the number of distinct kept sets in
it. R*(q) keeps, once each, the groups whose support is at least min(`min_support`, number of kept sets),
at most `max_criteria` of them (highest support first, then first appearance). A group is represented,
unchanged, by its first member from the most discriminative set (largest std, earliest on ties), and
cites the union of its members' references.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rubric_jax.prepare.dedup import char_ngrams, jaccard
from rubric_jax.qurl.construction import Candidate
from rubric_jax.rubrics.schema import Dimension

NGRAM = 3


@dataclasses.dataclass(frozen=True)
class Discrimination:
    """How a candidate's rewards spread over the answers: usable count, population std, max − min."""

    valid: int
    std: float
    spread: float


def discrimination(rewards_M: np.ndarray) -> Discrimination:
    """Statistics of the usable rewards (NaN = not usable) of one candidate over M answers."""
    usable = rewards_M[~np.isnan(rewards_M)]
    if usable.size == 0:
        return Discrimination(0, float("nan"), float("nan"))
    return Discrimination(int(usable.size), float(usable.std()), float(usable.max() - usable.min()))


def filter_reason(d: Discrimination, *, min_valid_answers: int, min_std: float, min_spread: float) -> str | None:
    """Why a candidate is dropped, or None when it discriminates (module docstring)."""
    if d.valid < min_valid_answers:
        return f"only {d.valid} answer(s) got a usable score (need {min_valid_answers})"
    if d.std < min_std:
        return f"does not discriminate: std {d.std:.4f} < min_std {min_std}"
    if d.spread < min_spread:
        return f"does not discriminate: spread {d.spread:.4f} < min_spread {min_spread}"
    return None


def same_criterion(a: Dimension, b: Dimension, threshold: float) -> bool:
    """Equal ids (ignoring case) or description trigram Jaccard >= threshold."""
    if a.id.casefold() == b.id.casefold():
        return True
    return jaccard(char_ngrams(a.description, NGRAM), char_ngrams(b.description, NGRAM)) >= threshold


@dataclasses.dataclass(frozen=True)
class MergedCriterion:
    """One criterion of R*(q): its dimension, its members (kept-set position, dimension id) and cites."""

    dimension: Dimension
    members: tuple[tuple[int, str], ...]
    support: int
    cites: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """The kept criteria, and how many groups there were, lacked support or were cut by max_criteria."""

    criteria: tuple[MergedCriterion, ...]
    groups: int
    unsupported: int
    capped: int


def group_criteria(candidates: Sequence[Candidate], threshold: float) -> list[list[tuple[int, int]]]:
    """Connected components of `same_criterion` over every (set position, dimension index), in order."""
    items = [(k, j) for k, c in enumerate(candidates) for j in range(len(c.rubric.dimensions))]
    dims = [candidates[k].rubric.dimensions[j] for k, j in items]
    parent = list(range(len(items)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a in range(len(items)):
        for b in range(a):
            if same_criterion(dims[a], dims[b], threshold):
                ra, rb = root(a), root(b)
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, item in enumerate(items):
        groups.setdefault(root(i), []).append(item)
    return list(groups.values())


def merge_criteria(candidates: Sequence[Candidate], stds: Sequence[float], *, threshold: float, min_support: int,
                   max_criteria: int) -> MergeResult:
    """R*(q)'s criteria from the kept candidate sets and their reward stds (module docstring)."""
    if not candidates or len(candidates) != len(stds):
        raise ValueError(f"merge_criteria: {len(candidates)} candidates and {len(stds)} stds")
    groups = group_criteria(candidates, threshold)
    need = min(min_support, len(candidates))
    support = [len({k for k, _ in g}) for g in groups]
    supported = [i for i in range(len(groups)) if support[i] >= need]
    chosen = sorted(supported, key=lambda i: (-support[i], i))[:max_criteria]
    criteria = []
    for i in sorted(chosen):
        best_set = min({k for k, _ in groups[i]}, key=lambda k: (-stds[k], k))
        k, j = next((k, j) for k, j in groups[i] if k == best_set)
        dims = [(gk, candidates[gk].rubric.dimensions[gj]) for gk, gj in groups[i]]
        cites = sorted({c for gk, d in dims for c in candidates[gk].cites[d.id]})
        criteria.append(MergedCriterion(candidates[k].rubric.dimensions[j], tuple((gk, d.id) for gk, d in dims),
                                        support[i], tuple(cites)))
    return MergeResult(tuple(criteria), len(groups), len(groups) - len(supported), len(supported) - len(chosen))
