"""PNG plots of a run from its metrics.jsonl: reward (mean and per dimension), eval reward, KL, length, zero-std.

Each plot is a regex over metric names (naming conventions in metrics.py), so a new dimension or
metric shows up without code changes; a plot whose regex matches nothing is not written. Uses
matplotlib's object API (Figure + Agg), never pyplot's global state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rubric_jax.metrics import METRICS_FILE, read_jsonl_metrics, scalar_value

# (file name, title, regex over metric names)
PLOTS: tuple[tuple[str, str, str], ...] = (
    ("reward.png", "Training reward: mean and per-dimension scores", r"^reward/"),
    ("eval_reward.png", "Held-out reward: mean and per-dimension scores", r"^eval/reward(/|_mean$)"),
    ("kl.png", "KL divergence to the reference policy", r"(^|/)kl($|/|_)"),
    ("response_length.png", "Response length (tokens)", r"response_len(gth)?/"),
    ("zero_std.png", "Fraction of groups with zero reward variance", r"zero_std"),
)
PLOTS_DIR = "plots"


def series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over the rows that carry it as a number (NaN kept: it breaks the line)."""
    steps, values = [], []
    for row in rows:
        value = scalar_value(row.get(key))
        if value is not None:
            steps.append(int(row["step"]))
            values.append(value)
    return steps, values


def plot_metrics(rows: Sequence[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Writes every plot of PLOTS that has data into `out_dir`; returns the paths written."""
    out_dir = Path(out_dir)
    names = sorted({k for row in rows for k in row if k not in ("step", "time")})
    written = []
    for filename, title, pattern in PLOTS:
        keys = [k for k in names if re.search(pattern, k)]
        lines = [(k, *series(rows, k)) for k in keys]
        lines = [line for line in lines if line[1] and not all(math.isnan(v) for v in line[2])]
        if not lines:
            continue
        fig = Figure(figsize=(8, 4.5))
        ax = fig.subplots()
        for key, steps, values in lines:
            main = key.endswith("mean") or len(lines) == 1
            ax.plot(steps, values, label=key, linewidth=2.2 if main else 1.0, marker="o" if len(steps) < 30 else None,
                    markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / filename
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def plot_run(workdir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Reads `workdir/metrics.jsonl` and writes the plots into `out_dir` (default `workdir/plots`)."""
    workdir = Path(workdir)
    return plot_metrics(read_jsonl_metrics(workdir / METRICS_FILE), out_dir or workdir / PLOTS_DIR)
