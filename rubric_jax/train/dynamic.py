"""Group selection with refill rounds, one mechanism with three rules (legend: B groups of a round, G samples a
group, D columns, S groups sampled in a step):

- "spread", `rl.dynamic_sampling` (DAPO's dynamic sampling, Yu et al. 2025, arXiv 2503.14476 §3.2; verl#2791): a
  group is kept when its reward spread (max − min over its scorable rows) exceeds `min_spread` (continuous rubric
  rewards are rarely exactly equal: "zero" is a threshold);
- "zero_std", `rl.group_selection = "zero_std"`: kept when the std of what its advantages normalise is > 0, exactly
  the groups whose advantages are not all 0 (OpenRLHF#1270: a filter on the mean lets constant continuous-reward
  groups through);
- "top_variance", `rl.group_selection = "top_variance(p)"`: the top ⌊p·S⌋ of the S sampled groups by that std
  (ties: sampling order), a ranking that a reward's scale cannot move (verl#7894, TRL#7242 and SkyRL#2217 rank by
  reward variance, after RAGEN-2; their top_p is a fraction of the variance mass, ours of the groups). A step
  samples ⌈1/p⌉ rounds and keeps a fraction 1/⌈1/p⌉ of them: p itself for 1/2, 1/4, 1/5, ..., never more.

The std (`group_std`) is the weight-averaged sample std (ddof=1) of each column of what the advantages normalise,
over the group's rows counted in that column (train/rollout.py `AdvantageInputs`): with "sum_then_normalise" the one
column is the aggregated reward plus the overlong penalty over the trainable rows, the std GRPO divides by; with
"per_dimension" each weighted dimension's scores (gates applied; the overlong penalty one more column) over its
scored trainable rows, averaged with the rubric's weights, so a group whose dimensions trade off against a constant
aggregate still counts, as it does for GDPO, and the ranking reads raw spreads, not GDPO's z-scores (TRL#7242's
review). A column with fewer than two counted rows, or all of them equal, has std 0.

Refill: a step samples rounds of as many questions as the step itself (the same compiled sampler and judge calls,
the extra questions from the stage's data iterator, whose position is checkpointed) until this process's block holds
`rl.questions_per_step` kept groups, at most `max_rounds` extra rounds. "top_variance" samples the same rounds every
step (`rounds_needed`; more than `max_rounds` + 1 is refused at start-up). The batch is the kept groups, then, when
the rounds ran out, the dropped ones by decreasing statistic (ties: sampling order), in sampling order: its shape
never changes.

Several processes: each process fills its own block of the batch from its own samples (groups never straddle
processes, and "top_variance" ranks a process's own groups); a round is a collective (sampling and judging are
global), so every process runs a round while any process still lacks kept groups.
"""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction

import numpy as np

RULES = ("spread", "zero_std", "top_variance")  # spread: rl.dynamic_sampling; the others: rl.group_selection
_SELECTION_RE = re.compile(r"^\s*(none|zero_std|top_variance)\s*(?:\(([^()]*)\))?\s*$")
_SELECTION_USAGE = "expected 'none', 'zero_std' or 'top_variance(p)' with 0 < p < 1"


@dataclasses.dataclass(frozen=True)
class DynamicSampling:
    """The refill rounds' settings: the selection `rule` (RULES), the spread a group must exceed ("spread"), the
    fraction of groups kept ("top_variance") and the most extra sampling rounds."""

    min_spread: float = 0.0
    max_rounds: int = 2
    rule: str = "spread"
    fraction: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min_spread) and self.min_spread >= 0):
            raise ValueError(f"min_spread={self.min_spread!r}: expected a finite number >= 0")
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise ValueError(f"max_rounds={self.max_rounds!r}: expected an integer >= 1")
        if self.rule not in RULES:
            raise ValueError(f"rule={self.rule!r}: expected one of {RULES}")
        if not (0 < self.fraction < 1 if self.rule == "top_variance" else self.fraction == 1):
            raise ValueError(f"fraction={self.fraction!r}: expected 0 < p < 1 for top_variance, else 1")

    def kept_count(self, seen: int) -> int:
        """How many of `seen` groups "top_variance" keeps: ⌊p·seen⌋, no group outside the top fraction p, with p
        read as the decimal it is written as (0.29 of 100 groups is 29; float arithmetic gives 28.999999999999996)."""
        return math.floor(self._p() * seen)

    def rounds_needed(self) -> int | None:
        """The rounds "top_variance" samples every step: ⌈1/p⌉, the fewest whose groups' top fraction p fills the
        batch (None for the other rules, whose rounds depend on the rewards)."""
        return math.ceil(1 / self._p()) if self.rule == "top_variance" else None

    def _p(self) -> Fraction:
        """`fraction` as the decimal it is written as."""
        return Fraction(str(float(self.fraction)))

    def kept(self, stats_by_round: list[np.ndarray], needed: int) -> list[tuple[int, int]]:
        """The (round, group) pairs the rule keeps, in sampling order ("top_variance": at most `needed`)."""
        order = [(r, g) for r, stats in enumerate(stats_by_round) for g in range(len(stats))]
        if self.rule == "top_variance":
            ranked = sorted(order, key=lambda rg: -stats_by_round[rg[0]][rg[1]])  # stable: ties in sampling order
            return sorted(ranked[:min(needed, self.kept_count(len(order)))])
        threshold = self.min_spread if self.rule == "spread" else 0.0
        return [rg for rg in order if stats_by_round[rg[0]][rg[1]] > threshold]


