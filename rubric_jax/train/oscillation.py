"""The learning-rate drop on an oscillating reward (RubricRL §4.3: start at 1e-6, lower it to 5e-7 if the reward
oscillates), as a pure replay of the logged per-step reward, so a resumed run decides exactly what an
uninterrupted one did.

Oscillation over a window of W steps' rewards r_1..r_W: the path length over the displacement,
sum |r_{i+1} − r_i| / |r_W − r_1| (a steady trend is 1, a reward going up and down around the same level is
large), counted only when the mean step-to-step swing sum |r_{i+1} − r_i| / (W − 1) is at least `min_swing` (so
a flat, quiet reward does not count). When it reaches `ratio`, the factor on the learning rate is multiplied by
`factor` (down to `min_factor`), and the next drop needs a full window after this one.

The update of GRPO step s runs with the factor decided by the rewards of steps <= s − 2: the trainer reads a
step's metrics only after dispatching the next step (deferred metrics), so step s − 1's reward is not known when
step s is dispatched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from rubric_jax.train import state as train_state

LAG = 2  # the update of step s reads the rewards of steps <= s - LAG


@dataclasses.dataclass(frozen=True)
class OscillationRule:
    """When the reward oscillates enough to lower the learning rate, and by how much."""

    window: int = 20
    ratio: float = 4.0
    min_swing: float = 0.02
    factor: float = 0.5
    min_factor: float = 0.25

    def __post_init__(self) -> None:
        checks = {"window": (isinstance(self.window, int) and self.window >= 3, "an integer >= 3"),
                  "ratio": (math.isfinite(self.ratio) and self.ratio > 1, "a finite number > 1"),
                  "min_swing": (math.isfinite(self.min_swing) and self.min_swing >= 0, "a finite number >= 0"),
                  "factor": (0 < self.factor < 1, "in (0, 1)"),
                  "min_factor": (0 < self.min_factor <= 1, "in (0, 1]")}
        for field, (ok, what) in checks.items():
            if not ok:
                raise ValueError(f"{field}={getattr(self, field)!r}: expected {what}")


def oscillation(rewards: Sequence[float]) -> tuple[float, float]:
    """(path length / displacement, mean |step-to-step change|) of a window of rewards (inf for a closed loop)."""
    swings = [abs(b - a) for a, b in zip(rewards, rewards[1:])]
    path, displacement = sum(swings), abs(rewards[-1] - rewards[0])
    ratio = path / displacement if displacement > 0 else (math.inf if path > 0 else 0.0)
    return ratio, path / max(len(swings), 1)


def lr_factor_at(rewards_by_step: Mapping[int, float], step: int, rule: OscillationRule) -> tuple[float, list[int]]:
    """The learning-rate factor of the update at GRPO `step` and the steps whose rewards triggered each drop,
    replayed over the logged rewards of steps <= step − LAG (non-finite rewards are skipped)."""
    factor, drops, last_drop = 1.0, [], -math.inf
    known = sorted(s for s in rewards_by_step if s <= step - LAG and math.isfinite(rewards_by_step[s]))
    for i in range(rule.window - 1, len(known)):
        end = known[i]
        window = [rewards_by_step[s] for s in known[i - rule.window + 1 : i + 1]]
        ratio, swing = oscillation(window)
        if end - last_drop >= rule.window and ratio >= rule.ratio and swing >= rule.min_swing:
            if factor * rule.factor < rule.min_factor:
                break
            factor, last_drop = factor * rule.factor, end
            drops.append(end)
    return factor, drops


class LearningRateDrop:
    """`OscillationRule` applied to a GRPO stage: remembers each step's logged reward and, before each update,
    sets the optimizer's learning-rate factor the replay decides (host-side, so reading it never waits for the
    device)."""

    def __init__(self, rule: OscillationRule):
        self.rule = rule
        self.rewards: dict[int, float] = {}
        self.applied = 1.0

    def restore(self, rows: Sequence[Mapping[str, object]], factor_now: float) -> None:
        """Resume: the GRPO rows logged so far and the factor of the restored optimizer state."""
        self.rewards = {int(r["step"]): float(r["reward/mean"]) for r in rows
                        if r.get("stage") == "grpo" and isinstance(r.get("reward/mean"), (int, float))}
        self.applied = factor_now

    def before_step(self, opt_state: object, step: int) -> object:
        """`opt_state` with the factor of GRPO `step`'s update (unchanged when it is already set)."""
        factor, _ = lr_factor_at(self.rewards, step, self.rule)
        if factor == self.applied:
            return opt_state
        self.applied = factor
        return train_state.set_lr_factor(opt_state, factor)

    def observe(self, step: int, row: dict[str, object]) -> dict[str, object]:
        """Remembers the step's reward; adds `reward_oscillation` (path / displacement over the last window)."""
        self.rewards[step] = float(row["reward/mean"])  # type: ignore[arg-type]
        steps = sorted(s for s in self.rewards if s <= step and math.isfinite(self.rewards[s]))[-self.rule.window:]
        if len(steps) == self.rule.window:
            row["reward_oscillation"] = oscillation([self.rewards[s] for s in steps])[0]
        return row
