"""Reward aggregation: scores [N, D] in [0, 1] (NaN = missing) -> reward [N] in [0, 1] plus an ok mask [N].

Pure jnp over the last axis; jit-able with an `AggregationSpec` (a pytree: arrays are leaves, method names
static). Methods (RubricRL 5.2; QuRL; HealthBench FORMULA.md), with w normalised over present dimensions:
  weighted_sum              R = sum_i w_i s_i
  weighted_geometric_mean   R = exp(sum_i w_i log max(s_i, eps)). The eps floor keeps log finite and the
                            gradient-free reward bounded: a dimension at 0 multiplies R by eps^{w_i}, i.e.
                            a 0 is a heavy penalty, not a veto (eps=1e-3, w_i=1/4 caps R at 0.18). Use a
                            gate when 0 must mean 0.
  min                       R = min_i s_i (weights unused)
  hierarchical              per group g: R_g = within(s in g, w in g); then R = across(R_g, group weights)
                            (group weights default to the sum of member weights); within/across are each
                            one of the three methods above
  healthbench_points        met_i = s_i if p_i > 0 else 1 - s_i (s is goodness, see schema.py);
                            R = clip(sum_i p_i met_i / sum_{p_i > 0} p_i, 0, 1). HealthBench itself clips
                            only the benchmark mean; a per-sample reward must lie in [0, 1], so we clip here.
Gates (any method): dimensions with gate=True take no part in the method; R = 0 when any gate score is 0
(RubricRL 5.2, "safety first": a failed safety dimension zeroes the reward whatever the rest scores).

Missing scores (a dimension is present iff valid and not NaN), Aggregation.missing:
  "renormalize"  aggregate over present dimensions only (weights renormalised over them); a sample is ok
                 iff at least one scored dimension (healthbench_points: one positive criterion) is present.
  "drop"         a sample with any missing dimension is not ok.
Under both rules a missing GATE makes the sample not ok: a veto cannot be assumed passed. A reward that
is not finite (float32 overflow with weights outside schema.WEIGHT_RANGE, e.g. from a hand-built spec)
makes the sample not ok as well: a NaN is never reported as a reward. Rewards of not-ok samples are 0
and carry no meaning: the trainer must drop them from their group (ok mask).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax.rubrics.schema import AGGREGATION_PARAMS, LEVEL_METHODS, Rubric

DEFAULT_EPS = 1e-3  # geometric-mean floor; see module docstring


def _present(scores_NxD: jax.Array, valid_NxD: jax.Array) -> jax.Array:
    """True where a score exists: judge said valid and the value is not NaN."""
    return valid_NxD & ~jnp.isnan(scores_NxD)


def _norm_weights(weights_D: jax.Array, mask_xD: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Weights restricted to mask and normalised to sum 1 per row; also whether any weight survives (and
    their float32 sum is finite: an overflowed sum would turn every weight into 0 or NaN)."""
    w = jnp.where(mask_xD, jnp.broadcast_to(weights_D, mask_xD.shape), 0.0)
    total = w.sum(-1, keepdims=True)
    return w / jnp.where(total > 0, total, 1.0), (total[..., 0] > 0) & jnp.isfinite(total[..., 0])


def weighted_sum(scores_xD: jax.Array, mask_xD: jax.Array, weights_D: jax.Array, eps: float = DEFAULT_EPS) -> tuple[jax.Array, jax.Array]:
    """sum_i w_i s_i over masked dimensions, weights renormalised; (reward [...], any present [...])."""
    del eps
    w, ok = _norm_weights(weights_D, mask_xD)
    return (w * jnp.where(mask_xD, scores_xD, 0.0)).sum(-1), ok


def weighted_geometric_mean(scores_xD: jax.Array, mask_xD: jax.Array, weights_D: jax.Array, eps: float = DEFAULT_EPS) -> tuple[jax.Array, jax.Array]:
    """exp(sum_i w_i log max(s_i, eps)) over masked dimensions; the eps floor is documented above."""
    w, ok = _norm_weights(weights_D, mask_xD)
    logs = jnp.log(jnp.maximum(jnp.where(mask_xD, scores_xD, 1.0), eps))
    return jnp.exp((w * logs).sum(-1)), ok


def minimum(scores_xD: jax.Array, mask_xD: jax.Array, weights_D: jax.Array, eps: float = DEFAULT_EPS) -> tuple[jax.Array, jax.Array]:
    """min_i s_i over masked dimensions (weights unused); 0 where none is present."""
    del weights_D, eps
    ok = mask_xD.any(-1)
    return jnp.where(ok, jnp.where(mask_xD, scores_xD, 1.0).min(-1), 0.0), ok


# Interchangeable per-level methods (also the within/across choices of hierarchical).
LEVEL_FNS: dict[str, Callable[..., tuple[jax.Array, jax.Array]]] = {
    "weighted_sum": weighted_sum,
    "weighted_geometric_mean": weighted_geometric_mean,
    "min": minimum,
}
assert tuple(LEVEL_FNS) == LEVEL_METHODS


def hierarchical(scores_xD: jax.Array, mask_xD: jax.Array, weights_D: jax.Array, groups_GxD: jax.Array,
                 group_weights_G: jax.Array, within: str, across: str, eps: float = DEFAULT_EPS) -> tuple[jax.Array, jax.Array]:
    """Aggregate inside each group with `within`, then across present groups with `across`."""
    member_xGxD = mask_xD[..., None, :] & jnp.broadcast_to(groups_GxD.astype(bool), mask_xD.shape[:-1] + groups_GxD.shape)
    group_r_xG, group_ok_xG = LEVEL_FNS[within](scores_xD[..., None, :], member_xGxD, weights_D, eps)
    return LEVEL_FNS[across](group_r_xG, group_ok_xG, group_weights_G, eps)


