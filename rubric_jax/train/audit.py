"""The judge audited on the policy's current outputs (RubricRL §6.2, issue 23 §1): at every eval, a fixed sample of
the eval responses is scored again by an audit judge (config.audit: another base, a larger model, an ensemble, an
endpoint) on the LLM-judged dimensions, and per dimension the eval row gets

  audit/spearman/<d>   Spearman of the training judge's and the audit judge's scores (rows both scored)
  audit/kappa/<d>      their quadratic-weighted kappa on the dimension's levels (calibration/stats.py)
  audit/gap/<d>        mean normalised score, training judge minus audit judge (> 0: the training judge pays more)
  audit/gap/<d>/rise   the gap minus the smallest gap of the previous `window` audits (NaN at the first audit)
  audit/n/<d>          rows both judges scored

The golden set scores fixed reference answers with a frozen judge (a regression check that cannot move with the
policy); these read what the policy writes now, where a policy and its judge co-adapt. monitors.CHECKS alerts on an
agreement below config.monitor.min_audit_agreement and a gap rise above config.monitor.max_audit_gap_rise. A
statistic that does not exist (a constant column, fewer than 3 pairs) is NaN, never a number.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rubric_jax import distributed, metrics
from rubric_jax.calibration.stats import nearest_level, quadratic_kappa, scale_groups, spearman
from rubric_jax.judges.reward import RewardOutput, RubricReward, gather_outputs
from rubric_jax.judges.loading import load_cascade, load_judges
from rubric_jax.judges.spec import JudgeSpec
from rubric_jax.rubrics.io import load_rubric
from rubric_jax.rubrics.schema import Rubric

PREFIX = "audit/"
_SAMPLE_SEED = 23  # the seeded subset of eval rows audited: the same rows at every eval, so gaps compare like with like


@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """config.audit, validated (settings.py): the audit judge, the rubric it reads ('' = each row's own), the eval
    rows audited per eval and the audits behind the gap rise."""

    judge: JudgeSpec
    rubric: str
    sample_size: int
    window: int


def _nan_or(value: float | None) -> float:
    return math.nan if value is None else float(value)


def dimension_metrics(dim_id: str, levels: Sequence[int], train_raw_N: np.ndarray, audit_raw_N: np.ndarray,
                      train_norm_N: np.ndarray, audit_norm_N: np.ndarray) -> dict[str, float]:
    """One dimension's agreement and gap over the rows both judges scored (NaN entries are left out): raw scores on
    the dimension's `levels` give Spearman and kappa, normalised ones (1 = best) the gap."""
    both_N = np.isfinite(train_raw_N) & np.isfinite(audit_raw_N)
    train, audit = np.asarray(train_raw_N, np.float64)[both_N], np.asarray(audit_raw_N, np.float64)[both_N]
    kappa = quadratic_kappa(nearest_level(train, levels), nearest_level(audit, levels), levels)
    gap = float(np.mean(train_norm_N[both_N] - audit_norm_N[both_N])) if both_N.any() else math.nan
    return {f"{PREFIX}spearman/{dim_id}": _nan_or(spearman(train, audit).value),
            f"{PREFIX}kappa/{dim_id}": _nan_or(kappa.value), f"{PREFIX}gap/{dim_id}": gap,
            f"{PREFIX}n/{dim_id}": float(both_N.sum())}


def gap_rise(previous_gaps: Sequence[float], gap: float, window: int) -> float:
    """`gap` minus the smallest finite gap of the last `window` earlier audits (NaN when there is none): a rise over
    the window, which a gap that starts high but stays there never shows."""
    earlier = [g for g in list(previous_gaps)[-window:] if math.isfinite(g)]
    return gap - min(earlier) if earlier and math.isfinite(gap) else math.nan


def previous_gaps(rows: Sequence[Mapping[str, Any]], step: int) -> dict[str, list[float]]:
    """audit/gap/<d> of the eval rows logged before `step`, in step order (metrics.jsonl: a resumed run, whose log
    was cut back to its checkpoint, reads the same history an uninterrupted one had)."""
    gaps: dict[str, list[float]] = {}
    for row in sorted((r for r in rows if r.get("stage") == "eval" and r["step"] < step), key=lambda r: r["step"]):
        for key, value in row.items():
            if key.startswith(f"{PREFIX}gap/") and not key.endswith("/rise"):
                gaps.setdefault(key, []).append(_nan_or(metrics.scalar_value(value)))
    return gaps


def sample_rows(num_rows: int, size: int) -> np.ndarray:
    """The audited rows: a seeded subset of `size` of `num_rows` eval rows (all when fewer), in row order."""
    if num_rows <= size:
        return np.arange(num_rows)
    return np.sort(np.random.default_rng(_SAMPLE_SEED).permutation(num_rows)[:size])


@dataclasses.dataclass
class Audit:
    """The audit judge's reward and what it audits; `__call__` gives an eval row's audit metrics."""

    settings: AuditSettings
    reward: RubricReward  # the audit judge(s), gates off: every LLM dimension of an audited row is judged
    rubric: Rubric | None  # config.audit.rubric, or None: each row's own rubric

    def dimensions(self, rubrics: Sequence[Rubric]) -> dict[str, tuple[str, tuple[int, ...], list[int]]]:
        """Audited name -> (dimension id, levels, the positions in `rubrics` whose rubric has it on that scale): the
        LLM dimensions of the rows' rubrics (those of the audit rubric, if any), each row's own scale read from its
        own rubric (stats.scale_groups: one name per scale where case-wise rubrics give one id several)."""
        audited = {d.id for d in self.rubric.dimensions if d.judged} if self.rubric is not None else None
        return scale_groups((d.id, d.scale.levels, i) for i, rubric in enumerate(rubrics) for d in rubric.dimensions
                            if d.judged and (audited is None or d.id in audited))

    def __call__(self, step: int, samples: Sequence[Mapping[str, Any]], rubrics: Sequence[Rubric],
                 scored: RewardOutput, key: jax.Array, logged: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Audit metrics of the eval at `step`: `samples` (question, response), `rubrics` and `scored` (the training
        judge's scores) are every process's eval rows in order; `logged` are metrics.jsonl's rows (the earlier gaps).
        Every process calls it (the audit judge is a global computation); each scores its block of the audited rows.
        A dimension id whose audited rows have several scales gets its metrics per scale, as '<d>@<lo>-<hi>'."""
        rows = sample_rows(len(samples), self.settings.sample_size)
        audit_rubrics = [self.rubric or rubrics[i] for i in rows]
        start, stop = distributed.block_bounds(len(rows))
        block = rows[start:stop]
        audited = gather_outputs(self.reward([samples[i]["question"] for i in block],
                                             [samples[i]["response"] for i in block], audit_rubrics[start:stop], key=key))
        earlier, out = previous_gaps(logged, step), {}
        for name, (dim_id, levels, picked) in self.dimensions([rubrics[i] for i in rows]).items():
            if dim_id not in scored.dimension_ids or dim_id not in audited.dimension_ids:
                continue
            t, a = scored.dimension_ids.index(dim_id), audited.dimension_ids.index(dim_id)
            found = dimension_metrics(name, levels, scored.details["raw_scores"][rows[picked], t],
                                      audited.details["raw_scores"][picked, a], scored.scores[rows[picked], t],
                                      audited.scores[picked, a])
            gap_key = f"{PREFIX}gap/{name}"
            found[f"{gap_key}/rise"] = gap_rise(earlier.get(gap_key, []), found[gap_key], self.settings.window)
            out.update(found)
        return out


def build_audit(settings: AuditSettings | None, layout_or_mesh: Any, rubrics: Sequence[Rubric]) -> Audit | None:
    """The run's audit (None when config.audit has no judge): its judges loaded like config.judge's, its rubric read;
    a ValueError naming config.audit.* when nothing LLM-judged would be audited."""
    if settings is None:
        return None
    rubric = load_rubric(settings.rubric) if settings.rubric else None
    where = "config.audit.judge"
    reward = RubricReward((), load_judges(settings.judge, layout_or_mesh, where=where), settings.judge,
                          refiners=load_cascade(settings.judge, layout_or_mesh, where=where))
    audit = Audit(settings, reward, rubric)
    if not audit.dimensions(rubrics):
        where = f"config.audit.rubric={settings.rubric}" if rubric else where
        raise ValueError(f"{where}: no LLM-judged dimension of the run's rubrics to audit (an audit rubric must "
                         "name LLM dimensions of the run's, with the same ids)")
    if rubric is not None:
        check_audit_scales(rubric, settings.rubric, rubrics)
    return audit


def check_audit_scales(audit_rubric: Rubric, source: str, rubrics: Sequence[Rubric]) -> None:
    """Raise ValueError naming config.audit.rubric, the dimension and the run's rubric when an audited dimension's
    levels differ from that of any run rubric with its id: both judges must score a row on one scale (every rubric
    is checked, not one standing for all: case-wise rubrics may give one id different scales)."""
    audited = {d.id: d.scale.levels for d in audit_rubric.dimensions if d.judged}
    for r in rubrics:
        for dim in r.dimensions:
            if dim.judged and dim.id in audited and dim.scale.levels != audited[dim.id]:
                raise ValueError(f"config.audit.rubric={source}: dimension {dim.id!r} has levels "
                                 f"{list(audited[dim.id])}, the run's rubric {r.name!r} version {r.version} "
                                 f"{list(dim.scale.levels)}: agreement needs one scale")
