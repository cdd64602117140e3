"""Dynamic dimension weights (RubricRL 2.3, 5.3 step 5): shift weight off dimensions the policy has saturated.

A dimension whose normalised score hardly varies any more (pooled variance over the last `window` steps
below `var_threshold`) no longer separates good from bad answers, so its weight only dilutes the GRPO
advantage. Each update moves the weights towards a target in which saturated dimensions keep
`min_fraction` of their original weight and the freed weight goes to the still-discriminating ones in
proportion to their original weights (the rubric author's priorities). A dimension that starts to vary
again moves back towards its original weight. Invariants, every step:
  |w_new_i - w_old_i| <= max_delta * W0   (W0 = sum of the original weights)
  w_i >= min_fraction * w0_i > 0,  sum_i w_i = W0,  non-adjustable (gate) dimensions never change.
The state is a pytree (ring buffers of per-step count / sum / sum of squares per dimension) and the update
is a pure function, so it can run inside or outside jit. Off by default (`enabled=False`).
"""
from __future__ import annotations

import dataclasses
import functools

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax.rubrics.schema import Dimension, Rubric


@dataclasses.dataclass(frozen=True)
class DynamicWeightsConfig:
    """Hyper-parameters; validated at construction."""

    enabled: bool = False  # off by default: weights stay as the rubric says
    var_threshold: float = 0.005  # pooled variance of [0, 1] scores below which a dimension is saturated
    min_samples: int = 64  # scores of a dimension needed in the window before it can be called saturated
    max_delta: float = 0.02  # largest change of one weight per update, as a fraction of the total weight
    min_fraction: float = 0.1  # a saturated dimension keeps at least this fraction of its original weight

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ValueError(f"dynamic_weights.enabled: expected true/false, got {self.enabled!r}")
        if isinstance(self.min_samples, bool) or not isinstance(self.min_samples, int) or self.min_samples < 2:
            raise ValueError(f"dynamic_weights.min_samples: expected an integer >= 2, got {self.min_samples!r}")
        if not 0.0 <= self.var_threshold <= 0.25:
            raise ValueError(f"dynamic_weights.var_threshold: expected 0 <= v <= 0.25 (variance of [0,1] scores), got {self.var_threshold!r}")
        if not 0.0 < self.max_delta <= 1.0:
            raise ValueError(f"dynamic_weights.max_delta: expected 0 < d <= 1, got {self.max_delta!r}")
        if not 0.0 < self.min_fraction <= 1.0:
            raise ValueError(f"dynamic_weights.min_fraction: expected 0 < f <= 1, got {self.min_fraction!r}")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=("base_weights_D", "weights_D", "adjustable_D", "count_WxD", "sum_WxD",
                                "sumsq_WxD", "step"),
                   meta_fields=())
@dataclasses.dataclass(frozen=True)
class DynamicWeightsState:
    """Original and current weights, which dimensions may move, and ring buffers of score statistics."""

    base_weights_D: jax.Array
    weights_D: jax.Array
    adjustable_D: jax.Array
    count_WxD: jax.Array
    sum_WxD: jax.Array
    sumsq_WxD: jax.Array
    step: jax.Array


def init_dynamic_weights(weights_D: np.ndarray | jax.Array, window: int,
                         adjustable_D: np.ndarray | jax.Array | None = None) -> DynamicWeightsState:
    """State starting at the rubric's weights, pooling the last `window` steps' score statistics; pass
    adjustable_D=~rubric.gates so gates never move."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"dynamic_weights.window: expected an integer >= 1, got {window!r}")
    w = jnp.asarray(weights_D, jnp.float32)
    if w.ndim != 1 or not bool((w > 0).all()):
        raise ValueError(f"weights: expected a 1-D array of positive weights, got {np.asarray(weights_D)!r}")
    adjustable = jnp.ones(w.shape, bool) if adjustable_D is None else jnp.asarray(adjustable_D, bool)
    if adjustable.shape != w.shape:
        raise ValueError(f"adjustable_D: expected shape {w.shape}, got {adjustable.shape}")
    zeros = jnp.zeros((window,) + w.shape, jnp.float32)
    return DynamicWeightsState(w, w, adjustable, zeros, zeros, zeros, jnp.zeros((), jnp.int32))


def window_variance(state: DynamicWeightsState) -> tuple[jax.Array, jax.Array]:
    """(pooled variance [D] of all scores in the window, number of scores [D])."""
    n = state.count_WxD.sum(0)
    safe_n = jnp.maximum(n, 1.0)
    mean = state.sum_WxD.sum(0) / safe_n
    return jnp.maximum(state.sumsq_WxD.sum(0) / safe_n - mean * mean, 0.0), n


def _zero_sum(delta_D: jax.Array) -> jax.Array:
    """Shrink the larger of the positive / negative parts so the changes sum to 0 (never grows a change)."""
    pos = jnp.where(delta_D > 0, delta_D, 0.0)
    neg = jnp.where(delta_D < 0, -delta_D, 0.0)
    p, q = pos.sum(), neg.sum()
    m = jnp.minimum(p, q)
    return pos * (m / jnp.where(p > 0, p, 1.0)) - neg * (m / jnp.where(q > 0, q, 1.0))


def update_dynamic_weights(state: DynamicWeightsState, scores_NxD: jax.Array, valid_NxD: jax.Array,
                           cfg: DynamicWeightsConfig) -> tuple[DynamicWeightsState, dict[str, jax.Array]]:
    """Record this step's normalised scores, then move the weights one bounded step; returns metrics to log."""
    scores = jnp.asarray(scores_NxD, jnp.float32)
    present = jnp.asarray(valid_NxD, bool) & ~jnp.isnan(scores)
    s = jnp.where(present, scores, 0.0)
    slot = state.step % state.count_WxD.shape[0]
    state = dataclasses.replace(
        state,
        count_WxD=state.count_WxD.at[slot].set(present.sum(0).astype(jnp.float32)),
        sum_WxD=state.sum_WxD.at[slot].set(s.sum(0)),
        sumsq_WxD=state.sumsq_WxD.at[slot].set((s * s).sum(0)),
        step=state.step + 1)
    var_D, n_D = window_variance(state)
    saturated_D = state.adjustable_D & (n_D >= cfg.min_samples) & (var_D < cfg.var_threshold)
    live_D = state.adjustable_D & ~saturated_D
    base, w = state.base_weights_D, state.weights_D
    total = base.sum()
    floor_D = cfg.min_fraction * base
    freed = jnp.where(saturated_D, base - floor_D, 0.0).sum()
    live_base = jnp.where(live_D, base, 0.0).sum()
    share_D = jnp.where(live_D, base / jnp.where(live_base > 0, live_base, 1.0), 0.0)
    # With no live dimension there is nowhere to move weight: the target is the original weights.
    target_D = jnp.where(live_base > 0,
                         jnp.where(saturated_D, floor_D, base + share_D * freed), base)
    delta_D = jnp.clip(target_D - w, -cfg.max_delta * total, cfg.max_delta * total)
    delta_D = jnp.where(state.adjustable_D, jnp.maximum(delta_D, floor_D - w), 0.0)
    new_w = w + _zero_sum(delta_D) if cfg.enabled else w
    state = dataclasses.replace(state, weights_D=new_w)
    return state, {"weights": new_w, "variance": var_D, "saturated": saturated_D, "num_scores": n_D}


