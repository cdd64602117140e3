"""PNG plots from metrics.jsonl: one run's curves (`plot_run`, written by every run) and several runs
overlaid (`plot_runs`, for sweeps and `experiments.plots`).

Each plot is a `PlotSpec`: a regex over metric names and the stages whose rows it reads (naming
conventions in metrics.py), so a new dimension or counter shows up without code changes, and a plot
whose regex matches nothing (a run without a judge has no judge counters) is not written. A monitor's
plot draws its alert threshold (`config.monitor.<field>`, read from the run's config.json) as a dashed
line. One run: one axes, a line per metric. Several runs: one panel per metric, a line per run, one legend of run
names. Uses matplotlib's object API (Figure + Agg), never pyplot's global state; files are written
atomically.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rubric_jax.files import atomic_directory, read_text, write_atomic
from rubric_jax.metrics import METRICS_FILE, read_jsonl_metrics, scalar_value

PLOTS_DIR = "plots"
OVERLAY_MANIFEST = ".experiments_plots.json"  # marks a directory experiments.plots wrote (it may rewrite it)
# Matplotlib cannot lay out an axis spanning -1e308..1e308 (the tick range overflows): values are clipped here.
PLOT_LIMIT = 1e100
# zlib level of the PNGs: the same pixels as the default 6 with ~35% less encoding CPU and ~17% larger files (a run's
# 18 plots: 257 -> 173 ms, 607 -> 713 KB).
PNG_COMPRESS_LEVEL = 1
_SCORE = "score (0 = worst, 1 = best)"


@dataclasses.dataclass(frozen=True)
class PlotSpec:
    """One PNG: the metrics whose names match `pattern`, read from rows of `stages` (a row without a
    "stage" counts as GRPO)."""

    filename: str
    title: str
    ylabel: str
    pattern: str
    stages: tuple[str, ...] = ("grpo",)
    xlabel: str = "GRPO step"
    threshold: str | None = None  # the config.monitor field whose alert threshold is drawn
    requires: str = ""  # a regex some drawn metric must match, else no plot (golden beside eval: golden keys)


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec("reward.png", "Training reward: mean and per-dimension scores", _SCORE, r"^reward/"),
    PlotSpec("eval_reward.png", "Held-out reward: mean and per-dimension scores", _SCORE,
             r"^eval/reward(/|_mean$)", stages=("eval",)),
    PlotSpec("kl.png", "KL divergence to the reference policy", "KL estimate (nats per token)", r"(^|/)kl($|/|_)"),
    PlotSpec("clip_fraction.png", "Tokens whose probability ratio was clipped", "fraction of tokens",
             r"^clip_frac(_low|_high)?$"),
    PlotSpec("entropy.png", "Policy entropy on the rollouts", "entropy (nats per token)", r"^entropy$"),
    PlotSpec("grad_norm.png", "Gradient norm before clipping", "global L2 norm", r"^grad_norm$"),
    PlotSpec("lr.png", "Learning rate (after warmup and schedule)", "learning rate", r"^lr$"),
    PlotSpec("response_length.png", "Response length", "tokens per response", r"response_len(gth)?/",
             stages=("grpo", "eval")),
    PlotSpec("zero_std.png", "Groups with zero reward variance (no GRPO signal)", "fraction of groups",
             r"^zero_std_frac(/window_mean)?$", threshold="max_zero_std_frac"),
    PlotSpec("judge_failures.png", "LLM-judge failures", "count per step",
             r"^(eval/)?judge_(invalid|failed_scores|prompt_too_long)$", stages=("grpo", "eval")),
    PlotSpec("weights.png", "Dimension weights (dynamic weighting)", "weight in the aggregate", r"^weight/"),
    PlotSpec("template_share.png", "Responses following a first / second / finally template (EN and ZH)",
             "fraction of responses", r"^monitor/template_share(/window_mean)?$", threshold="max_template_share"),
    PlotSpec("length_drift.png", "Response-length drift from the first GRPO step", "mean tokens / step 1's - 1",
             r"^monitor/length_drift$", threshold="max_length_drift"),
    PlotSpec("saturation.png", "Dimension saturation: scores at the top level", "fraction of valid scores",
             r"^monitor/saturation/[^/]+$"),
    PlotSpec("saturation_rise.png", "Saturation rise: window mean minus the first window's", "change in fraction",
             r"^monitor/saturation/[^/]+/rise$", threshold="max_saturation_rise"),
    PlotSpec("redundancy.png", "Dimension pairs: Spearman over the window's rollouts", "Spearman rho",
             r"^monitor/redundancy/", threshold="max_redundancy"),
    PlotSpec("score_variance.png", "Per-dimension score variance", "variance of normalised scores", r"^monitor/var/"),
    PlotSpec("reward_length_corr.png", "Reward vs response length within a step", "Spearman rho",
             r"^monitor/reward_length_corr(/window_mean)?$", threshold="max_reward_length_corr"),
    PlotSpec("judge_parse_failure.png", "LLM-judge prompts without a parseable verdict", "fraction of judge prompts",
             r"^monitor/judge_parse_failure$", threshold="max_judge_parse_failure"),
    PlotSpec("missing_scores.png", "Missing scores per dimension (left out of the reward)", "fraction of its scores",
             r"^monitor/missing/", threshold="max_missing_share"),
    PlotSpec("golden_reward.png", "Golden-set reward next to the held-out eval's mean reward", _SCORE,
             r"^(eval|golden|golden/reference)/reward_mean$|^golden/reward/", stages=("eval",), requires="^golden/"),
    PlotSpec("golden_agreement.png", "Golden set: judge vs labels on the reference answers", "Spearman rho",
             r"^golden/spearman/", stages=("eval",), threshold="min_golden_spearman"),
    PlotSpec("audit_agreement.png", "Training vs audit judge on eval responses: Spearman and quadratic kappa",
             "agreement", r"^audit/(spearman|kappa)/", stages=("eval",),
             threshold="min_audit_agreement"),
    PlotSpec("audit_gap.png", "Score gap on eval responses: training judge minus audit judge",
             "normalised score gap", r"^audit/gap/[^/]+$", stages=("eval",)),
    PlotSpec("audit_gap_rise.png", "Audit gap rise over the window of audits", "change in gap",
             r"^audit/gap/[^/]+/rise$", stages=("eval",), threshold="max_audit_gap_rise"),
    PlotSpec("sft_loss.png", "Cold-start SFT loss", "NLL (nats per response token)", r"^loss$", stages=("sft",),
             xlabel="SFT step"),
)

# Words for metric names that are not self-explanatory in a legend (per-dimension names are the ids).
_LABELS = {
    "reward/mean": "mean reward",
    "eval/reward_mean": "eval: mean reward",
    "clip_frac": "clipped (either side)",
    "clip_frac_low": "clipped below 1 - clip_low",
    "clip_frac_high": "clipped above 1 + clip_high",
    "response_len/mean": "training rollouts",
    "eval/response_len/mean": "held-out eval",
    "judge_invalid": "unparseable judge answers",
    "judge_failed_scores": "scores missing after retries",
    "judge_prompt_too_long": "prompts longer than the judge's context",
    "golden/reward_mean": "golden: mean reward",
    "golden/reference/reward_mean": "golden: reference answers",
    "monitor/template_share": "template share",
    "monitor/template_share/window_mean": "template share, rolling mean (alerted)",
    "monitor/length_drift": "length drift",
    "monitor/reward_length_corr": "reward-length Spearman",
    "monitor/reward_length_corr/window_mean": "reward-length Spearman, rolling mean (alerted)",
    "monitor/judge_parse_failure": "judge parse failures",
}


def metric_label(key: str) -> str:
    """The name a reader sees for a metric: words for known counters, the dimension id for per-dimension
    scores and weights, "(eval)" for held-out counters, else the metric name itself."""
    if key in _LABELS:
        return _LABELS[key]
    dimension = re.match(r"^(?:eval/|monitor/|golden/)?(?:reward|weight|var|saturation|missing|spearman|redundancy)/(.+)$",
                         key)
    if dimension:
        return f"golden: {dimension.group(1)}" if key.startswith("golden/") else dimension.group(1)
    if key.startswith("eval/") and key[5:] in _LABELS:
        return f"{_LABELS[key[5:]]} (eval)"
    return key


def series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over the rows that carry it as a number (NaN kept: it breaks the line);
    values beyond ±PLOT_LIMIT (±inf, ±1e308) are clipped to it, so the axis range stays finite."""
    steps, values = [], []
    for row in rows:
        value = scalar_value(row.get(key))
        if value is not None:
            steps.append(int(row["step"]))
            values.append(value if math.isnan(value) else max(-PLOT_LIMIT, min(PLOT_LIMIT, value)))
    return steps, values


