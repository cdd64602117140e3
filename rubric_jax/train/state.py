"""Train state pytree, the AdamW optimizer with its schedule, and sharded initialisation.

Parameters live in the state as a plain nested dict (`nnx.to_pure_dict` of the model state, HF-like
names); the NNX graphdef and the optax transformation ride along as static pytree fields, so a step
function is `(state, batch) -> (state, metrics)` and `nnx.merge(state.graphdef, state.params)` rebuilds
the model inside `jit`. Parameters and optimizer moments are float32; the forward pass runs in the
model's `compute_dtype` (e.g. bfloat16: the model casts weights at use).

Parameters come from rubric_jax.loader (a checkpoint or a seeded init, created in their shards); the
optimizer state is then built by a jitted init with `out_shardings`, so nothing materialises on one
device. Placement is explicit: params that are not already in the given shardings are an error.

With LoRA (params holding adapters, models/lora.py) the state's `params` are the adapters alone (float32, the
only leaves with gradients and optimizer moments) and `frozen` holds the base model, cast once to the compute
dtype; `model_params()` joins them into the model's tree (the same arrays).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh

from rubric_jax import loader, sharding
from rubric_jax.models import lora
from rubric_jax.models.config import ModelConfig

Params = dict[str, Any]
SCHEDULES = ("constant", "cosine")
_NO_DECAY = ("bias", "scale")  # norm scales and projection biases are not weight-decayed


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with linear warmup, a constant or cosine schedule and global-norm clipping."""

    learning_rate: float = 1e-6
    """Peak learning rate (RubricRL §4.3: start at 1e-6, drop to 5e-7 if rewards oscillate; QuRL: 1e-6)."""
    warmup_steps: int = 0
    """Linear warmup from 0 to the peak over this many optimizer updates."""
    schedule: str = "constant"
    """After warmup: "constant" or "cosine" (decays to min_lr_ratio · peak at total_steps)."""
    total_steps: int | None = None
    """Length of the cosine schedule including warmup; required by "cosine", None otherwise."""
    min_lr_ratio: float = 0.0
    """Final learning rate of the cosine schedule as a fraction of the peak."""
    b1: float = 0.9
    """Adam first-moment decay."""
    b2: float = 0.999
    """Adam second-moment decay."""
    eps: float = 1e-8
    """Adam denominator epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW) on matrices; norm scales and biases are never decayed."""
    max_grad_norm: float = 1.0
    """Global-norm gradient clipping threshold (the usual GRPO/PPO setting)."""

    def __post_init__(self) -> None:
        def fail(field: str, why: str) -> None:
            raise ValueError(f"OptimizerConfig.{field}={getattr(self, field)!r}: {why}")

        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            fail("learning_rate", "must be finite and > 0")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            fail("warmup_steps", "must be an integer >= 0")
        if self.schedule not in SCHEDULES:
            fail("schedule", f"must be one of {SCHEDULES}")
        if self.schedule == "cosine":
            if not isinstance(self.total_steps, int) or self.total_steps <= self.warmup_steps:
                fail("total_steps", f"cosine needs an integer > warmup_steps={self.warmup_steps}")
        elif self.total_steps is not None:
            fail("total_steps", "only used by the cosine schedule; leave it None")
        if not 0 <= self.min_lr_ratio <= 1:
            fail("min_lr_ratio", "must be in [0, 1]")
        for name in ("b1", "b2"):
            if not 0 <= getattr(self, name) < 1:
                fail(name, "must be in [0, 1)")
        if not self.eps > 0:
            fail("eps", "must be > 0")
        if not self.weight_decay >= 0:
            fail("weight_decay", "must be >= 0")
        if not self.max_grad_norm > 0:
            fail("max_grad_norm", "must be > 0")


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """Learning rate as a function of the optimizer update count."""
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, cfg.learning_rate, cfg.warmup_steps, cfg.total_steps, cfg.learning_rate * cfg.min_lr_ratio)
    if cfg.warmup_steps == 0:
        return optax.constant_schedule(cfg.learning_rate)
    warmup = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.join_schedules([warmup, optax.constant_schedule(cfg.learning_rate)], [cfg.warmup_steps])


