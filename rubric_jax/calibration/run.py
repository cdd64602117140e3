"""Calibration of a rubric's judges: score labelled responses with the training reward, measure agreement,
probe biases, fit a correction (RubricRL 3.2-3.3: Spearman/kappa per dimension, flag below 0.6).

  against="labels"  each labelled dimension: judge score (judges/reward.RubricReward, exactly as in
                    training, with its rule or LLM judge) vs the labels; bias regression of judge - label;
                    a linear correction fitted per dimension.
  against="judge"   raters vs raters: recorded `ratings` in the input (e.g. the three GPT-4 scores of
                    Prometheus' vicuna_eval.json), or else two or more judge checkpoints scoring the LLM
                    dimensions (one judge: two independent scoring passes, its samples against each other);
                    bias regression of the mean rating.
  position probe    with a judge, every LLM dimension is scored again with the anchor order as written and
                    reversed (bias.py).
  group position    with judge.layout=group, the scoring pass's samples by the position each response was shown at
                    in its group's prompt (bias.group_position_bias): report["group_position_bias"].

Judges arrive loaded (judges/loading.load_judges, in the decode layout); this package never
touches checkpoints.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import tqdm

from rubric_jax.calibration.agreement import Agreement, agreement, dimension_seed
from rubric_jax.calibration.bias import bias_regression, group_position_bias, position_shift, standardization
from rubric_jax.calibration.correction import fit_correction
from rubric_jax.calibration.labels import DimensionInfo, LabelledItem, dimension_info
from rubric_jax.calibration.pinning import PIN_FIELD, pair_record
from rubric_jax.calibration.redundancy import redundancy_report
from rubric_jax.judges.features import response_features
from rubric_jax.judges.llm_judge import Judge
from rubric_jax.judges.reward import RubricReward
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.judges.store import VerdictStore
from rubric_jax.rubrics.correction import Correction, FORMAT as CORRECTION_FORMAT
from rubric_jax.rubrics.schema import Rubric

AGAINST = ("labels", "judge")
REPORT_FORMAT = "rubric_jax.calibration_report"
EXCERPT_CHARS = 240
MAX_RESAMPLES = 100_000  # --config.bootstrap: percentile intervals settle long before; 1e9 would never finish


class CalibrationError(ValueError):
    """Inputs that cannot be calibrated as asked (no labels, no judge to compare, ...); one line."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """How to calibrate: what to compare against, the flag threshold, bootstrap size, seeds, batching."""

    against: str = "labels"  # "labels" (judge vs people) or "judge" (judge vs judge / sample vs sample)
    threshold: float = 0.6  # RubricRL 3.2: a dimension with Spearman below 0.6 needs its anchors rewritten
    num_resamples: int = 1000  # bootstrap resamples per interval
    seed: int = 0  # seeds judge sampling and the bootstrap
    batch_size: int = 64  # rows per reward call (one batched judge call each), whole questions (question_batches)
    position_probe: bool = True  # score LLM dimensions again with anchors as written and reversed
    worst: int = 5  # disagreements listed per dimension
    redundancy_threshold: float = 0.9  # two dimensions whose Spearman reaches this are flagged (RubricRL 2.1, MECE)

    def __post_init__(self) -> None:
        if self.against not in AGAINST:
            raise CalibrationError(f"against: expected one of {AGAINST}, got {self.against!r}")
        for field in ("threshold", "redundancy_threshold"):
            if not -1.0 <= getattr(self, field) <= 1.0:
                raise CalibrationError(f"{field}: expected a Spearman value in [-1, 1], got {getattr(self, field)!r}")
        for field, minimum in (("num_resamples", 1), ("batch_size", 1), ("worst", 0)):
            if getattr(self, field) < minimum:
                raise CalibrationError(f"{field}: expected an integer >= {minimum}, got {getattr(self, field)!r}")
        if self.num_resamples > MAX_RESAMPLES:
            raise CalibrationError(f"--config.bootstrap={self.num_resamples}: at most {MAX_RESAMPLES} resamples per interval")


@dataclasses.dataclass(frozen=True)
class PlotData:
    """What a dimension's plot shows: paired scores (x against y) on the dimension's levels."""

    x_name: str
    y_name: str
    x_n: np.ndarray
    y_n: np.ndarray
    levels: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The JSON report, the fitted correction (labels mode) and each dimension's plot data."""

    report: dict[str, Any]
    correction: Correction | None
    plots: dict[str, PlotData]


