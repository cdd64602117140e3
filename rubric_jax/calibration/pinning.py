"""Calibration pinned to (rubric, judge): what experiments.calibrate records about the pair it measured, and the
start-up check of run, score and evaluate (`judge.calibration=PATH`) against it.

A dimension's verdicts depend on the judge (its hash: judges/spec.py) and on what the judge reads of the rubric:
the dimension itself in per_dimension mode, every LLM dimension of the rubric in all_criteria mode (one prompt
lists them all). That text is pinned per dimension (`dimension_key`: its fields except the aggregation-only
weight, gate and group), so a case-wise rubric that adds rule dimensions to a calibrated shared one keeps its
calibration, and an edited anchor loses it. The check prints one line per LLM dimension: calibrated (with its
Spearman), flagged (Spearman below the report's threshold), or not the calibrated pair, naming each difference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rubric_jax.judges.spec import (FIELD_DEFAULTS, HASHED_OFF_DEFAULT, JudgeSpec, describe, verdict_fields,
                                    weights_identity)
from rubric_jax.rubrics.schema import Dimension, Rubric, canonical_json, dimension_to_dict

PIN_FIELD = "pinned"  # report.json's section: {"judge": spec.describe(...), "rubrics": [...]}
# Why a run's judge.share_policy_base judge matches no report, and what a report of its base can still tell.
SHARED_BASE_UNPINNED = (
    "a judge sharing the policy's base is pinned to no report: calibrate cannot run it, and its hash names the run's "
    "base, not a directory. A report of that base loaded as a judge measured the same verdicts if the base is that "
    "checkpoint (no SFT stage before GRPO) in the same dtypes: read it as evidence with judge.require_calibration "
    "off, and audit the run with config.audit.judge")
_AGGREGATION_ONLY = ("weight", "gate", "group")  # dimension fields the judge never reads


def dimension_key(rubric: Rubric, dim: Dimension, mode: str) -> str:
    """sha256 hex of what the judge reads of `rubric` when it scores `dim` in `mode`."""
    llm = [dim] if mode == "per_dimension" else [d for d in rubric.dimensions if d.judged]
    read = [{k: v for k, v in dimension_to_dict(d).items() if k not in _AGGREGATION_ONLY} for d in llm]
    return hashlib.sha256(canonical_json(read).encode()).hexdigest()


def _llm_rubrics(rubrics: Sequence[Rubric]) -> list[Rubric]:
    """The distinct rubrics with an LLM dimension, in first-seen order."""
    seen = {r.content_hash: r for r in rubrics if any(d.judged for d in r.dimensions)}
    return list(seen.values())


def pair_record(spec: JudgeSpec, rubrics: Sequence[Rubric]) -> dict[str, Any]:
    """report.json's PIN_FIELD: the judge (hash, every spec field, weights identities) and each rubric with LLM
    dimensions (name, version, content hash, and the dimension_key of each LLM dimension)."""
    return {"judge": describe(spec), "rubrics": [
        {"name": r.name, "version": r.version, "content_hash": r.content_hash,
         "dimensions": {d.id: dimension_key(r, d, spec.mode) for d in r.dimensions if d.judged}}
        for r in _llm_rubrics(rubrics)]}


def judge_differences(spec: JudgeSpec, recorded: dict[str, Any]) -> list[str]:
    """What differs between `spec` and the judge a report recorded, one phrase each ("max_new_tokens 64 != 256
    in report.json", "weights of DIR changed"); empty when the judge hashes agree. A judge sharing the policy's
    base differs from every report (SHARED_BASE_UNPINNED says why and what to do)."""
    if spec.share_policy_base:
        return [SHARED_BASE_UNPINNED]
    diffs = []
    # A field hashed only off its default is compared always: a report from before it existed had the default.
    fields = {**verdict_fields(spec), **{name: getattr(spec, name) for name in HASHED_OFF_DEFAULT}}
    old_fields = {**{name: FIELD_DEFAULTS[name] for name in HASHED_OFF_DEFAULT}, **recorded.get("spec", {}),
                  "prompt_version": recorded.get("prompt_version")}
    if "cascade" in old_fields:  # the spec block nests the refining judge; its hash is what verdict_fields holds
        old_fields["cascade"] = (recorded.get("cascade") or {}).get("hash", "")
    for name, value in fields.items():
        if name in old_fields and old_fields[name] != value:
            diffs.append(f"{name} {value!r} != {old_fields[name]!r} in report.json")
    old_weights = list(recorded.get("weights", {}).items())
    if len(old_weights) != len(spec.checkpoints):
        diffs.append(f"judge checkpoint(s) {list(spec.checkpoints)} != {[p for p, _ in old_weights]} in report.json")
    else:
        for path, (old_path, old_identity) in zip(spec.checkpoints, old_weights):
            if weights_identity(path) != old_identity:
                diffs.append(f"weights of {path} changed" if Path(path).resolve() == Path(old_path).resolve()
                             else f"weights of {path} != those of {old_path} in report.json")
    return diffs


@dataclasses.dataclass(frozen=True)
class DimensionStatus:
    """One LLM dimension of the rubrics in use against the report: calibrated or not, why, its Spearman."""

    dimension: str
    rubric: str  # "name version" of the first rubric in use that has it with this text
    calibrated: bool  # this (judge, dimension text) pair is the one the report measured
    flagged: bool  # calibrated, but below the report's threshold (or its Spearman undefined)
    spearman: float | None
    differences: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.calibrated and not self.flagged

    def line(self, threshold: float) -> str:
        head = f"calibration: {self.dimension} (rubric {self.rubric}): "
        rho = "undefined" if self.spearman is None else f"{self.spearman:.3f}"
        if not self.calibrated:
            return head + "NOT the calibrated (rubric, judge) pair: " + "; ".join(self.differences)
        if self.flagged:
            return head + f"calibrated pair, but flagged: Spearman {rho} < {threshold}"
        return head + f"calibrated pair, Spearman {rho}"


@dataclasses.dataclass(frozen=True)
class CalibrationCheck:
    """The start-up check of a command's (rubrics, judge) against a calibration report."""

    report: str
    report_sha256: str
    judge_hash: str
    threshold: float
    dimensions: tuple[DimensionStatus, ...]

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.dimensions)

    def lines(self) -> list[str]:
        """One line per LLM dimension, for the command's start-up output."""
        return [d.line(self.threshold) for d in self.dimensions] or [
            f"calibration: no LLM-judged dimension in use; {self.report} covers nothing here"]

    def record(self) -> dict[str, Any]:
        """What a run records of it (rubric.json): the report, its sha256 and the status of each LLM dimension
        (one entry per distinct text of a dimension id: the tiny default words politeness in two languages)."""
        return {"report": self.report, "report_sha256": self.report_sha256, "judge_hash": self.judge_hash,
                "covered": self.ok, "dimensions": [{**dataclasses.asdict(d), "differences": list(d.differences)}
                                                   for d in self.dimensions]}