def _decay_mask(params: Params) -> Params:
    """True for leaves that get weight decay (not norm scales or biases)."""
    return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key not in _NO_DECAY, params)


class LRFactorState(NamedTuple):
    """The factor every update is multiplied by (1 until a learning-rate drop; see `set_lr_factor`)."""

    lr_factor: jax.Array


def scale_by_lr_factor() -> optax.GradientTransformation:
    """Multiplies the updates by the factor held in its state: AdamW's update (weight decay included) is
    proportional to the learning rate, so this is the learning rate times the factor, exactly."""

    def init(params: Any) -> LRFactorState:
        del params
        return LRFactorState(jnp.ones((), jnp.float32))

    def update(updates: Any, state: LRFactorState, params: Any = None) -> tuple[Any, LRFactorState]:
        del params
        return jax.tree.map(lambda u: u * state.lr_factor.astype(u.dtype), updates), state

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg: OptimizerConfig, adjustable_lr: bool = False) -> optax.GradientTransformation:
    """clip_by_global_norm, then AdamW whose learning rate is recorded in the state (see `current_lr`);
    with `adjustable_lr`, a factor in the state scales it (`set_lr_factor`: the learning-rate drop on an
    oscillating reward). Without it the state has no factor, so older checkpoints still restore."""
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
        learning_rate=make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
        weight_decay=cfg.weight_decay, mask=_decay_mask)
    parts = [optax.clip_by_global_norm(cfg.max_grad_norm), adamw]
    return optax.chain(*parts, scale_by_lr_factor()) if adjustable_lr else optax.chain(*parts)


def _is_array(_: Any, value: Any) -> bool:
    return isinstance(value, jax.Array)


def lr_factor(opt_state: Any) -> jax.Array | None:
    """The learning-rate factor of an `adjustable_lr` optimizer's state, else None."""
    return optax.tree_utils.tree_get(opt_state, "lr_factor", filtering=_is_array)


def set_lr_factor(opt_state: Any, factor: float) -> Any:
    """`opt_state` with its learning-rate factor set to `factor`, in the old factor's sharding."""
    old = lr_factor(opt_state)
    if old is None:
        raise ValueError("set_lr_factor: the optimizer has no learning-rate factor (make_optimizer(adjustable_lr=True))")
    return optax.tree_utils.tree_set(opt_state, _is_array,
                                     lr_factor=jax.device_put(jnp.asarray(factor, jnp.float32), old.sharding))


def current_lr(opt_state: Any) -> jax.Array | None:
    """The learning rate the last update used (before any: the first one's) times the learning-rate factor if
    the optimizer has one, or None if the optimizer does not record it (`make_optimizer` does)."""
    lr = optax.tree_utils.tree_get(opt_state, "learning_rate", filtering=_is_array)
    factor = lr_factor(opt_state)
    return lr if lr is None or factor is None else lr * factor


@struct.dataclass
class TrainState:
    """Everything a step changes, plus static graphdef and optimizer (never traced). Randomness is not
    state: the loop derives each step's key as fold_in(run key, step)."""

    step: jax.Array
    """Batches consumed (int32 scalar); advances on skipped updates too."""
    params: Params
    """Model parameters as a pure nested dict, float32."""
    opt_state: Any
    """optax state of `tx`."""
    graphdef: nnx.GraphDef = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    frozen: Params | None = None
    """LoRA: the base model's params in the compute dtype (never updated, never checkpointed); else None."""

    def model_params(self) -> Params:
        """The whole model's params (adapters and base joined; without LoRA `params`): what `nnx.merge` with
        `graphdef` takes. On a TrainState of shardings, their shardings."""
        return self.params if self.frozen is None else lora.join(self.params, self.frozen)

    def parameter_counts(self) -> dict[str, int]:
        """Trainable and frozen parameter counts (start-up report: LoRA trains a small fraction)."""
        return {"trainable": sum(math.prod(x.shape) for x in jax.tree.leaves(self.params)),
                "frozen": 0 if self.frozen is None else sum(math.prod(x.shape) for x in jax.tree.leaves(self.frozen))}


