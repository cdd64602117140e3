"""The one reward interface the trainer calls: rubric scoring of a batch of responses -> RewardOutput.

For N rows (question, response, that row's rubric; rubrics may differ per row, QuRL case-wise R*(q)):
  read             each dimension's judge sees the part of the response the dimension reads (`reads`:
                   the answer by default, the think text, or the whole response; rubric_jax/text.py), with
                   invisible characters removed: this is the one place training, experiments.score,
                   calibration and evaluation select what a judge reads;
  score            each dimension kind's registered scorer (judges/scorers.py) scores that kind's dimensions:
                   rule dimensions with rules.py, once per distinct rubric over its rows (vectorised over the
                   batch); LLM dimensions with llm_judge.py, every LLM dimension of every row in one batched pass;
  normalise        raw scale -> [0, 1], 1 = best (rubrics.schema.normalize_scores);
  aggregate        each row with its rubric's method, gates and weights (rubrics.aggregation).
Columns are the union of the rows' dimension ids in order of first appearance; valid[n, d] is False
where row n's rubric has no dimension d or its judge failed (score NaN). Every failed score is counted
per dimension and per cause (details["failure_causes"]: a rule's `failure_cause` such as
"regex_timeout", or the LLM judge's, such as "judge_prompt_too_long"). A rule dimension on a points
scale reports 1 = "criterion met", so a negative-points rule should detect the undesirable behaviour.

Too long to judge: an LLM score that is missing because its judge prompt does not fit the judge's context
(TOO_LONG, "judge_prompt_too_long": never sent, or refused by a served judge) scores the dimension's minimum
(normalised 0, the worst) and counts as valid in the reward, never renormalised away: padding a response past the
judge's context can only lower its reward. It is still a failed score (details["failures"], "failure_causes",
"num_failed_scores", the missing-score monitor) and is counted per dimension in details["scored_minimum"]; its raw
score stays NaN (details["raw_scores"] holds what the judges gave: calibration and benchmarks see no verdict).

The call is a pure function of its inputs plus `key` (used only for LLM judge sampling). Rubrics are
checked when the reward is built (unknown rule, bad rule params, an LLM dimension with no judge) and
again, once each, for any new rubric met at call time.

Gates first (`gates_first=True`; training's config.reward.gates_first): a row whose rule gate dimension
failed (normalised score 0, e.g. the format gate) has reward 0 whatever else it scores, so its LLM
dimensions are not sent to the judge: their scores are missing with cause GATED ("gated"), not counted as
failures (details["gated_scores"]), the row is ok with reward 0 exactly as aggregation gives it, and
details["judge_prompts_gated"] counts the first-round judge prompts saved. Off (the default here) for
score, evaluate and calibrate, which report every dimension's score.

With a cascade (`judge_spec.cascade`; judges/cascade.py), `refiners` are its refining judges (loading.load_cascade):
judge_rows re-judges with them the items the judges are uncertain of, and details["judge_cascade_*"] count it.

With a score `correction` (rubrics/correction.py, fitted by calibration), the raw scores of the dimensions
it names are de-biased before normalisation; details["uncorrected_raw_scores"] keeps the judges' own.

Multi-process: each process scores its own rows (the LLM judge is one global sharded computation, which
every process joins whenever any process has an LLM dimension to judge); `concat_outputs` then joins
the processes' outputs (`distributed.all_gather_objects`) into the output of scoring all rows at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from rubric_jax import distributed, text
from rubric_jax.judges.features import FEATURES, response_features
from rubric_jax.judges.http_backend import HTTP_COUNTERS, LATENCY_PERCENTILES
from rubric_jax.judges.llm_judge import Judge, escalated_frac
from rubric_jax.judges.scorers import Batch, Judging, scorers
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.judges.store import VerdictStore
from rubric_jax.rubrics.aggregation import aggregate_rubric
from rubric_jax.rubrics.correction import Correction
from rubric_jax.rubrics.schema import WEIGHT_RANGE, Dimension, Rubric, RubricError, normalize_scores, short_repr

# The cause of an LLM score not asked for (gates first): a rule gate of the row already failed.
GATED = "gated"
TOO_LONG = "judge_prompt_too_long"  # an LLM score whose prompt did not fit its judge: scored the minimum


@dataclasses.dataclass(frozen=True)
class RewardOutput:
    """Normalised scores [N, D] (NaN = missing), valid [N, D], reward [N] in [0, 1], column ids, metrics.

    details["reward_ok"] [N] bool marks rows whose reward means something (aggregation.py: a missing gate,
    or no scored dimension left, makes a row not ok and its reward 0); the trainer drops the others.
    details["raw_scores"] [N, D] holds the same scores on each dimension's own scale (NaN for a score too long to
    judge, which `scores` holds as 0: see "Too long to judge" above);
    details["failure_causes"] maps each dimension id with failed scores to {cause: count};
    details["scored_minimum"] maps each dimension id to its scores too long to judge.
    """

    scores: np.ndarray
    valid: np.ndarray
    reward: np.ndarray
    dimension_ids: list[str]
    details: dict[str, Any]


class Reward(Protocol):
    """The reward the trainer calls: N rows (question, response, rubric) -> RewardOutput; `key` drives any judge
    sampling, `weights` (dimension id -> weight) override the rubrics' weights. RubricReward and
    reward_model.RewardModelReward are the two."""

    def __call__(self, questions: Sequence[str], responses: Sequence[str], rubrics: Sequence[Rubric], *,
                 key: jax.Array | None = None, weights: Mapping[str, float] | None = None) -> RewardOutput:
        """Scores, validity and reward of the rows."""
        ...


class RubricReward:
    """Callable reward: `(questions, responses, rubrics, *, key=None, weights=None) -> RewardOutput`, composing the
    registered scorers (judges/scorers.py): it names no dimension kind."""

    def __init__(self, rubrics: Sequence[Rubric] = (), judges: Sequence[Judge] = (),
                 judge_spec: JudgeSpec = JudgeSpec(), correction: Correction | None = None,
                 gates_first: bool = False, refiners: Sequence[Judge] = ()):
        self.judges = tuple(judges)
        self.refiners = tuple(refiners)  # the cascade's refining judges (loading.load_cascade), when judge_spec has one
        self.gates_first = gates_first
        self.judge_spec = judge_spec
        self.correction = correction
        self.judging = Judging(self.judges, judge_spec, self.refiners)
        unknown = sorted(set(correction.features) - set(FEATURES)) if correction is not None else []
        if unknown:
            raise RubricError(f"score correction: unknown features {unknown}; known: {list(FEATURES)}")
        self._prepared: dict[str, dict[str, Any]] = {}  # rubric content hash -> kind -> its scorer's `prepare`
        self._dimension_ids: set[str] = set()  # of every rubric met so far: what `weights` may name
        for rubric in rubrics:
            self.prepare(rubric)

    def prepare(self, rubric: Rubric) -> dict[str, Any]:
        """What each kind's scorer needs to score `rubric` (built once per rubric); raises RubricError naming
        rubric and dimension."""
        if not isinstance(rubric, Rubric):
            raise RubricError(f"reward: expected a Rubric, got {type(rubric).__name__}")
        cached = self._prepared.get(rubric.content_hash)
        if cached is not None:
            return cached
        of_kind: dict[str, list[Dimension]] = {}
        for dim in rubric.dimensions:
            if self.correction is not None:
                self.correction.check_dimension(dim.id, dim.scale.raw_range, f"rubric {rubric.name!r}")
            of_kind.setdefault(dim.kind, []).append(dim)
        built = {s.kind.name: s.prepare(rubric, of_kind[s.kind.name], self.judging)
                 for s in scorers() if s.kind.name in of_kind}
        self._prepared[rubric.content_hash] = built
        self._dimension_ids.update(rubric.dimension_ids)
        return built

    def _failed_gates(self, rubrics: Sequence[Rubric], raw_NxD: np.ndarray, column: Mapping[str, int]) -> np.ndarray:
        """[N] True where a gate dimension a non-deferred scorer scored failed (normalised score 0: aggregation
        then sets the reward to 0 whatever the other dimensions score). Gates a score correction names are
        left out: their final score is known only after correction."""
        failed_N = np.zeros(raw_NxD.shape[0], dtype=bool)
        corrected = set(self.correction.dimensions) if self.correction is not None else set()
        scored_first = {s.kind.name for s in scorers() if not s.deferred}
        for rows, rubric in _groups(rubrics):
            gates = [d for d in rubric.dimensions if d.gate and d.kind in scored_first and d.id not in corrected]
            if gates:
                scores = normalize_scores(gates, raw_NxD[np.ix_(rows, [column[d.id] for d in gates])])
                failed_N[rows] = (scores <= 0).any(axis=1)  # NaN (missing) is not a failure
        return failed_N

    def _check_weights(self, weights: Mapping[str, float] | None) -> None:
        """Raises ValueError for a weight of a dimension no rubric met has, or one not a positive float32."""
        unknown = sorted(set(weights or {}) - self._dimension_ids)
        if unknown:
            raise ValueError(f"reward: weights for unknown dimension ids {unknown}; the rubrics have "
                             f"{sorted(self._dimension_ids)}")
        for dim_id, w in (weights or {}).items():  # aggregated in float32: no overflow, no underflow to 0
            if not 0 < w <= WEIGHT_RANGE[1] or np.float32(w) == 0:  # False for NaN too
                raise ValueError(f"reward: weight of dimension {dim_id!r}: expected a positive float32 number "
                                 f"up to {WEIGHT_RANGE[1]:g}, got {short_repr(w)}")

    def __call__(
        self,
        questions: Sequence[str],
        responses: Sequence[str],
        rubrics: Sequence[Rubric],
        *,
        key: jax.Array | None = None,
        weights: Mapping[str, float] | None = None,
        store: VerdictStore | None = None,
    ) -> RewardOutput:
        """Scores, validity and reward for N rows; `weights` (dimension id -> weight) overrides rubric weights;
        it may name any dimension of the rubrics this reward has met (the run's dynamic weights span them all,
        and a batch need not carry every case-wise dimension); the LLM judge reads and writes `store`
        (judges/store.py) when one is given."""
        n = len(responses)
        if not len(questions) == n == len(rubrics):
            raise ValueError(f"reward: {len(questions)} questions, {n} responses, {len(rubrics)} rubrics")
        for rubric in rubrics:
            self.prepare(rubric)
        ids = list(dict.fromkeys(dim_id for r in rubrics for dim_id in r.dimension_ids))
        column = {dim_id: c for c, dim_id in enumerate(ids)}
        self._check_weights(weights)
        has_NxD = np.zeros((n, len(ids)), dtype=bool)
        for i, rubric in enumerate(rubrics):
            has_NxD[i, [column[d] for d in rubric.dimension_ids]] = True
        raw_NxD, cause_NxD, gated_NxD, details = self._score(questions, responses, rubrics, column, key, store)
        if self.correction is not None:
            details["uncorrected_raw_scores"] = raw_NxD
            raw_NxD = self.correction.apply(ids, raw_NxD, response_features(responses))
        too_long_NxD = has_NxD & np.isnan(raw_NxD) & (cause_NxD == TOO_LONG)
        valid_NxD = (has_NxD & ~np.isnan(raw_NxD)) | too_long_NxD
        scores_NxD = np.full_like(raw_NxD, np.nan)
        reward_N = np.zeros((n,), dtype=np.float32)
        ok_N = np.zeros((n,), dtype=bool)
        used_weights: dict[str, float] = {}
        for rows, rubric in _groups(rubrics):
            cols = [column[dim_id] for dim_id in rubric.dimension_ids]
            sub_scores = np.where(too_long_NxD[np.ix_(rows, cols)], 0.0,
                                  normalize_scores(rubric, raw_NxD[np.ix_(rows, cols)]))
            scores_NxD[np.ix_(rows, cols)] = sub_scores
            weights_D = None
            if weights is not None:
                weights_D = np.asarray([weights.get(d.id, d.weight) for d in rubric.dimensions], np.float32)
                used_weights.update(zip(rubric.dimension_ids, weights_D.tolist()))
            reward_N[rows], ok_N[rows] = aggregate_rubric(rubric, sub_scores, valid_NxD[np.ix_(rows, cols)], weights_D)
        ok_N |= gated_NxD.any(axis=1)  # decided by a failed gate: reward 0, as aggregation gives it

        # A gated score is not asked for, not failed; one too long to judge failed, though it is scored (the minimum).
        missing_NxD = (has_NxD & ~valid_NxD & ~gated_NxD) | too_long_NxD
        missing_D = missing_NxD.sum(axis=0)
        causes: dict[str, dict[str, int]] = {}
        for i, c in zip(*np.nonzero(missing_NxD)):
            per_dim = causes.setdefault(ids[c], {})
            per_dim[cause_NxD[i, c]] = per_dim.get(cause_NxD[i, c], 0) + 1
        details.update({
            "reward_ok": ok_N,
            "raw_scores": raw_NxD,
            "rubric_hashes": [r.content_hash for r in rubrics],
            "failures": {dim_id: int(missing_D[c]) for c, dim_id in enumerate(ids)},
            "failure_causes": causes,
            "scored_minimum": {dim_id: int(n) for dim_id, n in zip(ids, too_long_NxD.sum(axis=0))},
            "num_failed_scores": int(missing_D.sum()),
            "num_not_ok": int((~ok_N).sum()),
            "gated_scores": int(gated_NxD.sum()),
        })
        if weights is not None:
            details["dynamic_weights"] = used_weights
        return RewardOutput(scores_NxD, valid_NxD, reward_N, ids, details)

    def _score(self, questions: Sequence[str], responses: Sequence[str], rubrics: Sequence[Rubric],
               column: Mapping[str, int], key: jax.Array | None, store: VerdictStore | None,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Raw scores [N, D] (NaN = missing), their causes, the gated cells and the scorers' counters: every
        registered scorer in turn, the deferred ones after the gates of the others are known (gates first)."""
        n = len(responses)
        raw_NxD = np.full((n, len(column)), np.nan)
        cause_NxD = np.full((n, len(column)), "", dtype=object)
        gated_NxD = np.zeros((n, len(column)), dtype=bool)  # deferred scores not asked for: a gate already failed
        details: dict[str, Any] = {}
        views = {reads: [text.read(r, reads) for r in responses] for reads in text.READS}
        gated_N: np.ndarray | None = None
        for scorer in scorers():
            dims = [[d for d in r.dimensions if d.kind == scorer.kind.name] for r in rubrics]
            if scorer.deferred and self.gates_first:
                if gated_N is None:
                    gated_N = self._failed_gates(rubrics, raw_NxD, column)
                for i in np.flatnonzero(gated_N):
                    gated_NxD[i, [column[d.id] for d in dims[i]]] = True
                    cause_NxD[i, [column[d.id] for d in dims[i]]] = GATED
                details.update(scorer.gated([ds if g else [] for ds, g in zip(dims, gated_N)], self.judging))
                dims = [[] if g else ds for ds, g in zip(dims, gated_N)]
            prepared = {r.content_hash: self._prepared[r.content_hash].get(scorer.kind.name) for r in rubrics}
            scored = scorer.score(Batch(questions, views, rubrics, dims, prepared, key, store), self.judging)
            for cells in scored.cells:
                block = np.ix_(list(cells.rows), [column[d.id] for d in cells.dims])
                raw_NxD[block] = cells.raw
                cause_NxD[block] = cells.causes
            details.update(scored.details)
        return raw_NxD, cause_NxD, gated_NxD, details


