"""What an evaluation leaves in `--out`: records.jsonl, summary.json, table.md, plot.png, each written
atomically (a temporary file in the same directory, then `os.replace`), so a reader never sees half a
file and an interrupted run leaves the previous files intact.

  records.jsonl  one JSON object per case: id, prompt, response, finish reason, judge scores, and the
                 benchmark's per-case numbers (records carry null, never NaN)
  summary.json   the benchmark's scores plus what produced them (policy, judge, data, counts)
  table.md       the scores as a markdown table, with notes on what was left out
  plot.png       a bar chart of the scores (a length scatter for LongBench-Write)
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rubric_jax.evaluation.results import BarChart, BenchmarkResult, ScatterChart
from rubric_jax.files import write_atomic

RECORDS, SUMMARY, TABLE, PLOT = "records.jsonl", "summary.json", "table.md", "plot.png"


def jsonl_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """One strict-JSON line per row (a NaN is a bug upstream and raises)."""
    return "".join(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n" for row in rows)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}" if math.isfinite(value) else "–"
    return str(value).replace("|", "\\|")


def markdown_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()) -> str:
    """A titled markdown table (floats to 2 decimals, missing values as '–') followed by its notes."""
    lines = [f"# {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def chart_png(chart: BarChart | ScatterChart) -> bytes:
    """The chart as PNG bytes (matplotlib's object API, no pyplot state)."""
    from matplotlib.figure import Figure  # imported here: only writing a report needs matplotlib

    fig = Figure(figsize=(max(6.0, 0.5 * len(getattr(chart, "labels", ())) + 2), 4.5))
    ax = fig.subplots()
    if isinstance(chart, BarChart):
        values = [math.nan if v is None else v for v in chart.values]
        errors = None if chart.errors is None else [0.0 if e is None else e for e in chart.errors]
        bars = ax.bar(range(len(values)), values, yerr=errors, capsize=3, color="#4c72b0")
        ax.bar_label(bars, labels=[_cell(v) for v in chart.values], fontsize=7, padding=2)
        ax.set_xticks(range(len(values)), chart.labels, rotation=35 if len(values) > 5 else 0, ha="right"
                      if len(values) > 5 else "center", fontsize=8)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_ylabel(chart.ylabel)
    else:
        x = [max(v, 1.0) for v in chart.x]  # log axes: a zero-length answer is drawn at 1
        y = [max(v, 1.0) for v in chart.y]
        ax.scatter(x, y, s=30, alpha=0.5, color="#c44e52")
        top = max(x + y)
        ax.plot([1.0, top], [1.0, top], "k--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(chart.xlabel)
        ax.set_ylabel(chart.ylabel)
    ax.set_title(chart.title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def write_report(out: Path, title: str, result: BenchmarkResult, summary: Mapping[str, Any],
                 records: Sequence[Mapping[str, Any]]) -> list[Path]:
    """Writes the four files into `out` (created if needed); every file is rendered before the first is written."""
    files = {
        RECORDS: jsonl_text(records),
        SUMMARY: json.dumps(summary, indent=2, ensure_ascii=False, allow_nan=False) + "\n",
        TABLE: markdown_table(title, result.table_headers, result.table_rows, result.notes),
        PLOT: chart_png(result.chart),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        write_atomic(out / name, content)
    return [out / name for name in files]
