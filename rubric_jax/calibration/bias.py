"""Bias probes: does a judge's error (or score) follow surface features, and does anchor order move it?

Feature regression (RubricRL 3.3: judges favour longer answers and "首先…其次…最后" templates): the
target, judge - label where labels exist and the judge's score otherwise, is regressed by OLS on an
intercept and the response features of rubric_jax.judges.features. Length enters standardised
(`length_z`, per SD over every calibration item, the SD reported); list/markdown/template are 0/1 flags
and cjk_share a share, used as they are. A feature constant over the dimension's items is dropped and
named. Each coefficient has an OLS standard error and a t interval; an interval that excludes 0 is a
bias in score points on the dimension's raw scale.

Position probe (RubricRL 3.3 "位置偏差"): the LLM dimensions are scored twice with a fixed anchor order,
as written and reversed (criteria reversed too in all_criteria mode), same nonces and sampling keys; the
shift is reversed - forward per item, reported as its mean (with a bootstrap interval), mean absolute
value and the share of items whose score changed.

Group position bias (judge.layout=group: a group's responses in one prompt, in a seeded shuffled order per sample):
every valid sample's score with the position it was shown at (llm_judge's details["judge_group_positions"]); per
dimension, the mean score at each shown position minus the mean of all, and the Spearman correlation of score with
relative position (position / (size - 1), groups of two or more). The orders are random, so a judge without a
position bias shows no trend beyond chance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rubric_jax.calibration.agreement import CONFIDENCE
from rubric_jax.calibration.stats import Statistic, bootstrap_ci, ols, spearman

STANDARDIZED = ("length",)  # features entering as z-scores; the others are flags or shares already in [0, 1]


def standardization(features: Mapping[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """(mean, SD) of each STANDARDIZED feature that varies over the items (a constant one cannot be scaled)."""
    out = {}
    for name in STANDARDIZED:
        values_N = np.asarray(features[name], dtype=np.float64)
        if values_N.std() > 0:
            out[name] = (float(values_N.mean()), float(values_N.std()))
    return out


def regressor_name(feature: str, standardize: Mapping[str, tuple[float, float]]) -> str:
    return f"{feature}_z" if feature in standardize else feature


def feature_columns(features: Mapping[str, np.ndarray], standardize: Mapping[str, tuple[float, float]],
                    rows: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Regressors over `rows` (feature -> [n], standardised where listed) and the features dropped, with why."""
    columns, dropped = {}, {}
    for name, values in features.items():
        x_n = np.asarray(values, dtype=np.float64)[rows]
        if x_n.size and (x_n == x_n[0]).all():
            dropped[name] = f"constant ({x_n[0]:g}) over these items"
            continue
        if name in standardize:
            mean, std = standardize[name]
            x_n = (x_n - mean) / std
        columns[name] = x_n
    return columns, dropped


def bias_regression(target_n: np.ndarray, features: Mapping[str, np.ndarray],
                    standardize: Mapping[str, tuple[float, float]], rows: np.ndarray, target: str) -> dict[str, object]:
    """OLS of target [n] (values on `rows`) on an intercept and the features; coefficients with t intervals."""
    columns, dropped = feature_columns(features, standardize, rows)
    names = ["intercept", *(regressor_name(f, standardize) for f in columns)]
    X_nxP = np.column_stack([np.ones_like(target_n), *columns.values()])
    fit = ols(X_nxP, target_n, CONFIDENCE)
    out: dict[str, object] = {"target": target, "n": int(target_n.shape[0]), "dropped": dropped}
    if fit.undefined is not None:
        out["undefined"] = fit.undefined
        return out
    out["coefficients"] = {
        name: {"coef": float(c), "stderr": float(s), "ci95": [float(lo), float(hi)],
               "excludes_zero": bool(lo > 0 or hi < 0)}
        for name, c, s, lo, hi in zip(names, fit.coef, fit.stderr, fit.low, fit.high)
    }
    out["residual_df"] = fit.df
    return out


def _mean(x: np.ndarray) -> Statistic:
    return Statistic(float(np.mean(x)))


def position_shift(forward_N: np.ndarray, reversed_N: np.ndarray, *, num_resamples: int,
                   seed: int | Sequence[int]) -> dict[str, object]:
    """Shift of a dimension's scores when its anchor order is reversed, over items scored both ways."""
    both = ~(np.isnan(forward_N) | np.isnan(reversed_N))
    shift_n = reversed_N[both] - forward_N[both]
    out: dict[str, object] = {"n": int(both.sum()), "unscored": int((~both).sum())}
    if not both.any():
        out["undefined"] = "no item was scored in both orders"
        return out
    interval = bootstrap_ci(_mean, [shift_n], num_resamples=num_resamples, confidence=CONFIDENCE, seed=seed)
    out.update({"mean_shift": float(shift_n.mean()), "mean_shift_ci95": interval.to_json(),
                "mean_abs_shift": float(np.abs(shift_n).mean()), "changed_share": float((shift_n != 0).mean())})
    return out


def group_position_bias(records: Sequence[tuple[str, int, int, float]]) -> dict[str, dict[str, object]]:
    """Per dimension of the group layout's (dimension id, shown position, group size, raw score) records: the
    samples, the mean score by shown position (1 = first) and minus the overall mean, and the Spearman correlation
    of score with relative position (groups of two or more; undefined when too few or constant)."""
    out: dict[str, dict[str, object]] = {}
    for dim_id in dict.fromkeys(r[0] for r in records):
        rows = [r for r in records if r[0] == dim_id]
        position_N = np.asarray([r[1] for r in rows])
        score_N = np.asarray([r[3] for r in rows], dtype=np.float64)
        mean = float(score_N.mean())
        by_position = [{"position": int(k) + 1, "n": int((position_N == k).sum()),
                        "mean": float(score_N[position_N == k].mean()),
                        "minus_mean": float(score_N[position_N == k].mean() - mean)} for k in np.unique(position_N)]
        ranked = [(r[1] / (r[2] - 1), r[3]) for r in rows if r[2] > 1]
        rho = spearman(*np.asarray(ranked, dtype=np.float64).reshape(-1, 2).T)
        out[dim_id] = {"samples": len(rows), "mean": mean, "by_position": by_position,
                       "spearman_position": rho.to_json()}
    return out