def question_batches(questions: Sequence[str], batch_size: int) -> list[list[int]]:
    """Row indices of each reward call: whole questions (all rows asking one, wherever they are in the file) packed in
    order of first appearance while a call holds at most `batch_size` rows, each call's rows in file order; a
    question with more rows is a call of its own. So a question's rows are never split across calls (in the group
    layout they are one group); a file of at most `batch_size` rows is one call, as before."""
    rows_of: dict[str, list[int]] = {}
    for n, question in enumerate(questions):
        rows_of.setdefault(question, []).append(n)
    batches: list[list[int]] = [[]]
    for rows in rows_of.values():
        if batches[-1] and len(batches[-1]) + len(rows) > batch_size:
            batches.append([])
        batches[-1] += rows
    return [sorted(rows) for rows in batches if rows]


def score_items(reward: RubricReward, items: Sequence[LabelledItem], batch_size: int, key: jax.Array,
                desc: str, store: VerdictStore | None = None, positions: list | None = None) -> dict[str, np.ndarray]:
    """Raw scores per dimension id [N] (NaN where the row's rubric lacks it or its judge failed), in calls of whole
    questions (`question_batches`) judged with one `key` (a judge prompt depends on its own content and the key, so
    `store` finds it); in the group layout (a group: a question's rows) `positions` gets each valid sample's shown
    position."""
    n = len(items)
    columns: dict[str, np.ndarray] = {}
    with tqdm.tqdm(total=n, desc=desc, unit="item", file=sys.stderr, mininterval=1.0) as bar:
        for rows in question_batches([i.question for i in items], batch_size):
            chunk = [items[r] for r in rows]
            out = reward([i.question for i in chunk], [i.response for i in chunk], [i.rubric for i in chunk],
                         key=key, store=store)
            raw_NxD = out.details["raw_scores"]
            for c, dim_id in enumerate(out.dimension_ids):
                column = columns.setdefault(dim_id, np.full((n,), np.nan))
                column[rows] = np.where(out.valid[:, c], raw_NxD[:, c], np.nan)
            if positions is not None:
                positions.extend(out.details.get("judge_group_positions", []))
            bar.update(len(chunk))
    return columns


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def _worst(items: Sequence[LabelledItem], rows: np.ndarray, gap_n: np.ndarray, scores: Mapping[str, np.ndarray],
           k: int) -> list[dict[str, Any]]:
    """The k items with the largest positive `gap_n`, with their scores and text excerpts."""
    order = np.argsort(-gap_n, kind="stable")[:k]
    return [{"source": items[rows[i]].source, "gap": float(gap_n[i]),
             **{name: np.asarray(values[i], dtype=np.float64).tolist() for name, values in scores.items()},
             "question": _excerpt(items[rows[i]].question), "response": _excerpt(items[rows[i]].response)}
            for i in order if gap_n[i] > 0]


def _flag(result: Agreement, threshold: float) -> tuple[bool, str | None]:
    rho = result.values["spearman"]
    if not rho.defined:
        return True, f"spearman undefined: {rho.undefined}"
    if rho.value < threshold:
        return True, f"spearman {rho.value:.3f} < {threshold}"
    return False, None


def _dimension_entry(info: DimensionInfo, result: Agreement, settings: Settings, **extra: Any) -> dict[str, Any]:
    flagged, reason = _flag(result, settings.threshold)
    return {"kind": info.kind, "scale": list(info.scale), **result.to_json(), "flagged": flagged,
            "flag_reason": reason, **extra}


def _rubrics(items: Sequence[LabelledItem]) -> list[Rubric]:
    """The distinct rubrics of the items (each built into the reward once)."""
    return list({item.rubric.content_hash: item.rubric for item in items}.values())


def _against_labels(items: Sequence[LabelledItem], info: Mapping[str, DimensionInfo], settings: Settings,
                    reward: RubricReward, key: jax.Array, features: Mapping[str, np.ndarray],
                    standardize: Mapping[str, tuple[float, float]], store: VerdictStore | None,
                    positions: list | None = None) -> tuple[dict, dict, dict, dict]:
    """Per labelled dimension: report entry and plot data; plus the judge and label columns (and, group layout,
    each valid sample's shown position into `positions`)."""
    judge = score_items(reward, items, settings.batch_size, key, "calibrate: scoring", store, positions)
    labels = {d: np.array([item.labels.get(d, np.nan) for item in items]) for d in info
              if any(d in item.labels for item in items)}
    if not labels:
        raise CalibrationError("against=labels: no row has 'labels' (use --config.against=judge for recorded ratings)")
    entries, plots = {}, {}
    for dim_id, label_N in labels.items():
        judge_N = judge[dim_id]
        rows = np.flatnonzero(~(np.isnan(judge_N) | np.isnan(label_N)))
        result = agreement([judge_N[rows], label_N[rows]], info[dim_id].levels, num_resamples=settings.num_resamples,
                           seed=dimension_seed(settings.seed, dim_id))
        gap_n = np.abs(judge_N[rows] - label_N[rows])
        entries[dim_id] = _dimension_entry(
            info[dim_id], result, settings,
            unscored=int((~np.isnan(label_N) & np.isnan(judge_N)).sum()),
            worst=_worst(items, rows, gap_n, {"judge": judge_N[rows], "label": label_N[rows]}, settings.worst),
            bias=bias_regression(judge_N[rows] - label_N[rows], features, standardize, rows, "judge - label"))
        plots[dim_id] = PlotData("label", "judge", label_N[rows], judge_N[rows], info[dim_id].levels)
    return entries, plots, judge, labels