def _read_report(path: str, where: str) -> tuple[dict[str, Any], bytes]:
    try:
        raw = Path(path).read_bytes()
        report = json.loads(raw)
    except OSError as e:
        raise ValueError(f"{where}.calibration={path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise ValueError(f"{where}.calibration={path}: not a calibration report.json ({e})") from None
    if not isinstance(report, dict) or not isinstance(report.get("dimensions"), dict):
        raise ValueError(f"{where}.calibration={path}: not a calibration report.json (no 'dimensions')")
    return report, raw


def check_calibration(spec: JudgeSpec, rubrics: Sequence[Rubric], where: str = "judge") -> CalibrationCheck | None:
    """The status of every LLM dimension of `rubrics` against `spec.calibration` (None when it is ""); a
    missing or unreadable report is a ValueError naming `<where>.calibration`. With `require_calibration`, a
    dimension that is not ok is a ValueError too (the caller exits 2 before any work)."""
    if not spec.calibration:
        return None
    report, raw = _read_report(spec.calibration, where)
    pinned = report.get(PIN_FIELD) or {}
    judge_hash = describe(spec)["hash"]
    recorded_judge = pinned.get("judge")
    if recorded_judge is None:
        judge_diffs = ["report.json records no judge (made before calibrations were pinned; calibrate again)"]
    elif recorded_judge.get("hash") == judge_hash:
        judge_diffs = []
    else:
        judge_diffs = judge_differences(spec, recorded_judge) or [
            f"judge hash {judge_hash[:12]}… != {recorded_judge.get('hash', '')[:12]}… in report.json"]
    recorded_rubrics = pinned.get("rubrics", [])
    statuses, seen = [], set()
    for rubric in _llm_rubrics(rubrics):
        for dim in (d for d in rubric.dimensions if d.judged):
            key = dimension_key(rubric, dim, spec.mode)
            if (dim.id, key) in seen:
                continue
            seen.add((dim.id, key))
            diffs = list(judge_diffs)
            entry = report["dimensions"].get(dim.id)
            if entry is None:
                diffs.append(f"dimension {dim.id!r} is not in report.json")
            elif not any(r.get("dimensions", {}).get(dim.id) == key for r in recorded_rubrics):
                diffs.append(_rubric_difference(rubric, dim, recorded_rubrics))
            spearman = (entry or {}).get("spearman", {}).get("value")
            statuses.append(DimensionStatus(dim.id, f"{rubric.name} {rubric.version}", not diffs,
                                            bool((entry or {}).get("flagged")), spearman, tuple(diffs)))
    check = CalibrationCheck(spec.calibration, hashlib.sha256(raw).hexdigest(), judge_hash,
                             float(report.get("threshold", 0.6)), tuple(statuses))
    if spec.require_calibration and not check.ok:
        bad = [d.line(check.threshold).removeprefix("calibration: ") for d in check.dimensions if not d.ok]
        raise ValueError(f"{where}.require_calibration=True: {spec.calibration} does not cover "
                         f"{len(bad)} LLM dimension(s): " + " | ".join(bad))
    return check


def _rubric_difference(rubric: Rubric, dim: Dimension, recorded: Sequence[dict[str, Any]]) -> str:
    """Why the text the judge reads for `dim` is not the calibrated one, naming rubric versions and hashes."""
    same_name = [r for r in recorded if r.get("name") == rubric.name and dim.id in r.get("dimensions", {})]
    other = (same_name or [r for r in recorded if dim.id in r.get("dimensions", {})] or [{}])[0]
    if not other:
        return f"rubric {rubric.name!r} {rubric.version} is not in report.json"
    return (f"rubric {rubric.name} {rubric.version} hash {rubric.content_hash[:12]}… != {other.get('name')} "
            f"{other.get('version')} hash {str(other.get('content_hash'))[:12]}… in report.json (dimension "
            f"{dim.id!r} reads differently)")