update_dynamic_weights_jit = jax.jit(update_dynamic_weights, static_argnames=("cfg",))


@dataclasses.dataclass
class DimensionWeights:
    """The trainer's dynamic weights over every dimension id of a run (shared and case-wise rubrics):
    the state above plus the id of each column, fed one step's scores at a time."""

    ids: list[str]
    state: DynamicWeightsState

    @classmethod
    def for_rubrics(cls, rubrics: list[Rubric], window: int) -> DimensionWeights:
        """Starts at each dimension's rubric weight; gates never move. One weight per id replaces every rubric's own,
        so two rubrics giving an id different weights (or a gate in one only) raise a ValueError naming it, both
        rubrics and the field, rather than one rubric's weight silently standing for all (case-wise rubrics)."""
        first: dict[str, tuple[Dimension, Rubric]] = {}
        for rubric in rubrics:
            for dim in rubric.dimensions:
                known, where = first.setdefault(dim.id, (dim, rubric))
                for field in ("weight", "gate"):
                    if getattr(dim, field) != getattr(known, field):
                        raise ValueError(
                            f"config.rl.dynamic_weights=True: dimension {dim.id!r} has {field} {getattr(dim, field)!r} "
                            f"in rubric {rubric.name!r} version {rubric.version} but {getattr(known, field)!r} in "
                            f"rubric {where.name!r} version {where.version}: one dynamic weight per dimension id "
                            "replaces every rubric's own (give the dimensions ids of their own, or turn it off)")
        ids = list(first)
        weights = np.asarray([first[d][0].weight for d in ids], np.float32)
        adjustable = np.asarray([not first[d][0].gate for d in ids])
        return cls(ids, init_dynamic_weights(weights, window, adjustable))

    def current(self) -> dict[str, float]:
        """Dimension id -> its weight now."""
        return dict(zip(self.ids, np.asarray(self.state.weights_D).tolist()))

    def update(self, dimension_ids: list[str], scores_NxD: np.ndarray, valid_NxD: np.ndarray) -> dict[str, float]:
        """Feeds one step's normalised scores (columns named by `dimension_ids`, any subset and order of
        `ids`) to the window; returns the new weights to log as `weight/<id>`."""
        n = scores_NxD.shape[0]
        column = {d: c for c, d in enumerate(dimension_ids)}
        scores = np.full((n, len(self.ids)), np.nan, np.float32)
        valid = np.zeros((n, len(self.ids)), bool)
        for j, d in enumerate(self.ids):
            if d in column:
                scores[:, j], valid[:, j] = scores_NxD[:, column[d]], valid_NxD[:, column[d]]
        self.state, info = update_dynamic_weights_jit(self.state, scores, valid, DynamicWeightsConfig(enabled=True))
        return {f"weight/{d}": float(w) for d, w in zip(self.ids, np.asarray(info["weights"]))}

    def to_json(self) -> dict[str, Any]:
        """The state as JSON lists (saved in a checkpoint's metadata)."""
        return {f.name: np.asarray(getattr(self.state, f.name)).tolist() for f in dataclasses.fields(self.state)}

    def load_json(self, saved: dict[str, Any]) -> None:
        """Restores `to_json`'s output, each field in the dtype it has now."""
        dtypes = {f.name: np.asarray(getattr(self.state, f.name)).dtype for f in dataclasses.fields(self.state)}
        self.state = DynamicWeightsState(**{k: jnp.asarray(np.asarray(v, dtype=dtypes[k])) for k, v in saved.items()})
