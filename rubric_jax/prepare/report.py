"""report.md: the prepare_data report (report.json) as tables a person reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_PAIRS_SHOWN = 20


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _counts_by_split(coverage: Mapping[str, Any], key: str, splits: Sequence[str]) -> str:
    values = sorted({v for s in splits for v in coverage[s][key]})
    return _table([key, *splits], [[v, *(coverage[s][key].get(v, 0) for s in splits)] for v in values])


def render(report: Mapping[str, Any]) -> str:
    """The whole report as markdown."""
    splits = ("train", "eval", "golden")
    dedup, mix, pii, difficulty = report["dedup"], report["mix"], report["pii"], report["difficulty"]
    out = [f"# Prepared questions: {report['name']} (version {report['version']})", "",
           f"Read it with `--config.data.tfds_dir={report['out']} --config.data.train=tfds:{report['name']}` "
           f"(`:eval`, `:golden` for the other splits).", "",
           "## Inputs", "", _table(["input", "rows", "notes"], [
               [n["input"], n["rows"], ", ".join(f"{k}: {v}" for k, v in n.items() if k not in ("input", "rows"))]
               for n in report["inputs"]]), "",
           "## Steps", "", _table(["step", "in", "out", "details"], [
               [s["step"], s["in"], s["out"], ", ".join(f"{k} {v}" for k, v in s.items() if k not in ("step", "in", "out"))]
               for s in report["steps"]]), "",
           "## PII replaced (question and reference)", "",
           f"{pii['rows_changed']} rows changed.", "",
           _table(["kind", "replacements"], sorted(pii["by_kind"].items())), "",
           "## Duplicates", "",
           f"Character {dedup['ngram']}-grams, Jaccard >= {dedup['threshold']}; MinHash {dedup['num_perm']} "
           f"functions (seed {dedup['seed']}), LSH {dedup['lsh_bands']} bands x {dedup['lsh_rows']} rows, each "
           f"candidate checked by its exact Jaccard. Removed {dedup['exact_removed']} exact and "
           f"{dedup['near_removed']} near duplicates.", ""]
    if dedup["pairs"]:
        shown = dedup["pairs"][:MAX_PAIRS_SHOWN]
        out += [_table(["kept", "removed", "kind", "Jaccard", "MinHash estimate"],
                       [[p["kept_id"], p["removed_id"], p["kind"], p["jaccard"], p["jaccard_estimate"]] for p in shown]),
                ""]
        if len(dedup["pairs"]) > len(shown):
            out += [f"({len(dedup['pairs']) - len(shown)} more in report.json)", ""]
    semantic = dedup.get("semantic")
    if semantic is not None:
        model = (f"; embedding cosine >= {semantic['cosine_threshold']} of {semantic['model']}" if semantic["model"]
                 else "")
        out += [f"Semantic: content-word Jaccard >= {semantic['words_threshold']}{model}: removed "
                f"{len(semantic['pairs'])}.", ""]
        if semantic["pairs"]:
            shown = semantic["pairs"][:MAX_PAIRS_SHOWN]
            cells = [[p["kept_id"], p["removed_id"], p["signal"], p["word_jaccard"], p["cosine"]] for p in shown]
            out += [_table(["kept", "removed", "signal", "content-word Jaccard", "cosine"], cells), ""]
    out += ["## Difficulty", "", f"Labels from {difficulty['source']}: " +
            ", ".join(f"{k} {v}" for k, v in sorted(difficulty["counts"].items())) + ".", ""]
    if mix["ratio"] is not None:
        out += [_table(["difficulty", "ratio", "pool", "target", "achieved"],
                       [[d, r, mix["pool"].get(d, 0), mix["target"][d], mix["achieved"].get(d, 0)]
                        for d, r in mix["ratio"].items()]), ""]
    else:
        out += ["No difficulty mix (--config.difficulty_ratio=none).", ""]
    out += ["## Splits and coverage", "", _table(["split", "rows"], [[s, report["splits"][s]] for s in splits]), "",
            f"{len(report['held_out_leaks'])} near-duplicate pairs across splits found after the split (exact "
            "Jaccard); the eval or training row of each was dropped (golden rows are kept).", ""]
    coverage = report["coverage"]
    for key in ("category", "lang", "difficulty", "input_kind"):
        out += [_counts_by_split(coverage, key, splits), ""]
    missing = coverage["categories_missing_from_train"]
    out += [f"Categories with no training row: {', '.join(missing) if missing else 'none'}.", ""]
    return "\n".join(out)