def healthbench_points(scores_xD: jax.Array, mask_xD: jax.Array, points_D: jax.Array) -> tuple[jax.Array, jax.Array]:
    """clip(sum of points of met criteria / sum of positive points, 0, 1) over masked criteria."""
    p = jnp.broadcast_to(points_D, scores_xD.shape)
    met = jnp.where(p > 0, scores_xD, 1.0 - scores_xD)
    num = jnp.where(mask_xD, p * met, 0.0).sum(-1)
    den = jnp.where(mask_xD & (p > 0), p, 0.0).sum(-1)
    ok = den > 0
    return jnp.where(ok, jnp.clip(num / jnp.where(ok, den, 1.0), 0.0, 1.0), 0.0), ok


def gated(reward_N: jax.Array, scores_NxD: jax.Array, present_NxD: jax.Array, gates_D: jax.Array) -> tuple[jax.Array, jax.Array]:
    """reward * [every gate dimension > 0]; (gated reward, every gate present)."""
    gates_NxD = jnp.broadcast_to(gates_D, present_NxD.shape)
    gate_ok_N = jnp.where(gates_NxD, present_NxD, True).all(-1)
    passed_N = jnp.where(gates_NxD & present_NxD, scores_NxD > 0, True).all(-1)
    return jnp.where(passed_N, reward_N, 0.0), gate_ok_N


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=("weights_D", "gates_D", "points_D", "groups_GxD", "group_weights_G"),
                   meta_fields=("method", "missing", "eps", "within", "across"))
@dataclasses.dataclass(frozen=True)
class AggregationSpec:
    """Everything `aggregate` needs, as arrays (weights may change every step) plus static method names."""

    weights_D: jax.Array
    gates_D: jax.Array
    points_D: jax.Array
    groups_GxD: jax.Array  # 0/1 membership of non-gate dimensions; [0, D] unless hierarchical
    group_weights_G: jax.Array
    method: str
    missing: str
    eps: float
    within: str
    across: str


def spec_from_rubric(rubric: Rubric, weights_D: np.ndarray | jax.Array | None = None) -> AggregationSpec:
    """The rubric's aggregation as an AggregationSpec; `weights_D` overrides the rubric's (dynamic weights)."""
    agg = rubric.aggregation
    weights = np.asarray(rubric.weights if weights_D is None else weights_D, np.float32)
    if weights.shape != (len(rubric.dimensions),):
        raise ValueError(f"weights: expected shape ({len(rubric.dimensions)},), got {weights.shape}")
    names: list[str] = []
    if agg.method == "hierarchical":
        names = list(dict.fromkeys(d.group for d in rubric.dimensions if not d.gate))
    groups = np.asarray([[d.group == g and not d.gate for d in rubric.dimensions] for g in names],
                        np.float32).reshape(len(names), len(rubric.dimensions))
    explicit = agg.params.get("group_weights", {})
    group_weights = np.asarray([explicit[g] if g in explicit else float((groups[i] * weights).sum())
                                for i, g in enumerate(names)], np.float32)
    return AggregationSpec(
        weights_D=jnp.asarray(weights), gates_D=jnp.asarray(rubric.gates), points_D=jnp.asarray(rubric.points),
        groups_GxD=jnp.asarray(groups), group_weights_G=jnp.asarray(group_weights), method=agg.method,
        missing=agg.missing, eps=float(agg.params.get("eps", DEFAULT_EPS)),
        within=agg.params.get("within", "weighted_sum"), across=agg.params.get("across", "weighted_sum"))


def aggregate(scores_NxD: jax.Array, valid_NxD: jax.Array, spec: AggregationSpec) -> tuple[jax.Array, jax.Array]:
    """Scores [N, D] in [0, 1] (NaN = missing) -> (reward [N] in [0, 1], ok [N]); pure and jit-able."""
    if spec.method not in AGGREGATION_PARAMS:
        raise ValueError(f"aggregation method: expected one of {sorted(AGGREGATION_PARAMS)}, got {spec.method!r}")
    scores = jnp.asarray(scores_NxD, jnp.float32)
    present = _present(scores, jnp.asarray(valid_NxD, bool))
    scored = present & ~jnp.broadcast_to(spec.gates_D, present.shape)
    if spec.method == "healthbench_points":
        reward, ok = healthbench_points(scores, scored, spec.points_D)
    elif spec.method == "hierarchical":
        reward, ok = hierarchical(scores, scored, spec.weights_D, spec.groups_GxD, spec.group_weights_G,
                                  spec.within, spec.across, spec.eps)
    else:
        reward, ok = LEVEL_FNS[spec.method](scores, scored, spec.weights_D, spec.eps)
    reward, gate_ok = gated(reward, scores, present, spec.gates_D)
    ok = ok & gate_ok & jnp.isfinite(reward)
    if spec.missing == "drop":
        ok = ok & present.all(-1)
    return jnp.where(ok, jnp.clip(reward, 0.0, 1.0), 0.0), ok


aggregate_jit = jax.jit(aggregate)


def aggregate_rubric(rubric: Rubric, scores_NxD: np.ndarray, valid_NxD: np.ndarray,
                     weights_D: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Convenience for host code: normalised scores of one rubric -> (reward [N] float32, ok [N] bool)."""
    scores = np.asarray(scores_NxD, np.float32)
    if scores.ndim != 2 or scores.shape[1] != len(rubric.dimensions):
        raise ValueError(f"scores: expected shape [N, {len(rubric.dimensions)}] for rubric {rubric.name!r}, got {scores.shape}")
    reward, ok = aggregate_jit(scores, np.asarray(valid_NxD, bool), spec_from_rubric(rubric, weights_D))
    return np.asarray(reward), np.asarray(ok)