def _rater_columns(
    items: Sequence[LabelledItem], settings: Settings, judges: Sequence[Judge], judge_spec: JudgeSpec,
    key: jax.Array, store: VerdictStore | None, refiners: Sequence[Judge] = (), positions: list | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, DimensionInfo], str]:
    """Rater scores [R, N] per dimension (NaN: not rated), their dimensions, and where the raters come from:
    the recorded ratings, else each judge's scoring pass (or two independent passes of a single judge)."""
    if any(item.ratings for item in items):
        info = {d: i for d, i in dimension_info(items).items() if any(d in item.ratings for item in items)}
        columns = {}
        for d in info:
            raters = next(len(item.ratings[d]) for item in items if d in item.ratings)
            columns[d] = np.array([item.ratings.get(d, (np.nan,) * raters) for item in items]).T
        return columns, info, "recorded ratings"
    if not judges:
        raise CalibrationError("against=judge: the rows have no 'ratings' and no judge checkpoint was given "
                               "(--judge.checkpoint)")
    info = dimension_info(items, llm_only=True)
    if not info:
        raise CalibrationError("against=judge: the rubrics have no LLM dimension for judges to disagree on")
    rubrics = _rubrics(items)
    if len(judges) >= 2:
        passes = [(RubricReward(rubrics, [j], judge_spec, refiners=refiners), key, j.name) for j in judges]
        source = "one scoring pass per judge: " + ", ".join(j.name for j in judges)
    else:
        reward = RubricReward(rubrics, judges, judge_spec, refiners=refiners)
        passes = [(reward, k, f"pass {i + 1}") for i, k in enumerate(jax.random.split(key, 2))]
        source = f"two independent scoring passes of {judges[0].name}"
    scored = [score_items(reward, items, settings.batch_size, k, f"calibrate: {name}", store, positions)
              for reward, k, name in passes]
    return {d: np.stack([s[d] for s in scored]) for d in info}, info, source


def _against_judge(items: Sequence[LabelledItem], settings: Settings, judges: Sequence[Judge],
                   judge_spec: JudgeSpec, refiners: Sequence[Judge], key: jax.Array, features: Mapping[str, np.ndarray],
                   standardize: Mapping[str, tuple[float, float]], store: VerdictStore | None,
                   positions: list | None = None) -> tuple[dict, dict, str, dict]:
    """Per dimension: rater agreement (mean over rater pairs), report entry and plot data; the raters' source;
    each dimension's mean rating per item (NaN where a rater lacks it)."""
    columns, info, source = _rater_columns(items, settings, judges, judge_spec, key, store, refiners, positions)
    entries, plots = {}, {}
    for dim_id, scores_RxN in columns.items():
        rows = np.flatnonzero(~np.isnan(scores_RxN).any(axis=0))
        rated_RxN = scores_RxN[:, rows]
        result = agreement(list(rated_RxN), info[dim_id].levels, num_resamples=settings.num_resamples,
                           seed=dimension_seed(settings.seed, dim_id))
        spread_n = rated_RxN.max(axis=0) - rated_RxN.min(axis=0)
        entries[dim_id] = _dimension_entry(
            info[dim_id], result, settings, raters=int(scores_RxN.shape[0]),
            unscored=int(np.isnan(scores_RxN).any(axis=0).sum()),
            worst=_worst(items, rows, spread_n, {"ratings": rated_RxN.T}, settings.worst),
            bias=bias_regression(rated_RxN.mean(axis=0), features, standardize, rows, "mean rating"))
        pairs = [(i, j) for i in range(rated_RxN.shape[0]) for j in range(i + 1, rated_RxN.shape[0])]
        plots[dim_id] = PlotData("rater i", "rater j", np.concatenate([rated_RxN[i] for i, _ in pairs]),
                                 np.concatenate([rated_RxN[j] for _, j in pairs]), info[dim_id].levels)
    return entries, plots, source, {d: scores_RxN.mean(axis=0) for d, scores_RxN in columns.items()}


