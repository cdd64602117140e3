"""DAPO's dynamic sampling for rubric rewards (Yu et al. 2025, arXiv 2503.14476 §3.2; OpenRLHF#1270, verl#2791):
a group whose rewards barely differ carries no gradient, so a step samples more questions, in at most
`max_rounds` extra rounds, until it holds `rl.questions_per_step` groups whose reward spread (max − min over the
group's scorable rows) exceeds `min_spread` (continuous rubric rewards are rarely exactly equal: "zero" is a
threshold).

Static shapes: every round samples as many questions as the step itself (the same compiled sampler and judge
calls), and the training batch always holds `questions_per_step` groups: the kept groups first, in the order
they were sampled, then, when the rounds run out, the dropped groups with the largest spread (zero advantage or
nearly so, as without dynamic sampling). The extra questions come from the stage's data iterator, so a step
may consume several batches of questions; the iterator's position is checkpointed as usual.

Several processes: each process fills its own block of the batch from its own samples (groups never straddle
processes); a round is a collective (sampling and judging are global), so every process runs a round while any
process still lacks kept groups.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class DynamicSampling:
    """rl.dynamic_sampling's settings: the spread a group must exceed, and the most extra sampling rounds."""

    min_spread: float = 0.0
    max_rounds: int = 2

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min_spread) and self.min_spread >= 0):
            raise ValueError(f"min_spread={self.min_spread!r}: expected a finite number >= 0")
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise ValueError(f"max_rounds={self.max_rounds!r}: expected an integer >= 1")


def group_spreads(reward_N: np.ndarray, trainable_N: np.ndarray, group_size: int) -> np.ndarray:
    """Per group, max − min of the rewards of its trainable rows (0 with fewer than two)."""
    r_BxG = np.asarray(reward_N, np.float64).reshape(-1, group_size)
    t_BxG = np.asarray(trainable_N, bool).reshape(-1, group_size)
    spread_B = np.where(t_BxG, r_BxG, -np.inf).max(1) - np.where(t_BxG, r_BxG, np.inf).min(1)
    return np.where(t_BxG.sum(1) >= 2, spread_B, 0.0)


def select_groups(spreads_by_round: list[np.ndarray], needed: int, min_spread: float) -> list[tuple[int, int]]:
    """`needed` (round, group) pairs: every kept group (spread > min_spread) in sampling order, then the dropped
    groups by decreasing spread (ties: sampling order)."""
    order = [(r, g) for r, spreads in enumerate(spreads_by_round) for g in range(len(spreads))]
    kept = [rg for rg in order if spreads_by_round[rg[0]][rg[1]] > min_spread]
    dropped = sorted((rg for rg in order if spreads_by_round[rg[0]][rg[1]] <= min_spread),
                     key=lambda rg: -spreads_by_round[rg[0]][rg[1]])
    chosen = (kept + dropped)[:needed]
    if len(chosen) < needed:
        raise ValueError(f"select_groups: {len(order)} groups sampled, {needed} needed")
    return chosen
