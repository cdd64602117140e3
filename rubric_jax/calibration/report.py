"""Writes a calibration: DIR/report.json (strict JSON, no NaN), DIR/report.md (the same as tables),
DIR/plots/<dimension>.png (confusion matrix and scatter), and the fitted correction file.

Every file is written whole or not at all (rubric_jax/files.write_atomic); report.json is written last, so its
presence means the rest is there. Writing into a directory that holds an earlier calibration first removes its
report.json, then writes the new files, removes the earlier outputs this one does not replace (a correction.json
when none was fitted, plots of dimensions no longer reported), and writes report.json last: the directory never
shows a new report beside an old correction. A correction written over an existing correction file gets the next
major version (the rubric-set hash of runs that apply it changes with its content anyway).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from rubric_jax.calibration.agreement import STATISTICS
from rubric_jax.calibration.pinning import PIN_FIELD
from rubric_jax.calibration.run import Calibration, PlotData
from rubric_jax.files import write_atomic
from rubric_jax.judges.features import FEATURES
from rubric_jax.plots import PLOTS_DIR
from rubric_jax.rubrics.correction import Correction, dumps_correction, load_correction
from rubric_jax.rubrics.schema import RubricError, parse_version

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
CORRECTION_FILE = "correction.json"
_TITLES = {"spearman": "Spearman", "kendall": "Kendall τ-b", "kappa_quadratic": "κ quadratic"}


# ------------------------------------------------------------------------------------------ markdown
def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def with_ci(entry: Mapping[str, Any]) -> str:
    """A statistic's JSON entry as "value [low, high]", or why it is undefined (a table cell)."""
    if entry.get("value") is None:
        return f"undefined: {entry.get('undefined')}"
    ci = entry.get("ci95")
    return f"{entry['value']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{entry['value']:.3f} [CI undefined]"


