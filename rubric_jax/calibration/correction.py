"""Fitting a score correction (rubrics/correction.py) from calibration data, one OLS per dimension.

    label ~ intercept + score * judge + sum_f coef_f * x_f      (x_f: the bias probe's regressors)

RubricRL 3.3 "后处理校准": predict the judge's bias from length and format features and remove it. The
fit is in-sample, so the report gives the error before and after on the same items; judge a correction
on held-out labels by calibrating again with `--correction=FILE`. A dimension with fewer than
MIN_ITEMS_PER_COEFFICIENT items per fitted coefficient is not corrected (an over-fitted correction
would move training rewards by noise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rubric_jax.calibration.bias import feature_columns
from rubric_jax.calibration.labels import DimensionInfo
from rubric_jax.calibration.stats import ols, spearman
from rubric_jax.rubrics.correction import Correction, DimensionCorrection

MIN_ITEMS_PER_COEFFICIENT = 5

def _rmse(a_n: np.ndarray, b_n: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a_n - b_n) ** 2)))


def fit_dimension(judge_N: np.ndarray, label_N: np.ndarray, info: DimensionInfo, features: Mapping[str, np.ndarray],
                  standardize: Mapping[str, tuple[float, float]]) -> tuple[DimensionCorrection | None, dict[str, Any]]:
    """The correction of one dimension over the items with both a judge score and a label, and a fit report."""
    rows = np.flatnonzero(~(np.isnan(judge_N) | np.isnan(label_N)))
    columns, dropped = feature_columns(features, standardize, rows)
    X_nxP = np.column_stack([np.ones(rows.shape[0]), judge_N[rows], *columns.values()])
    fit = ols(X_nxP, label_N[rows])
    report: dict[str, Any] = {"n": int(rows.shape[0]), "dropped": dropped}
    needed = MIN_ITEMS_PER_COEFFICIENT * X_nxP.shape[1]
    if rows.shape[0] < needed:
        report["not_fitted"] = (f"{rows.shape[0]} items for {X_nxP.shape[1]} coefficients; need at least {needed} "
                                f"({MIN_ITEMS_PER_COEFFICIENT} per coefficient)")
        return None, report
    if fit.undefined is not None:
        report["not_fitted"] = fit.undefined
        return None, report
    dim = DimensionCorrection(float(fit.coef[0]), float(fit.coef[1]),
                              {f: float(c) for f, c in zip(columns, fit.coef[2:])}, info.scale)
    return dim, report


def fit_correction(judge: Mapping[str, np.ndarray], labels: Mapping[str, np.ndarray], info: Mapping[str, DimensionInfo],
                   features: Mapping[str, np.ndarray], standardize: Mapping[str, tuple[float, float]], *,
                   version: str, provenance: Mapping[str, Any]) -> tuple[Correction | None, dict[str, dict[str, Any]]]:
    """A Correction over every labelled dimension that can be fitted (None if none can), and per-dimension
    reports with the in-sample RMSE and Spearman before and after applying it."""
    fitted, reports = {}, {}
    for dim_id, label_N in labels.items():
        dim, reports[dim_id] = fit_dimension(judge[dim_id], label_N, info[dim_id], features, standardize)
        if dim is not None:
            fitted[dim_id] = dim
    if not fitted:
        return None, reports
    correction = Correction(version, dict(standardize), fitted, dict(provenance))
    for dim_id in fitted:
        judge_N, label_N = judge[dim_id], labels[dim_id]
        after_N = correction.apply([dim_id], judge_N[:, None], features)[:, 0]
        both = ~(np.isnan(judge_N) | np.isnan(label_N))
        before_rho, after_rho = spearman(judge_N[both], label_N[both]), spearman(after_N[both], label_N[both])
        reports[dim_id].update({
            "rmse_before": _rmse(judge_N[both], label_N[both]), "rmse_after": _rmse(after_N[both], label_N[both]),
            "spearman_before": before_rho.to_json(), "spearman_after": after_rho.to_json(),
        })
    return correction, reports
