"""Settings of a QuRL rubric build, validated before anything runs (`config.qurl` in configs/common.py gives
each one's meaning and source)."""

from __future__ import annotations

import dataclasses

from rubric_jax import counts, sampling
from rubric_jax.rubrics.schema import MAX_RECOMMENDED_DIMENSIONS


GENERATORS = ("model", "judge")  # construction text from config.model in process | the judge's endpoint


class BuildError(ValueError):
    """A build that cannot start or resume as asked (bad setting, output over an input, changed settings)."""


# config.qurl's counts: (smallest, largest) allowed (rubric_jax/counts.py).
COUNT_BOUNDS = {
    "top_k": (0, 100), "retrieval_pool": (0, 10**4), "max_document_chars": (1, 10**7), "meta_max_words": (1, 10**4),
    "meta_max_new_tokens": (1, counts.TOKENS), "num_candidates": (1, 64), "min_criteria": (1, 1000),
    "max_criteria": (1, 1000), "max_points": (1, 100), "rubric_max_new_tokens": (1, counts.TOKENS),
    "num_answers": (2, 64), "answer_max_new_tokens": (1, counts.TOKENS), "max_retries": (0, 10),
    "min_valid_answers": (2, 64), "min_support": (1, 64), "questions_per_batch": (1, 1 << 16), "seed": (0, counts.SEED),
}


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Settings of a build: the `config.qurl` block of an experiment config, plus its seed."""

    top_k: int = 5  # documents per question after the quality re-rank (QuRL §3.1); 0 = from the question alone
    retrieval_pool: int = 20  # BM25 candidates that the quality prior re-ranks
    min_relevance: float = 0.5  # pool floor: BM25 score >= this fraction of the best score
    bm25_k1: float = 1.5  # BM25 term-frequency saturation
    bm25_b: float = 0.75  # BM25 length normalisation
    max_document_chars: int = 8000  # document text read for its meta-description
    meta_max_words: int = 150  # length asked of a meta-description (QuRL §3.2: short, dense)
    meta_max_new_tokens: int = 384  # its token budget; cut off = invalid
    num_candidates: int = 4  # K candidate rubric sets per question (QuRL §3.3)
    min_criteria: int = 3  # fewest criteria in a candidate
    max_criteria: int = 7  # most criteria in a candidate and in R*(q) (RubricRL §2.3)
    max_points: int = 5  # most points of one criterion
    rubric_max_new_tokens: int = 2048  # token budget of one candidate (JSON)
    num_answers: int = 4  # sampled answers every candidate scores in the filter
    answer_max_new_tokens: int = 1024  # token budget of one answer
    max_retries: int = 2  # re-prompt rounds for invalid meta-descriptions and candidates
    min_valid_answers: int = 3  # usable judge scores a candidate needs to be judged at all
    min_std: float = 0.05  # filter: drop a candidate whose reward std over the answers is lower
    min_spread: float = 0.1  # filter: drop a candidate whose reward max - min is lower
    merge_threshold: float = 0.5  # two criteria are one at description trigram Jaccard >= this (or equal ids)
    min_support: int = 2  # R*(q) keeps criteria found in this many kept sets (capped at their number)
    questions_per_batch: int = 32  # questions per batch: one generate call per round, the resume unit
    sampler: str = "temperature(0.7)"  # every construction call's sampler (retries need fresh samples)
    generator: str = "model"  # who writes: model (config.model, in process) | judge (config.judge's endpoint)
    seed: int = 0  # all keys derive from it (and the batch, step and round)

    def __post_init__(self) -> None:
        for name, (smallest, largest) in COUNT_BOUNDS.items():
            why = counts.problem(getattr(self, name), smallest, largest)
            if why is not None:
                self._fail(name, why.removeprefix("expected "))
        unit = {"min_relevance": (0.0, 1.0), "bm25_b": (0.0, 1.0), "merge_threshold": (0.0, 1.0),
                "min_std": (0.0, 0.5), "min_spread": (0.0, 1.0), "bm25_k1": (0.0, 100.0)}
        for name, (low, high) in unit.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                self._fail(name, f"a number in [{low}, {high}]")
        if self.retrieval_pool < self.top_k:
            self._fail("retrieval_pool", f"at least top_k={self.top_k}")
        if not self.min_criteria <= self.max_criteria <= MAX_RECOMMENDED_DIMENSIONS:
            self._fail("max_criteria", f"from min_criteria={self.min_criteria} to {MAX_RECOMMENDED_DIMENSIONS} "
                                       "(RubricRL §2.3: more dimensions hurt judge consistency)")
        if self.min_valid_answers > self.num_answers:
            self._fail("min_valid_answers", f"at most num_answers={self.num_answers}")
        if self.generator not in GENERATORS:
            self._fail("generator", f"one of {GENERATORS}")
        try:
            sampling.parse_sampler(self.sampler)
        except ValueError as e:
            raise BuildError(f"qurl.sampler={self.sampler!r}: {e}") from None

    def _fail(self, name: str, expected: str) -> None:
        raise BuildError(f"qurl.{name}={getattr(self, name)!r}: expected {expected}")