def clipped_note(values: Sequence[float]) -> str:
    """' (clipped at ±LIMIT)' for a legend or title when some value was clipped by `series`, else ''."""
    return f" (clipped at ±{PLOT_LIMIT:g})" if any(abs(v) == PLOT_LIMIT for v in values) else ""


def spec_series(spec: PlotSpec, rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """{metric: (steps, values)} of every metric of `spec` in `rows` with at least one finite value;
    the "mean" metrics first, then by name."""
    rows = [row for row in rows if row.get("stage", "grpo") in spec.stages]
    names = {k for row in rows for k in row if k not in ("step", "time", "stage") and re.search(spec.pattern, k)}
    if not any(re.search(spec.requires, k) for k in names):
        return {}
    names = sorted(names, key=lambda k: (not k.endswith("mean"), k))
    found = {k: series(rows, k) for k in names}
    return {k: (steps, values) for k, (steps, values) in found.items()
            if any(not math.isnan(v) for v in values)}


def _line_style(n_points: int) -> dict[str, Any]:
    return {"marker": "o" if n_points < 30 else None, "markersize": 3}


def _legend_inches(labels: Sequence[str]) -> float:
    return 0.9 + 0.063 * max(map(len, labels), default=0)  # line sample + padding + ~0.063 in per 8-pt character


def _figure(nrows: int, ncols: int, panel_inches: tuple[float, float], legend_labels: Sequence[str]
            ) -> tuple[Figure, Any]:
    """A figure of nrows x ncols panels with fixed margins in inches (a figure title above a grid) and room
    on the right for the legend (constrained layout would cost about a second per figure)."""
    legend_w, top = _legend_inches(legend_labels), (0.95 if nrows * ncols > 1 else 0.5)
    width, height = ncols * panel_inches[0] + 0.6 + legend_w, nrows * panel_inches[1] + top + 0.1
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    fig.subplots_adjust(left=0.8 / width, right=1 - legend_w / width, bottom=0.55 / height, top=1 - top / height,
                        hspace=0.6, wspace=0.3)
    return fig, axes


def _legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str]) -> None:
    x = 1 - (_legend_inches(labels) - 0.2) / fig.get_figwidth()
    fig.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(x, 0.5))