def parse_group_selection(spec: object) -> tuple[str, float] | None:
    """rl.group_selection as (rule, fraction) for `DynamicSampling`: None for "none", ("zero_std", 1.0), or
    ("top_variance", p) for "top_variance(p)" with 0 < p < 1."""
    match = _SELECTION_RE.match(spec) if isinstance(spec, str) else None
    if not match or (match[1] == "top_variance") != (match[2] is not None):
        raise ValueError(_SELECTION_USAGE)
    if match[1] == "none":
        return None
    if match[1] == "zero_std":
        return "zero_std", 1.0
    try:
        p = float(match[2])
    except ValueError:
        raise ValueError(f"p must be a number; {_SELECTION_USAGE}") from None
    if not 0 < p < 1:
        raise ValueError(f"p={p!r} is not in (0, 1); {_SELECTION_USAGE}")
    return "top_variance", p


def group_spreads(reward_N: np.ndarray, trainable_N: np.ndarray, group_size: int) -> np.ndarray:
    """Per group, max − min of the rewards of its trainable rows (0 with fewer than two)."""
    r_BxG = np.asarray(reward_N, np.float64).reshape(-1, group_size)
    t_BxG = np.asarray(trainable_N, bool).reshape(-1, group_size)
    spread_B = np.where(t_BxG, r_BxG, -np.inf).max(1) - np.where(t_BxG, r_BxG, np.inf).min(1)
    return np.where(t_BxG.sum(1) >= 2, spread_B, 0.0)


def group_std(values_NxD: np.ndarray, counted_NxD: np.ndarray, weights_NxD: np.ndarray, group_size: int
              ) -> np.ndarray:
    """Per group, the weight-averaged sample std (ddof=1) of each column over its counted rows (the float32 values
    the advantages normalise; 0 for a column with fewer than two counted rows or all of them equal), each column
    weighted by its mean weight over the group's rows (the module docstring)."""
    n, num_cols = np.shape(values_NxD)
    v_BxGxD = np.asarray(values_NxD, np.float32).astype(np.float64).reshape(-1, group_size, num_cols)
    c_BxGxD = (np.asarray(counted_NxD, bool) & np.isfinite(v_BxGxD.reshape(n, num_cols))).reshape(v_BxGxD.shape)
    count_BxD = c_BxGxD.sum(1)
    mean_BxD = np.where(c_BxGxD, v_BxGxD, 0.0).sum(1) / np.maximum(count_BxD, 1)
    var_BxD = (np.where(c_BxGxD, v_BxGxD - mean_BxD[:, None], 0.0) ** 2).sum(1) / np.maximum(count_BxD - 1, 1)
    varies_BxD = (count_BxD >= 2) & (np.where(c_BxGxD, v_BxGxD, -np.inf).max(1) >
                                     np.where(c_BxGxD, v_BxGxD, np.inf).min(1))
    std_BxD = np.where(varies_BxD, np.sqrt(var_BxD), 0.0)
    w_BxD = np.asarray(weights_NxD, np.float64).reshape(-1, group_size, num_cols).mean(1)
    total_B = w_BxD.sum(1)
    return (w_BxD * std_BxD).sum(1) / np.where(total_B > 0, total_B, 1.0)


def select_groups(stats_by_round: list[np.ndarray], needed: int, rule: DynamicSampling) -> list[tuple[int, int]]:
    """`needed` (round, group) pairs: every group `rule` keeps, in sampling order, then the dropped groups by
    decreasing statistic (ties: sampling order)."""
    order = [(r, g) for r, stats in enumerate(stats_by_round) for g in range(len(stats))]
    kept = rule.kept(stats_by_round, needed)
    dropped = sorted(set(order) - set(kept), key=lambda rg: (-stats_by_round[rg[0]][rg[1]], rg))
    chosen = (kept + dropped)[:needed]
    if len(chosen) < needed:
        raise ValueError(f"select_groups: {len(order)} groups sampled, {needed} needed")
    return chosen
