"""A sweep's variants that differ only in their seed, taken together: the held-out reward's mean and spread
over seeds, each dimension's mean, the zero-std fraction and seconds per GRPO step, and seed-mean curves.

A recipe comparison on a small model is mostly seed noise; one number per option hides that, so the sweep
summary reports every option as mean ± spread over its seeds (spread = half the range: with 3 seeds the
standard deviation says little more) next to the per-variant table.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SEED_KEY = "seed"


def aggregate(variants: Sequence[Mapping[str, Any]], name_of: Callable[[Mapping[str, Any]], str]
              ) -> list[dict[str, Any]]:
    """Groups a sweep summary's variants (`sweeps.summarize` entries) by their overrides without `seed`; one
    entry per group with at least one variant that sets `seed`, in first-seen order. `name_of(overrides)`
    names a group from its overrides. Values are over the group's variants that logged them (finished or not:
    `finished` says how many finished)."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for variant in variants:
        overrides = variant["overrides"]
        if SEED_KEY in overrides:
            groups.setdefault(_key(overrides), []).append(variant)
    return [_group(members, name_of) for members in groups.values()]


def _key(overrides: Mapping[str, Any]) -> tuple:
    return tuple((k, repr(v)) for k, v in overrides.items() if k != SEED_KEY)


def _group(members: Sequence[Mapping[str, Any]], name_of: Callable[[Mapping[str, Any]], str]) -> dict[str, Any]:
    overrides = {k: v for k, v in members[0]["overrides"].items() if k != SEED_KEY}
    finals = _finite(m["final_eval_reward"] for m in members)
    dimensions = sorted({d for m in members for d in m.get("final_eval_dimensions", {})})
    return {
        "name": name_of(overrides), "overrides": overrides, "variants": [m["name"] for m in members],
        "seeds": [m["overrides"][SEED_KEY] for m in members],
        "finished": sum(m["status"] == "finished" for m in members),
        "final_eval_steps": sorted({m["final_eval_step"] for m in members if m["final_eval_step"] is not None}),
        "final_eval_reward": mean_and_spread(finals),
        "final_eval_dimensions": {d: mean_and_spread(_finite(m.get("final_eval_dimensions", {}).get(d)
                                                             for m in members)) for d in dimensions},
        "zero_std_frac": mean_and_spread(_finite(m.get("zero_std_frac") for m in members)),
        "seconds_per_step": mean_and_spread(_finite(m.get("seconds_per_step") for m in members)),
    }


def _finite(values: Any) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def mean_and_spread(values: Sequence[float]) -> dict[str, Any]:
    """{"mean", "spread" (half the range), "n"}; mean and spread None without values."""
    if not values:
        return {"mean": None, "spread": None, "n": 0}
    return {"mean": statistics.fmean(values), "spread": (max(values) - min(values)) / 2, "n": len(values)}


def mean_rows(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Seed-mean metrics rows of several runs of one group: per (stage, step), each numeric metric averaged
    over the runs that logged it there, for plotting a group as one curve (runs that stopped early leave
    their later steps to the others)."""
    cells: dict[tuple[str | None, int], dict[str, list[float]]] = {}
    for rows in runs:
        for row in rows:
            if "step" not in row:
                continue
            values = cells.setdefault((row.get("stage"), row["step"]), {})
            for key, value in row.items():
                if key not in ("step", "stage", "time") and isinstance(value, (int, float)) \
                        and not isinstance(value, bool) and math.isfinite(value):
                    values.setdefault(key, []).append(float(value))
    rows_out = []
    for (stage, step), values in sorted(cells.items(), key=lambda item: item[0][1]):  # stable: stages as first seen
        row: dict[str, Any] = {"step": step, **{k: statistics.fmean(v) for k, v in values.items()}}
        if stage is not None:
            row["stage"] = stage
        rows_out.append(row)
    return rows_out


def markdown_table(groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """The groups as markdown lines: held-out reward at the last eval (mean ± spread over seeds), each
    dimension's mean there, zero-std fraction and seconds per GRPO step."""
    if not groups:
        return []
    dimensions = sorted({d for g in groups for d in g["final_eval_dimensions"]})
    lines = ["| variant (over seeds) | seeds finished | final eval reward (mean ± spread) | "
             + " | ".join(dimensions) + (" | " if dimensions else "") + "zero-std fraction | s per GRPO step |",
             "|---" * (len(dimensions) + 5) + "|"]
    for g in groups:
        cells = [g["name"], f"{g['finished']} of {len(g['seeds'])}", _plus_minus(g["final_eval_reward"]),
                 *(_mean(g["final_eval_dimensions"].get(d, {})) for d in dimensions), _mean(g["zero_std_frac"]),
                 _mean(g["seconds_per_step"], digits=2)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _plus_minus(stat: Mapping[str, Any]) -> str:
    return "-" if stat["mean"] is None else f"{stat['mean']:.3f} ± {stat['spread']:.3f} (n={stat['n']})"


def _mean(stat: Mapping[str, Any], digits: int = 3) -> str:
    return "-" if stat.get("mean") is None else f"{stat['mean']:.{digits}f}"
