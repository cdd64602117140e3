"""Difficulty labels, the easy:medium:hard mix, and category-stratified held-out splits.

RubricRL article §5.1 trains on easy : medium : hard = 3 : 5 : 2. Labels come with the questions, or
from a model's rubric rewards: a question's mid-rank percentile among all scored questions puts it in
the lowest third (hard), the middle third (medium) or the top third (easy); tied rewards share a
label. Counts for a total follow the ratio by largest remainders, so they always sum to the total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

DIFFICULTIES = ("easy", "medium", "hard")
# Article 5.1: easy : medium : hard = 3 : 5 : 2.
DIFFICULTY_RATIOS: Mapping[str, float] = {"easy": 3, "medium": 5, "hard": 2}


class MixError(ValueError):
    """A ratio, label or size that the mix cannot honour (the message says which)."""


def parse_ratio(text: str) -> dict[str, float]:
    """'3:5:2' -> {'easy': 3.0, 'medium': 5.0, 'hard': 2.0}: three non-negative numbers, not all zero."""
    parts = text.split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or any(v < 0 for v in values) or not 0 < sum(values) < np.inf:
        raise MixError(f"expected easy:medium:hard as three non-negative numbers (not all zero, with a finite "
                       f"sum), e.g. 3:5:2; got {text!r}")
    return dict(zip(DIFFICULTIES, values))


def largest_remainder(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Integer counts proportional to `weights` summing to `total`; remainders break ties in key order."""
    weight_sum = float(sum(weights.values()))
    exact = {k: total * w / weight_sum for k, w in weights.items()}
    counts = {k: int(v) for k, v in exact.items()}
    keys = list(weights)
    by_remainder = sorted(keys, key=lambda k: (-(exact[k] - counts[k]), keys.index(k)))
    for k in by_remainder[: total - sum(counts.values())]:
        counts[k] += 1
    return counts


def max_mix_size(pool_sizes: Mapping[str, int], ratios: Mapping[str, float]) -> int:
    """The largest total whose ratio counts every pool can supply (0 when none can)."""
    for total in range(sum(pool_sizes.values()), 0, -1):
        counts = largest_remainder(total, ratios)
        if all(counts[d] <= pool_sizes.get(d, 0) for d in ratios):
            return total
    return 0


def difficulty_mix(difficulties: Sequence[str | None], num_samples: int, seed: int,
                   ratios: Mapping[str, float] = DIFFICULTY_RATIOS) -> list[int]:
    """Row indices sampled without replacement so difficulties follow `ratios`, in a seeded order."""
    pools: dict[str, list[int]] = {d: [] for d in ratios}
    for i, d in enumerate(difficulties):
        if d not in pools:
            raise MixError(f"row {i}: difficulty {d!r} is not one of {sorted(ratios)}")
        pools[d].append(i)
    counts = largest_remainder(num_samples, ratios)
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for d, count in counts.items():
        if count > len(pools[d]):
            raise MixError(f"difficulty mix needs {count} {d!r} rows but only {len(pools[d])} exist")
        chosen.extend(rng.choice(pools[d], size=count, replace=False).tolist())
    return [chosen[i] for i in rng.permutation(len(chosen))]


def difficulty_from_rewards(mean_reward: Mapping[str, float]) -> dict[str, str]:
    """{question id: label} from mean rewards: mid-rank percentile < 1/3 hard, >= 2/3 easy, else medium."""
    ids = list(mean_reward)
    rewards_N = np.array([mean_reward[i] for i in ids], dtype=np.float64)
    if not np.all(np.isfinite(rewards_N)):
        bad = ids[int(np.argmin(np.isfinite(rewards_N)))]
        raise MixError(f"question {bad!r}: mean reward {mean_reward[bad]!r} is not a finite number")
    sorted_N = np.sort(rewards_N)
    below_N = np.searchsorted(sorted_N, rewards_N, side="left")
    ties_N = np.searchsorted(sorted_N, rewards_N, side="right") - below_N
    percentile_N = (below_N + 0.5 * ties_N) / len(ids)
    labels = np.where(percentile_N < 1 / 3, "hard", np.where(percentile_N >= 2 / 3, "easy", "medium"))
    return dict(zip(ids, labels.tolist()))


def stratified_sample(categories: Sequence[str], size: int, seed: int) -> list[int]:
    """`size` row indices, each category contributing in proportion to its rows; sorted."""
    if not 0 <= size <= len(categories):
        raise MixError(f"cannot take {size} rows out of {len(categories)}")
    members: dict[str, list[int]] = {}
    for i, c in enumerate(categories):
        members.setdefault(c, []).append(i)
    counts = largest_remainder(size, {c: len(m) for c, m in sorted(members.items())}) if size else {}
    rng = np.random.default_rng(seed)
    chosen = [i for c, count in counts.items() for i in rng.choice(members[c], size=count, replace=False).tolist()]
    return sorted(chosen)