def _check_float32(params: Params) -> None:
    """Training keeps float32 master weights; bf16 belongs in ModelConfig.compute_dtype."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if leaf.dtype != jnp.float32:
            raise ValueError(
                f"parameter {jax.tree_util.keystr(path)} has dtype {leaf.dtype}; train with "
                "ModelConfig.param_dtype='float32' (set compute_dtype='bfloat16' for bf16 compute)")


def _new_state(graphdef: nnx.GraphDef, params: Params, tx: optax.GradientTransformation) -> TrainState:
    """A step-0 state; with adapters in `params`, they alone are trained and the base is frozen in the compute
    dtype."""
    frozen = None
    if lora.has_adapters(params):
        params, base = lora.split(params)
        dtype = jnp.dtype(nnx.merge(graphdef, lora.join(params, base)).cfg.compute_dtype)
        frozen = jax.tree.map(lambda w: w.astype(dtype), base)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      graphdef=graphdef, tx=tx, frozen=frozen)


def state_shardings(param_shardings: Params, abstract_train_state: TrainState, mesh: Mesh) -> TrainState:
    """A TrainState of NamedShardings: params as given (the loader's; with LoRA split into the adapters and the
    frozen base), optimizer moments mirror the trained params."""
    frozen = None
    if abstract_train_state.frozen is not None:
        param_shardings, frozen = lora.split(param_shardings)
    return abstract_train_state.replace(
        step=sharding.replicated(mesh),
        params=param_shardings,
        opt_state=sharding.mirror_shardings(abstract_train_state.opt_state, abstract_train_state.params,
                                            param_shardings, mesh),
        frozen=frozen)


def init_train_state(cfg: ModelConfig, tx: optax.GradientTransformation, key: jax.Array,
                     layout: sharding.Layout | None = None) -> tuple[TrainState, TrainState | None]:
    """A freshly initialised state (random weights from `key`, by the loader) and its shardings (None
    without a layout)."""
    param_key = jax.random.split(key)[0]
    weights = loader.init_weights(cfg, layout, param_key)
    return new_train_state(weights, tx, None if layout is None else layout.mesh)


def new_train_state(weights: loader.Weights, tx: optax.GradientTransformation,
                    mesh: Mesh | None) -> tuple[TrainState, TrainState | None]:
    """A step-0 state around `weights` (in their shardings, on `mesh`) and its shardings (None without a
    mesh); the optimizer state is created in its shardings."""
    abstract = jax.eval_shape(lambda p: _new_state(weights.graphdef, p, tx), weights.params)
    shardings = None if mesh is None else state_shardings(weights.shardings, abstract, mesh)
    return train_state_from_params(weights.graphdef, weights.params, tx, shardings), shardings


def abstract_train_state(weights: loader.Weights, tx: optax.GradientTransformation, mesh: Mesh
                         ) -> tuple[TrainState, TrainState]:
    """The step-0 state `new_train_state` would make around `weights` (arrays or ShapeDtypeStructs), as
    ShapeDtypeStructs in their shardings (for ahead-of-time lowering, allocating nothing), and its shardings."""
    abstract = jax.eval_shape(lambda p: _new_state(weights.graphdef, p, tx), weights.params)
    shardings = state_shardings(weights.shardings, abstract, mesh)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings), shardings


def train_state_from_params(graphdef: nnx.GraphDef, params: Params, tx: optax.GradientTransformation,
                            shardings: TrainState | None = None) -> TrainState:
    """A step-0 state around existing params (already in `shardings.params`: a misplaced one is an
    error, never a silent copy); the optimizer state is built in its shardings."""
    return state_initializer(graphdef, tx, shardings)(params)


def state_initializer(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, shardings: TrainState | None = None
                      ) -> Callable[[Params], TrainState]:
    """`train_state_from_params` of one (graphdef, tx, shardings), jitted once: a caller that keeps it (a run's
    programs, train/programs.py) creates every later state without tracing again."""
    init = jax.jit(lambda p: _new_state(graphdef, p, tx), out_shardings=shardings)

    def initialize(params: Params) -> TrainState:
        _check_float32(lora.split(params)[0] if lora.has_adapters(params) else params)
        if shardings is not None:
            loader.check_shardings(params, shardings.model_params(), what="train state params")
        return init(params)

    return initialize
