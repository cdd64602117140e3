"""Reward fidelity: judges measured against labels (or each other), bias probes, fitted score corrections.

stats.py holds the statistics as pure functions (spearman, kendall_tau_b, quadratic_kappa, bootstrap_ci,
ols) for anything that monitors agreement; run.py scores labelled items through the training reward;
report.py writes report.json, report.md and plots. The entry point is `python -m experiments.calibrate`.
"""

from rubric_jax.calibration.stats import (
    Interval,
    OLSFit,
    Statistic,
    bootstrap_ci,
    kendall_tau_b,
    ols,
    quadratic_kappa,
    rankdata,
    spearman,
)

__all__ = ["Interval", "OLSFit", "Statistic", "bootstrap_ci", "kendall_tau_b", "ols", "quadratic_kappa", "rankdata",
           "spearman"]
