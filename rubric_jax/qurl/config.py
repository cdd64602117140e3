"""Settings of a QuRL rubric build (`config.qurl`: each one's meaning, source and bounds on its field), validated
before anything runs."""

from __future__ import annotations

import dataclasses

from rubric_jax import counts, schema
from rubric_jax.rubrics.schema import MAX_RECOMMENDED_DIMENSIONS
from rubric_jax.sampler_names import parse_sampler
from rubric_jax.schema import setting


GENERATORS = ("model", "judge")  # construction text from config.model in process | the judge's endpoint


class BuildError(ValueError):
    """A build that cannot start or resume as asked (bad setting, output over an input, changed settings)."""


@dataclasses.dataclass(frozen=True)
class BuildConfig(schema.Block):
    """experiments.build_rubrics: QuRL case-wise rubric construction (rubric_jax/qurl), the `config.qurl` block of an
    experiment config (configs/common.py `qurl_block()` is generated from it), plus the experiment's seed. The
    construction LLM is `model` (QuRL distils with Qwen2.5-7B); the judge that scores candidates is `judge` (empty:
    `model`)."""

    top_k: int = setting(5, "Documents kept per question after the quality re-rank (QuRL §3.1); 0 = from the "
                         "question alone.", bounds=(0, 100))
    retrieval_pool: int = setting(20, "BM25 candidates re-ranked by the quality prior (click-through in QuRL §3.1).",
                                  bounds=(0, 10**4))
    min_relevance: float = setting(0.5, "Pool floor: BM25 score >= this fraction of the best (a prior never promotes "
                                   "noise).", bounds=(0.0, 1.0))
    bm25_k1: float = setting(1.5, "BM25 term-frequency saturation (Lucene default 1.2; 1.5 as in bm25s).",
                             bounds=(0.0, 100.0))
    bm25_b: float = setting(0.75, "BM25 length normalisation (Robertson & Zaragoza).", bounds=(0.0, 1.0))
    max_document_chars: int = setting(8000, "Document text read for its meta-description (QuRL: pages exceed 100k "
                                      "tokens).", bounds=(1, 10**7))
    meta_max_words: int = setting(150, "Length asked of a meta-description (QuRL §3.2: short, information-dense).",
                                  bounds=(1, 10**4))
    meta_max_new_tokens: int = setting(384, "Token budget of a meta-description; cut off = invalid, retried.",
                                       bounds=(1, counts.TOKENS))
    num_candidates: int = setting(4, "K candidate rubric sets per question (QuRL §3.3 filter).", bounds=(1, 64))
    min_criteria: int = setting(3, "Fewest criteria a candidate may have.", bounds=(1, 1000))
    max_criteria: int = setting(7, "Most criteria of a candidate and of R*(q) (RubricRL §2.3: at most ~7).",
                                bounds=(1, 1000))
    max_points: int = setting(5, "Most points of one criterion (QuRL example: \"clarity and logical flow (2 "
                              "points)\").", bounds=(1, 100))
    rubric_max_new_tokens: int = setting(2048, "Token budget of one candidate rubric (JSON).",
                                         bounds=(1, counts.TOKENS))
    num_answers: int = setting(4, "Sampled answers each candidate scores in the filter.", bounds=(2, 64))
    answer_max_new_tokens: int = setting(1024, "Token budget of one sampled answer.", bounds=(1, counts.TOKENS))
    max_retries: int = setting(2, "Re-prompt rounds for invalid meta-descriptions and candidates.", bounds=(0, 10))
    min_valid_answers: int = setting(3, "A candidate needs this many usable judge scores to be judged at all.",
                                     bounds=(2, 64))
    min_std: float = setting(0.05, "Drop a candidate whose reward std over the answers is below this (QuRL §3.3 "
                             "filter).", bounds=(0.0, 0.5))
    min_spread: float = setting(0.1, "Drop a candidate whose reward max - min over the answers is below this.",
                                bounds=(0.0, 1.0))
    merge_threshold: float = setting(0.5, "Two criteria are one when description trigram Jaccard >= this (or ids "
                                     "are equal).", bounds=(0.0, 1.0))
    min_support: int = setting(2, "R*(q) keeps criteria recurring in this many kept sets (capped at the kept "
                               "count).", bounds=(1, 64))
    questions_per_batch: int = setting(32, "Questions per batch: one generate call per round each; resume unit.",
                                       bounds=(1, 1 << 16))
    sampler: str = setting("temperature(0.7)", "Sampler of every construction call (retries need fresh samples).")
    generator: str = setting("model", "Who writes meta-descriptions, rubrics and answers: model (config.model, in "
                             "process) | judge (config.judge's OpenAI-compatible endpoint, backend=openai).",
                             choices=GENERATORS)
    seed: int = 0  # config.seed, not a qurl key: all keys derive from it (and the batch, step and round)

    def validate(self) -> None:
        """The rules between the settings, the seed's bounds and the sampler's grammar."""
        why = counts.problem(self.seed, 0, counts.SEED)
        if why is not None:
            self.fail("seed", why)
        if self.retrieval_pool < self.top_k:
            self.fail("retrieval_pool", f"expected at least top_k={self.top_k}")
        if not self.min_criteria <= self.max_criteria <= MAX_RECOMMENDED_DIMENSIONS:
            self.fail("max_criteria", f"expected from min_criteria={self.min_criteria} to {MAX_RECOMMENDED_DIMENSIONS} "
                                      "(RubricRL §2.3: more dimensions hurt judge consistency)")
        if self.min_valid_answers > self.num_answers:
            self.fail("min_valid_answers", f"expected at most num_answers={self.num_answers}")
        try:
            parse_sampler(self.sampler)
        except ValueError as e:
            self.fail("sampler", str(e))
