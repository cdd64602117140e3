"""The judge cascade (RubricRL §7: "用更小的模型做初筛、大模型做精评", a small judge screens, a large judge refines).

The first judge (the spec's checkpoints) scores every item, an item being one score of one response on one LLM
dimension (a slot of llm_judge). An item is uncertain, and escalated to the refining judge (`spec.cascade`), when
  failed     no sample of the first judge gave a valid verdict;
  spread     its valid samples (every sample of every first judge) spread, max - min on the [0, 1] scale, by more
             than `cascade_spread` (0: any disagreement);
  decision   its score (the first judges' combined median, [0, 1] scale, 1 = best) lies within `cascade_margin`
             of a decision: 0 on a gate dimension (a failed gate zeroes the reward, so the refiner confirms it), or
             one of `cascade_thresholds`.
The refiner's verdict replaces the first's; where the refiner has no valid verdict either, the first's stays.
These functions are pure; llm_judge.judge_rows runs both judges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.rubrics.schema import Dimension, normalize_scores

REFINE_SALT = 0xCA5CADE  # folded into the judging key for the refiner: its prompts never share a stored answer


@dataclasses.dataclass(frozen=True)
class CascadeStats:
    """What a cascade did in one judge_rows call, each field named as its metric."""

    judge_cascade_screened: int  # items the first judges scored
    judge_cascade_escalated: int  # items sent to the refining judges
    judge_cascade_escalated_frac: float  # their share (NaN when none was screened)
    judge_cascade_prompts: int  # the refining judges' prompts answered
    judge_cascade_generate_calls: int
    judge_cascade_store_hits: int
    judge_cascade_failed_scores: int  # escalated items the refining judges failed too


def normalized(dims_L: Sequence[Dimension], raw_XxL: np.ndarray) -> np.ndarray:
    """Raw scores [..., L] (slot l on dimension dims_L[l]'s scale, NaN = missing) on the [0, 1] scale, 1 = best."""
    raw = np.asarray(raw_XxL, dtype=np.float64)
    rows = int(np.prod(raw.shape[:-1]))  # not -1: a process without LLM items has L = 0
    return normalize_scores(dims_L, raw.reshape(rows, raw.shape[-1])).reshape(raw.shape)


def uncertain(spec: JudgeSpec, dims_L: Sequence[Dimension], samples_KxL: np.ndarray, combined_L: np.ndarray
              ) -> np.ndarray:
    """[L] True where the first judge is uncertain (module docstring): `samples_KxL` are its raw sample scores
    (K = judges x samples, NaN = invalid), `combined_L` its raw combined score per slot."""
    samples = normalized(dims_L, samples_KxL)
    score_L = normalized(dims_L, combined_L[None])[0]
    valid_KxL = ~np.isnan(samples)
    failed_L = ~valid_KxL.any(axis=0) | np.isnan(score_L)
    spread_L = (np.where(valid_KxL, samples, -np.inf).max(axis=0) - np.where(valid_KxL, samples, np.inf).min(axis=0))
    spread_L = np.where(failed_L, 0.0, spread_L)
    gate_L = np.asarray([d.gate for d in dims_L], dtype=bool)
    with np.errstate(invalid="ignore"):  # NaN scores compare False; they escalate as failed
        near_L = gate_L & (score_L <= spec.cascade_margin)
        for threshold in spec.cascade_thresholds:
            near_L |= np.abs(score_L - threshold) <= spec.cascade_margin
    return failed_L | (spread_L > spec.cascade_spread) | near_L


def refine_key(key: jax.Array) -> jax.Array:
    """The refiner's judging key: another than the first judge's, so that a refiner with the same weights, prompt
    and sample index as the first (e.g. the same judge with more samples) never reads the first's stored answer."""
    return jax.random.fold_in(key, REFINE_SALT)