def _agreement_table(dims: Mapping[str, Any]) -> list[str]:
    lines = ["| dimension | kind | n | " + " | ".join(f"{_TITLES[s]} [95% CI]" for s in STATISTICS) + " | flagged |",
             "|---|---|---|" + "---|" * len(STATISTICS) + "---|"]
    for dim_id, e in dims.items():
        flag = f"**yes**: {e['flag_reason']}" if e["flagged"] else "no"
        cells = [dim_id, e["kind"], e["n"], *(with_ci(e[s]) for s in STATISTICS), flag]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _bias_table(dims: Mapping[str, Any]) -> list[str]:
    present = {n for e in dims.values() for n in e["bias"].get("coefficients", {})}
    names = ["intercept", *(n for f in FEATURES for n in (f, f"{f}_z") if n in present)]
    lines = ["| dimension | target | n | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for dim_id, e in dims.items():
        bias = e["bias"]
        coefs = bias.get("coefficients", {})
        cells = []
        for name in names:
            if name in coefs:
                c = coefs[name]
                star = " *" if c["excludes_zero"] else ""
                cells.append(f"{c['coef']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]{star}")
            else:
                cells.append(bias.get("undefined") or "dropped (constant)")
        lines.append("| " + " | ".join(_cell(c) for c in [dim_id, bias["target"], bias["n"], *cells]) + " |")
    return lines


def _position_table(probe: Mapping[str, Any]) -> list[str]:
    lines = ["| dimension | n | mean shift (reversed − as written) [95% CI] | mean abs shift | changed share |",
             "|---|---|---|---|---|"]
    for dim_id, p in probe.items():
        if "undefined" in p:
            lines.append(f"| {_cell(dim_id)} | {p['n']} | undefined: {_cell(p['undefined'])} | – | – |")
            continue
        ci = p["mean_shift_ci95"]
        shift = f"{p['mean_shift']:+.3f} " + (f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "[CI undefined]")
        lines.append(f"| {_cell(dim_id)} | {p['n']} | {shift} | {p['mean_abs_shift']:.3f} | {p['changed_share']:.3f} |")
    return lines


def _group_position_table(bias: Mapping[str, Any]) -> list[str]:
    if not bias:
        return ["No group verdict was valid: no position to measure (see the agreement table's unscored items)."]
    lines = ["| dimension | samples | mean | mean by shown position − mean (position 1 first) "
             "| Spearman(score, position) |",
             "|---|---|---|---|---|"]
    for dim_id, b in bias.items():
        shifts = ", ".join(f"{p['position']}: {p['minus_mean']:+.3f} (n={p['n']})" for p in b["by_position"])
        rho = b["spearman_position"]
        rho_cell = f"{rho['value']:+.3f}" if rho["value"] is not None else f"undefined: {rho['undefined']}"
        lines.append(f"| {_cell(dim_id)} | {b['samples']} | {b['mean']:.3f} | {_cell(shifts)} | {_cell(rho_cell)} |")
    return lines


def _correction_table(dims: Mapping[str, Any]) -> list[str]:
    lines = ["| dimension | n | RMSE before | RMSE after | Spearman before | Spearman after |",
             "|---|---|---|---|---|---|"]
    for dim_id, e in dims.items():
        fit = e.get("correction")
        if fit is None:
            continue
        if "not_fitted" in fit:
            lines.append(f"| {_cell(dim_id)} | {fit['n']} | not fitted: {_cell(fit['not_fitted'])} | | | |")
            continue
        cells = [dim_id, fit["n"], _number(fit["rmse_before"]), _number(fit["rmse_after"]),
                 _number(fit["spearman_before"]["value"]), _number(fit["spearman_after"]["value"])]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _scores(value: float | list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in value) if isinstance(value, list) else f"{value:.3g}"


def _worst_tables(dims: Mapping[str, Any]) -> list[str]:
    lines = []
    for dim_id, e in dims.items():
        if not e["worst"]:
            continue
        scores = [k for k in e["worst"][0] if k not in ("source", "gap", "question", "response")]
        lines += ["", f"### {dim_id}", "", "| source | " + " | ".join(scores) + " | response |",
                  "|---|" + "---|" * len(scores) + "---|"]
        lines += ["| " + " | ".join(_cell(c) for c in [w["source"], *(_scores(w[k]) for k in scores), w["response"]])
                  + " |" for w in e["worst"]]
    return lines


def _pinned_section(pinned: Mapping[str, Any]) -> list[str]:
    """The (rubric, judge) pair the report measured: judge hash, spec fields, weights, rubrics."""
    judge = pinned["judge"]
    lines = ["## Judge and rubrics measured", "",
             f"Judge hash `{judge['hash']}` (prompt templates version {judge['prompt_version']}). A run, score or "
             "evaluation given `judge.calibration=` this report.json checks its own (rubric, judge) pair against "
             "these at start-up.", "", "| judge field | value |", "|---|---|"]
    lines += [f"| {_cell(k)} | {_cell(repr(v))} |" for k, v in judge["spec"].items()]
    lines += [f"| weights of {_cell(path)} | `{identity}` |" for path, identity in judge["weights"].items()]
    lines += ["", "| rubric | version | content hash | LLM dimensions |", "|---|---|---|---|"]
    lines += [f"| {_cell(r['name'])} | {r['version']} | `{r['content_hash']}` | {_cell(', '.join(r['dimensions']))} |"
              for r in pinned["rubrics"]]
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown tables: agreement, bias probes, position probe, correction, worst disagreements."""
    dims = report["dimensions"]
    boot = report["bootstrap"]
    length = report["features"]["length"]
    lines = [
        "# Calibration report", "",
        f"Compared with: {report['compared_with']} · {report['items']} items · flag: Spearman below "
        f"{report['threshold']} or undefined · 95% intervals from {boot['resamples']} bootstrap resamples "
        f"(seed {boot['seed']}).",
        "", f"Flagged dimensions: {', '.join(report['flagged']) or 'none'}.", "",
        *([*_pinned_section(report[PIN_FIELD]), ""] if report.get(PIN_FIELD) else []), "## Agreement", "",
        *_agreement_table(dims), "", "## Bias probes", "",
        "OLS coefficients in score points of the dimension's raw scale, with 95% t intervals; * marks an "
        "interval that excludes 0. `length_z` is per SD of length"
        + (f" (mean {length['mean']:.1f}, SD {length['sd']:.1f} text units)." if isinstance(length, dict) else "."),
        "", *_bias_table(dims),
    ]
    if report.get("position_probe"):
        lines += ["", "## Position probe", "", "Each LLM dimension scored with its anchors as written and "
                  "reversed (same nonces and sampling keys).", "", *_position_table(report["position_probe"])]
    if report.get("group_position_bias") is not None:
        lines += ["", "## Group position bias", "", "judge.layout=group: each valid sample's raw score by the "
                  "position its response was shown at in its group's prompt (a seeded shuffled order per sample).",
                  "", *_group_position_table(report["group_position_bias"])]
    if any("correction" in e for e in dims.values()):
        written = report.get("correction")
        where = (f"Written to `{written['path']}` (version {written['version']}); apply it with "
                 "`--config.data.rubric_correction=FILE`." if written
                 else "No dimension could be corrected; no file written.")
        lines += ["", "## Correction (fitted and measured on the same items)", "", where, "", *_correction_table(dims)]
    if report.get("redundancy"):
        lines += ["", *redundancy_section(report["redundancy"])]
    lines += ["", "## Worst disagreements", *_worst_tables(dims)]
    return "\n".join(lines) + "\n"


def redundancy_section(redundancy: Mapping[str, Any]) -> list[str]:
    """Pairwise Spearman of the dimensions, per score source (labels, judge), flagged pairs first."""
    lines = ["## Redundancy (pairwise Spearman of dimensions, RubricRL 2.1 MECE)", ""]
    for source, entry in redundancy.items():
        flagged = ", ".join(f"{a} and {b}" for a, b in entry["flagged"]) or "none"
        lines += [f"Scores of the {source}: flagged at Spearman ≥ {entry['threshold']}: {flagged}.", "",
                  "| a | b | n | Spearman | flagged |", "|---|---|---|---|---|"]
        for pair in entry["pairs"]:
            value = f"{pair['spearman']:.3f}" if pair["spearman"] is not None else f"undefined: {pair['undefined']}"
            cells = [pair["a"], pair["b"], pair["n"], value, "**yes**" if pair["flagged"] else "no"]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return lines[:-1]


def compare_markdown(report: Mapping[str, Any]) -> str:
    """A rubric comparison (calibration/compare.py) as Markdown: A and B side by side, then B − A per statistic."""
    boot = report["bootstrap"]
    lines = ["# Rubric comparison", "",
             f"A = `{report['rubrics']['a']}`, B = `{report['rubrics']['b']}` · {report['items']} labelled items · "
             f"95% intervals from {boot['resamples']} bootstrap resamples (seed {boot['seed']}); the difference "
             "B − A resamples the same items for both.", ""]
    for side in ("a", "b"):
        if report["only_in"][side]:
            lines += [f"Only in {side.upper()} (not compared): {', '.join(report['only_in'][side])}.", ""]
    lines += ["| dimension | n | statistic | A [95% CI] | B [95% CI] | B − A [95% CI] | verdict |",
              "|---|---|---|---|---|---|---|"]
    for dim_id, e in report["dimensions"].items():
        for name in report["statistics"]:
            diff = e[f"{name}_difference"]
            cells = [dim_id, e["n"], _TITLES[name], with_ci(e["a"][name]), with_ci(e["b"][name]), with_ci(diff),
                     diff["verdict"]]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", *redundancy_section({f"rubric {side.upper()}'s judge": report["redundancy"][side]
                                       for side in ("a", "b")})]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ plots
def plot_dimension(dim_id: str, data: PlotData, seed: int = 0) -> bytes:
    """PNG: confusion matrix of the scores rounded to the levels (counts) and a jittered scatter."""
    levels = np.asarray(data.levels)
    fig = Figure(figsize=(10, 4.5))
    ax_counts, ax_scatter = fig.subplots(1, 2)
    x_idx = np.clip(np.searchsorted(levels, np.floor(data.x_n + 0.5)), 0, len(levels) - 1)
    y_idx = np.clip(np.searchsorted(levels, np.floor(data.y_n + 0.5)), 0, len(levels) - 1)
    counts_LxL = np.zeros((len(levels), len(levels)), dtype=np.int64)
    np.add.at(counts_LxL, (y_idx, x_idx), 1)
    ax_counts.imshow(counts_LxL, origin="lower", cmap="Blues")
    for (i, j), count in np.ndenumerate(counts_LxL):
        dark = count > counts_LxL.max() / 2
        ax_counts.text(j, i, str(count), ha="center", va="center", fontsize=8, color="white" if dark else "black")
    ax_counts.set_xticks(range(len(levels)), [str(v) for v in levels])
    ax_counts.set_yticks(range(len(levels)), [str(v) for v in levels])
    ax_counts.set_xlabel(data.x_name)
    ax_counts.set_ylabel(data.y_name)
    ax_counts.set_title(f"{dim_id}: counts (rounded to levels)")
    rng = np.random.default_rng(seed)
    jitter = 0.08 * (levels[-1] - levels[0])
    ax_scatter.scatter(data.x_n + rng.uniform(-jitter, jitter, data.x_n.shape),
                       data.y_n + rng.uniform(-jitter, jitter, data.y_n.shape), s=10, alpha=0.5)
    ax_scatter.plot([levels[0], levels[-1]], [levels[0], levels[-1]], color="gray", linewidth=1)
    ax_scatter.set_xlabel(data.x_name)
    ax_scatter.set_ylabel(data.y_name)
    ax_scatter.set_title(f"{dim_id}: scores (jittered)")
    ax_scatter.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------ files
def versioned(correction: Correction, path: Path) -> Correction:
    """`correction` with version 1.0.0, or the next major version of the correction already at `path`."""
    if not path.exists():
        return correction
    try:
        old = load_correction(path)
    except RubricError as e:
        raise RubricError(f"{path}: exists and is not a correction file; refusing to overwrite it ({e})") from None
    if old.content_hash == correction.content_hash:
        return dataclasses.replace(correction, version=old.version)
    return dataclasses.replace(correction, version=f"{parse_version(old.version)[0] + 1}.0.0")


def _is_correction(path: Path) -> bool:
    try:
        load_correction(path)
    except (RubricError, OSError, ValueError):
        return False
    return True


def write_outputs(out_dir: Path, files: Mapping[Path, str | bytes], protected: Collection[Path] = ()) -> list[Path]:
    """Writes `files` (DIR/report.json last, DIR/report.json removed first) and removes the earlier outputs in
    `out_dir` they do not replace: DIR/correction.json (when it is a correction file) and DIR/plots/*.png. Paths in
    `protected` (the command's inputs) are never removed. Returns the paths written."""
    report_json = out_dir / REPORT_JSON
    keep = {p.resolve() for p in [*files, *protected]}
    stale = [p for p in sorted((out_dir / PLOTS_DIR).glob("*.png")) if p.resolve() not in keep]
    if (out_dir / CORRECTION_FILE).resolve() not in keep and _is_correction(out_dir / CORRECTION_FILE):
        stale.append(out_dir / CORRECTION_FILE)
    report_json.unlink(missing_ok=True)
    written = [write_atomic(path, content) for path, content in files.items() if path != report_json]
    for path in stale:
        path.unlink(missing_ok=True)
    return [*written, write_atomic(report_json, files[report_json])]


def write_comparison(report: Mapping[str, Any], out_dir: str | Path, protected: Collection[Path] = ()) -> list[Path]:
    """DIR/report.md and DIR/report.json of a rubric comparison, replacing an earlier calibration's outputs."""
    out_dir = Path(out_dir)
    files = {out_dir / REPORT_MD: compare_markdown(report),
             out_dir / REPORT_JSON: json.dumps(report, ensure_ascii=False, indent=2, allow_nan=False) + "\n"}
    return write_outputs(out_dir, files, protected)


def write_calibration(calibration: Calibration, out_dir: str | Path, correction_path: str | Path | None = None,
                      seed: int = 0, protected: Collection[Path] = ()) -> list[Path]:
    """Plots, the correction (default DIR/correction.json), report.md and last report.json (write_outputs); the
    paths written. Every file is rendered before the first is written, so a bad input leaves the previous files."""
    out_dir = Path(out_dir)
    files: dict[Path, str | bytes] = {out_dir / PLOTS_DIR / f"{dim_id}.png": plot_dimension(dim_id, data, seed)
                                      for dim_id, data in calibration.plots.items()}
    report = dict(calibration.report)
    if calibration.correction is not None:
        path = Path(correction_path) if correction_path else out_dir / CORRECTION_FILE
        correction = versioned(calibration.correction, path)
        files[path] = dumps_correction(correction, "json" if path.suffix.lower() == ".json" else "yaml")
        report["correction"] = {**report["correction"], "path": str(path), "version": correction.version}
    files[out_dir / REPORT_MD] = markdown(report)
    files[out_dir / REPORT_JSON] = json.dumps(report, ensure_ascii=False, indent=2, allow_nan=False) + "\n"
    return write_outputs(out_dir, files, protected)