def _groups(rubrics: Sequence[Rubric]) -> list[tuple[list[int], Rubric]]:
    """The rows of each distinct rubric (by content hash), in order of first appearance."""
    groups: dict[str, tuple[list[int], Rubric]] = {}
    for i, rubric in enumerate(rubrics):
        groups.setdefault(rubric.content_hash, ([], rubric))[0].append(i)
    return list(groups.values())


# Judge counters that add up over the rows' blocks; "judge_generate_calls" (and the cascade's) counts the global
# (collective) calls every process joined, so the blocks share it.
_SUMMED_COUNTS = ("judge_prompts", "judge_invalid", "judge_retried", "judge_prompt_too_long", "judge_scores",
                  "judge_failed_samples", "judge_failed_scores", "judge_store_hits", "judge_store_mismatches",
                  "judge_store_unsaved", "judge_prompts_gated",
                  "sample_spread_count", "num_failed_scores", "num_not_ok", "gated_scores", "judge_cascade_screened",
                  "judge_cascade_escalated", "judge_cascade_prompts", "judge_cascade_store_hits",
                  "judge_cascade_failed_scores", *HTTP_COUNTERS)
# An HTTP judge's latency percentiles: the blocks' slowest (a percentile of the union is not kept).
_LATENCIES = tuple(f"judge_http_latency_p{q}_s" for q in LATENCY_PERCENTILES)
_SAMPLE_EXAMPLES = 5  # judge_invalid_examples kept (llm_judge keeps as many)


