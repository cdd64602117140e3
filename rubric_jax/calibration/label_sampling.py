"""A labelling round's sample (RubricRL §3.2: "从模型的历史输出中随机抽取200-500条，覆盖各种质量水平。不要只抽好回答，
差回答也要有"): responses drawn from a run's samples.jsonl so that every stretch of training, every reward level and
both ends of every dimension are represented, written as a labels file with empty (null) labels that
experiments.calibrate reads once people have filled them in.

Strata. Responses are deduplicated by their text (the first, earliest one kept). Each is placed in a cell
(step bin × reward bin): the run's distinct steps cut into STEP_BINS stretches of equal count, the rewards into
REWARD_BINS quantile bins. Picks go round-robin over the cells in a seeded order, so every non-empty cell gets an
equal share while it lasts; within a cell the pick is the response whose dimension levels (at the top, below it,
or unscored, per dimension) are rarest among those already picked, ties broken by a seeded shuffle, so both ends
of each dimension get labelled even when the reward alone would not separate them. The output is shuffled, and
carries no scores: people label without seeing the judge's verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_jax.metrics import scalar_value

STEP_BINS = 3  # early, middle, late training
REWARD_BINS = 4  # reward quartiles
_TOP = 1.0 - 1e-6  # a normalised score at or above this is at the dimension's top level
_LEVELS = 3  # per dimension: below the top, at the top, unscored


@dataclasses.dataclass(frozen=True)
class Sample:
    """One logged response: its step and stage, question, response, reward and normalised scores (NaN = none)."""

    step: int
    stage: str
    question: str
    response: str
    reward: float
    scores: Mapping[str, float]


def sample_from_row(row: Mapping[str, Any], where: str) -> Sample:
    """A samples.jsonl row as a Sample; ValueError naming `where` and the field otherwise."""
    for field, kind in (("step", int), ("question", str), ("response", str), ("scores", dict)):
        if not isinstance(row.get(field), kind) or isinstance(row.get(field), bool):
            raise ValueError(f"{where}: field {field!r}: expected {kind.__name__}, got {row.get(field)!r}")
    reward = scalar_value(row.get("reward"))
    if reward is None:
        raise ValueError(f"{where}: field 'reward': expected a number, got {row.get('reward')!r}")
    scores = {d: scalar_value(v) for d, v in row["scores"].items()}
    return Sample(row["step"], str(row.get("stage", "grpo")), row["question"], row["response"], reward,
                  {d: np.nan if v is None else v for d, v in scores.items()})


def dedupe(samples: Sequence[Sample]) -> list[Sample]:
    """The samples with distinct response text (surrounding whitespace ignored), earliest step first."""
    seen: set[str] = set()
    kept = []
    for sample in sorted(samples, key=lambda s: s.step):
        text = sample.response.strip()
        if text not in seen:
            seen.add(text)
            kept.append(sample)
    return kept


def _bins(values: np.ndarray, count: int) -> np.ndarray:
    """Quantile bin 0..count-1 of each value (equal-count bins; ties share a bin)."""
    if values.size == 0:
        return np.zeros(0, int)
    edges = np.quantile(values, np.linspace(0, 1, count + 1)[1:-1])
    return np.searchsorted(edges, values, side="right")


def strata(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """(step bin [P], reward bin [P]): steps by the rank of their distinct value, rewards by quantile."""
    steps = np.array([s.step for s in samples])
    distinct = np.unique(steps)
    step_rank = np.searchsorted(distinct, steps)
    step_bin = step_rank * min(STEP_BINS, len(distinct)) // max(len(distinct), 1)
    reward = np.array([s.reward if np.isfinite(s.reward) else 0.0 for s in samples])
    return step_bin, _bins(reward, REWARD_BINS)


def dimension_levels(samples: Sequence[Sample], dimension_ids: Sequence[str]) -> np.ndarray:
    """[P, D] int: 0 below the top level, 1 at it, 2 unscored."""
    levels = np.full((len(samples), len(dimension_ids)), 2, dtype=int)
    for p, sample in enumerate(samples):
        for d, dim_id in enumerate(dimension_ids):
            score = sample.scores.get(dim_id, np.nan)
            if np.isfinite(score):
                levels[p, d] = int(score >= _TOP)
    return levels


@dataclasses.dataclass(frozen=True)
class Draw:
    """The drawn samples (in output order) and how many came from each (step bin, reward bin) cell."""

    samples: list[Sample]
    cells: dict[str, int]
    pool: int  # distinct responses available


def draw(samples: Sequence[Sample], n: int, seed: int = 0) -> Draw:
    """`n` stratified samples (all of them if fewer are distinct); see the module docstring."""
    if n < 1:
        raise ValueError(f"n: expected a positive number of responses to label, got {n}")
    pool = dedupe(samples)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pool))
    pool = [pool[i] for i in order]  # the seeded tie-break order
    step_bin, reward_bin = strata(pool)
    dims = sorted({d for s in pool for d in s.scores})
    levels_PxD = dimension_levels(pool, dims)
    counts_DxL = np.zeros((len(dims), _LEVELS))
    cells = sorted({(int(a), int(b)) for a, b in zip(step_bin, reward_bin)})
    cells = [cells[i] for i in rng.permutation(len(cells))]
    free = np.ones(len(pool), bool)
    chosen: list[int] = []
    while len(chosen) < min(n, len(pool)):
        for cell in cells:
            if len(chosen) == min(n, len(pool)):
                break
            candidates = np.flatnonzero(free & (step_bin == cell[0]) & (reward_bin == cell[1]))
            if candidates.size == 0:
                continue
            rarity = (1.0 / (1.0 + counts_DxL[np.arange(len(dims)), levels_PxD[candidates]])).sum(axis=1) \
                if dims else np.zeros(candidates.size)
            pick = int(candidates[np.argmax(rarity)])
            free[pick] = False
            chosen.append(pick)
            counts_DxL[np.arange(len(dims)), levels_PxD[pick]] += 1
    by_cell: dict[str, int] = {}
    for i in chosen:
        key = f"step bin {step_bin[i]} · reward bin {reward_bin[i]}"
        by_cell[key] = by_cell.get(key, 0) + 1
    shuffled = [pool[chosen[i]] for i in rng.permutation(len(chosen))]
    return Draw(shuffled, dict(sorted(by_cell.items())), len(pool))


def label_row(sample: Sample, dimension_ids: Sequence[str], row_rubric: Mapping[str, Any] | None,
              source: str) -> dict[str, Any]:
    """A labels-file row (calibration/labels.py) with every dimension's label empty (null)."""
    row: dict[str, Any] = {"question": sample.question, "response": sample.response,
                           "labels": {d: None for d in dimension_ids}}
    if row_rubric is not None:
        row["rubric"] = row_rubric
    row["sampled_from"] = {"run": source, "stage": sample.stage, "step": sample.step}
    return row