def _label_axes(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.grid(alpha=0.3)


def _save(fig: Figure, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, pil_kwargs={"compress_level": PNG_COMPRESS_LEVEL})
    return write_atomic(path, buffer.getvalue())


def plot_metrics(rows: Sequence[Mapping[str, Any]], out_dir: str | Path,
                 thresholds: Mapping[str, float] | None = None) -> list[Path]:
    """Writes every plot of PLOTS that has data for one run into `out_dir` (a line per metric, and the
    alert threshold of a monitor's plot when `thresholds`, config.monitor field -> value, has it);
    returns the paths written."""
    written = []
    for spec in PLOTS:
        lines = spec_series(spec, rows)
        if not lines:
            continue
        threshold = (thresholds or {}).get(spec.threshold)
        threshold = threshold if threshold is not None and math.isfinite(threshold) else None
        labels = [metric_label(key) + clipped_note(values) for key, (_, values) in lines.items()]
        labels += [f"alert threshold {threshold:g}"] if threshold is not None else []
        fig, axes = _figure(1, 1, (7.5, 4.2), labels)
        ax = axes[0, 0]
        handles = []
        for key, (steps, values) in lines.items():
            main = key.endswith("mean") or len(lines) == 1
            handles += ax.plot(steps, values, linewidth=2.2 if main else 1.0, **_line_style(len(steps)))
        if threshold is not None:
            handles.append(ax.axhline(threshold, color="red", linestyle="--", linewidth=1.2))
        _label_axes(ax, spec.title, spec.xlabel, spec.ylabel)
        _legend(fig, handles, labels)
        written.append(_save(fig, Path(out_dir) / spec.filename))
    return written


def plot_run(workdir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Reads `workdir/metrics.jsonl` (and the monitor thresholds of `workdir/config.json`, when there is one)
    and writes the plots into `out_dir` (default `workdir/plots`)."""
    workdir = Path(workdir)
    config = workdir / "config.json"
    thresholds = json.loads(read_text(config, "run config")).get("monitor") if config.exists() else None
    return plot_metrics(read_jsonl_metrics(workdir / METRICS_FILE), out_dir or workdir / PLOTS_DIR, thresholds)


def run_names(workdirs: Sequence[str | Path]) -> list[str]:
    """Legend names of runs: the shortest ending of each (distinct) workdir path that tells them apart,
    e.g. "lr=0.0001,beta=0.0" for sweep variants, "a/tiny" and "b/tiny" for two runs named alike."""
    parts = [Path(p).resolve().parts for p in workdirs]
    if len(set(parts)) != len(parts):
        raise ValueError(f"a workdir is given twice: {[str(p) for p in workdirs]}")
    depth = next(d for d in range(1, max(map(len, parts)) + 1) if len({p[-d:] for p in parts}) == len(parts))
    return ["/".join(p[-depth:]) for p in parts]


def plot_runs(runs: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: str | Path) -> list[Path]:
    """Overlays several runs ({legend name: metrics rows}): per plot of PLOTS, one panel per metric and
    one line per run that has it, each run in the same colour in every panel; returns the paths written."""
    written = []
    for spec in PLOTS:
        per_run = {name: spec_series(spec, rows) for name, rows in runs.items()}
        keys = sorted({k for lines in per_run.values() for k in lines}, key=lambda k: (not k.endswith("mean"), k))
        if not keys:
            continue
        ncols = min(3, len(keys))
        fig, axes = _figure(-(-len(keys) // ncols), ncols, (4.2, 3.2) if len(keys) > 1 else (7.5, 4.2), list(runs))
        handles = {}
        for ax, key in zip(axes.flat, keys):
            for index, (name, lines) in enumerate(per_run.items()):
                if key in lines:
                    steps, values = lines[key]
                    (handles[name],) = ax.plot(steps, values, color=f"C{index % 10}",
                                               linestyle=("-", "--", ":", "-.")[index // 10 % 4], linewidth=1.5,
                                               **_line_style(len(steps)))
            clipped = clipped_note([v for lines in per_run.values() for v in lines.get(key, ((), ()))[1]])
            title = (metric_label(key) if len(keys) > 1 else spec.title) + clipped
            _label_axes(ax, title, spec.xlabel, spec.ylabel if ax.get_subplotspec().is_first_col() else "")
        for ax in axes.flat[len(keys):]:
            ax.set_axis_off()
        if len(keys) > 1:
            fig.suptitle(spec.title, fontsize=13)
        names = [name for name in runs if name in handles]
        _legend(fig, [handles[name] for name in names], names)
        written.append(_save(fig, Path(out_dir) / spec.filename))
    return written


def check_overlay_dir(out: Path, workdirs: Sequence[Path]) -> None:
    """ValueError unless `out` may receive overlays: new, empty, or written by `write_overlays` before (it holds
    OVERLAY_MANIFEST). Never a run's workdir or any run's plots/ (another run's curves would be overwritten)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out={out} is a file, not a directory")
    for workdir in workdirs:
        if out.resolve() in (workdir.resolve(), (workdir / PLOTS_DIR).resolve()):
            raise ValueError(f"--out={out} is the run {workdir} (or its plots/): write the overlays elsewhere")
    if out.resolve().name == PLOTS_DIR and (out.resolve().parent / METRICS_FILE).exists():
        raise ValueError(f"--out={out} is the plots/ of the run {out.resolve().parent}: its own plots would be "
                         "overwritten; write the overlays elsewhere")
    if out.is_dir() and any(out.iterdir()) and not (out / OVERLAY_MANIFEST).is_file():
        raise ValueError(f"--out={out} is a non-empty directory that experiments.plots did not write; give a new or "
                         "empty directory")


def write_overlays(runs: Mapping[str, Sequence[Mapping[str, Any]]], out: Path) -> list[Path]:
    """`plot_runs` into `out` as a whole: built in a sibling directory with OVERLAY_MANIFEST and swapped in, so
    a failure (a full disk) leaves the previous `out` as it was and no partial set of PNGs. Returns the paths."""
    with atomic_directory(out, replace=True) as tmp:
        written = plot_runs(runs, tmp)
        manifest = {"written_by": "experiments.plots", "runs": list(runs), "files": [p.name for p in written]}
        write_atomic(tmp / OVERLAY_MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return [out / p.name for p in written]