def _columns(part: RewardOutput, ids: Sequence[str], values_NxD: np.ndarray) -> np.ndarray:
    """`values_NxD` (columns `part.dimension_ids`) laid out on the columns `ids`: NaN where part has none."""
    out_NxD = np.full((values_NxD.shape[0], len(ids)), np.nan)
    out_NxD[:, [ids.index(d) for d in part.dimension_ids]] = values_NxD
    return out_NxD


def concat_outputs(parts: Sequence[RewardOutput]) -> RewardOutput:
    """The RewardOutput of scoring the rows of `parts` (consecutive blocks of one batch, e.g. one per
    process) in one call: rows concatenated, columns the union of ids in order of first appearance,
    counts summed, the judge's sample spread averaged over its scores."""
    if len(parts) == 1:
        return parts[0]
    ids = list(dict.fromkeys(d for p in parts for d in p.dimension_ids))
    valid_NxD = np.concatenate([_columns(p, ids, p.valid.astype(float)) == 1.0 for p in parts])
    details: dict[str, Any] = {
        "reward_ok": np.concatenate([np.asarray(p.details["reward_ok"], bool) for p in parts]),
        "raw_scores": np.concatenate([_columns(p, ids, p.details["raw_scores"]) for p in parts]),
        "rubric_hashes": [h for p in parts for h in p.details.get("rubric_hashes", [])],
        "failures": {d: sum(p.details["failures"].get(d, 0) for p in parts) for d in ids},
        "scored_minimum": {d: sum(p.details.get("scored_minimum", {}).get(d, 0) for p in parts) for d in ids},
        "failure_causes": {},
    }
    for p in parts:
        for dim_id, causes in p.details.get("failure_causes", {}).items():
            merged = details["failure_causes"].setdefault(dim_id, {})
            for cause, count in causes.items():
                merged[cause] = merged.get(cause, 0) + count
    keys = set().union(*(p.details for p in parts))
    details.update({k: sum(p.details.get(k, 0) for p in parts) for k in _SUMMED_COUNTS if k in keys})
    for k in ("judge_generate_calls", "judge_cascade_generate_calls"):
        if k in keys:
            details[k] = max(p.details.get(k, 0) for p in parts)
    if "judge_cascade_screened" in keys:
        details["judge_cascade_escalated_frac"] = escalated_frac(details)
    for k in (k for k in _LATENCIES if k in keys):
        measured = [p.details[k] for p in parts if k in p.details and not np.isnan(p.details[k])]
        details[k] = max(measured, default=float("nan"))
    if "judge_group_positions" in keys:  # the group layout's (dimension, position, size, score) of each valid sample
        details["judge_group_positions"] = [x for p in parts for x in p.details.get("judge_group_positions", [])]
    if "judge_invalid_examples" in keys:
        examples = [e for p in parts for e in p.details.get("judge_invalid_examples", [])]
        details["judge_invalid_examples"] = examples[:_SAMPLE_EXAMPLES]
    if "judge_sample_spread_mean" in keys:
        weighted = [(p.details["judge_sample_spread_mean"], p.details["sample_spread_count"]) for p in parts
                    if p.details.get("sample_spread_count")]
        total = sum(count for _, count in weighted)
        details["judge_sample_spread_mean"] = (sum(m * c for m, c in weighted) / total) if total else float("nan")
    if "uncorrected_raw_scores" in keys:
        details["uncorrected_raw_scores"] = np.concatenate(
            [_columns(p, ids, p.details["uncorrected_raw_scores"]) for p in parts])
    if "dynamic_weights" in keys:
        details["dynamic_weights"] = {k: v for p in parts for k, v in p.details.get("dynamic_weights", {}).items()}
    return RewardOutput(
        scores=np.concatenate([_columns(p, ids, p.scores) for p in parts]),
        valid=valid_NxD,
        reward=np.concatenate([p.reward for p in parts]).astype(np.float32),
        dimension_ids=ids,
        details=details,
    )


def gather_outputs(local: RewardOutput) -> RewardOutput:
    """Every process's RewardOutput of its own rows, joined in process order (every process must call it);
    with one process, `local`."""
    return concat_outputs(distributed.all_gather_objects(local))


_PER_ROW = ("reward_ok", "raw_scores", "uncorrected_raw_scores")  # details arrays indexed by row


def select_rows(out: RewardOutput, rows: Sequence[int]) -> RewardOutput:
    """`out` restricted to `rows` (in that order): scores, validity, rewards, the per-row details and rubric
    hashes. The counters (judge prompts, failures, ...) stay those of the whole call, so joining the selections
    of several calls with `concat_outputs` counts each call's judge work once."""
    rows = list(rows)
    details = dict(out.details)
    for key in _PER_ROW:
        if key in details:
            details[key] = np.asarray(details[key])[rows]
    if "rubric_hashes" in details:
        details["rubric_hashes"] = [details["rubric_hashes"][i] for i in rows]
    return RewardOutput(out.scores[rows], out.valid[rows], out.reward[rows], list(out.dimension_ids), details)