def _position_probe(items: Sequence[LabelledItem], settings: Settings, judges: Sequence[Judge],
                    judge_spec: JudgeSpec, key: jax.Array, store: VerdictStore | None,
                    refiners: Sequence[Judge] = ()) -> dict[str, dict[str, Any]]:
    """Per LLM dimension: the score shift when its anchors (and criteria, in multi mode) are reversed."""
    info = dimension_info(items, llm_only=True)
    rubrics = _rubrics(items)
    passes = {}
    for name, reverse in (("as written", False), ("reversed", True)):
        cascade = (None if judge_spec.cascade is None else
                   dataclasses.replace(judge_spec.cascade, shuffle_anchors=False, reverse_order=reverse))
        config = dataclasses.replace(judge_spec, shuffle_anchors=False, reverse_order=reverse, cascade=cascade)
        reward = RubricReward(rubrics, judges, config, refiners=refiners)
        passes[name] = score_items(reward, items, settings.batch_size, key, f"calibrate: anchors {name}", store)
    return {d: position_shift(passes["as written"][d], passes["reversed"][d], num_resamples=settings.num_resamples,
                              seed=dimension_seed(settings.seed, d)) for d in info}


def calibrate(items: Sequence[LabelledItem], settings: Settings, *, judges: Sequence[Judge] = (),
              judge_spec: JudgeSpec = JudgeSpec(), correction: Correction | None = None,
              inputs: Mapping[str, Any] | None = None, store: VerdictStore | None = None,
              refiners: Sequence[Judge] = ()) -> Calibration:
    """Scores, compares and probes `items` as `settings` say; the report, a fitted correction and plot data.

    `correction` (an existing one) is applied when scoring, so a correction can be checked on new labels.
    The judges read and write `store` (judges/store.py): a re-run asks them only what changed. `refiners` are
    the loaded judges of `judge_spec.cascade` (loading.load_cascade), calibrated with the judge they refine.
    """
    key = jax.random.key(settings.seed)
    features = response_features([item.response for item in items])
    standardize = standardization(features)
    fitted, fit_reports = None, {}
    positions = [] if judge_spec.layout == "group" and judges else None  # the scoring pass's shown positions
    if settings.against == "labels":
        reward = RubricReward(_rubrics(items), judges, judge_spec, correction=correction, refiners=refiners)
        info = dimension_info(items)
        entries, plots, judge_cols, label_cols = _against_labels(
            items, info, settings, reward, jax.random.fold_in(key, 0), features, standardize, store, positions)
        provenance = {"labels": (inputs or {}).get("labels"), "judges": [j.name for j in judges],
                      "items": {d: entries[d]["n"] for d in entries}}
        fitted, fit_reports = fit_correction(judge_cols, label_cols, info, features, standardize,
                                             version="1.0.0", provenance=provenance)
        for dim_id, fit in fit_reports.items():
            entries[dim_id]["correction"] = fit
        source = "labels"
        redundancy = {"labels": redundancy_report(label_cols, settings.redundancy_threshold),
                      "judge": redundancy_report(judge_cols, settings.redundancy_threshold)}
    else:
        entries, plots, source, ratings = _against_judge(items, settings, judges, judge_spec, refiners,
                                                         jax.random.fold_in(key, 0), features, standardize, store,
                                                         positions)
        redundancy = {"mean rating": redundancy_report(ratings, settings.redundancy_threshold)}
    probe = None
    if settings.position_probe and judges and dimension_info(items, llm_only=True):
        probe = _position_probe(items, settings, judges, judge_spec, jax.random.fold_in(key, 1), store, refiners)
    report = {
        "format": REPORT_FORMAT, "format_version": 2, "against": settings.against, "compared_with": source,
        "items": len(items), "threshold": settings.threshold,
        "bootstrap": {"resamples": settings.num_resamples, "confidence": 0.95, "seed": settings.seed,
                      "method": "percentile, paired resamples of items"},
        "inputs": {**(inputs or {}), "judges": [j.name for j in judges],
                   "correction_applied": correction.content_hash if correction is not None else None},
        PIN_FIELD: pair_record(judge_spec, _rubrics(items)),
        "features": {"length": {"mean": standardize["length"][0], "sd": standardize["length"][1]}
                     if "length" in standardize else "constant"},
        "flagged": sorted(d for d, e in entries.items() if e.get("flagged")),
        "dimensions": entries,
        "position_probe": probe,
        "redundancy": redundancy,
    }
    if positions is not None:
        report["group_position_bias"] = group_position_bias(positions)
    if fitted is not None:
        report["correction"] = {"format": CORRECTION_FORMAT, "content_hash": fitted.content_hash,
                                "dimensions": sorted(fitted.dimensions)}
    return Calibration(report, fitted, plots)
