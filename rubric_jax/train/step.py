"""Pure train steps `(state, batch) -> (state, metrics)`: `grpo_train_step` and `sft_train_step`, sharing
micro-batch accumulation and the guarded optimizer update; `jit_sequence_logprobs` for the reference and
behaviour log-probs a rollout feeds in the batch; `jit_*` helpers that compile each once with shardings
(and a donated state).

Batches are dicts of arrays with a leading batch dim B (rows b*G + j = sample j of question b), all
per-token arrays aligned with `tokens` (see rubric_jax.grpo):
  GRPO: tokens [B,T] int32, input_mask [B,T] bool (real tokens), loss_mask [B,T] bool (response
        tokens trained on), old_logp [B,T] float32 (behaviour log-probs), advantages [B] float32,
        and ref_logp [B,T] float32 (reference log-probs) exactly when kl_coef > 0. Every log-prob is
        of softmax(logits / cfg.temperature), the rollout sampler's distribution.
  SFT:  tokens, input_mask, loss_mask.
`loss_mask` is intersected with `input_mask` and position 0 is never a target, so prompt and padding
tokens never contribute. Loss weights are computed once from the whole batch, then the batch is split
into `micro_batches` slices whose gradients are summed under `lax.scan`: the result equals one big
batch. Micro-batch m holds rows m, m+M, m+2M, ... so a batch sharded in contiguous blocks stays
sharded over every device in each micro-batch (B/M must be divisible by the batch-sharding size).

A step whose loss or gradient norm is not finite leaves params and optimizer state untouched and
reports `skipped` = 1 (the step counter still advances).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from rubric_jax import grpo, sharding
from rubric_jax.train.state import Params, TrainState, current_lr

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
GRPO_BATCH_KEYS = ("tokens", "input_mask", "loss_mask", "old_logp", "advantages")
REF_LOGP = "ref_logp"  # the reference log-probs' batch key, present exactly when kl_coef > 0
SFT_BATCH_KEYS = ("tokens", "input_mask", "loss_mask")
LossFn = Callable[[Params, Batch], tuple[jax.Array, Metrics]]


def _check_batch(batch: Batch, keys: tuple[str, ...], micro_batches: int) -> int:
    """Validates keys and shapes at trace time; returns B."""
    if set(batch) != set(keys):
        raise ValueError(f"batch keys {sorted(batch)}: expected exactly {sorted(keys)}")
    b, t = batch["tokens"].shape
    for name in keys:
        want = (b,) if name == "advantages" else (b, t)
        if batch[name].shape != want:
            raise ValueError(f"batch[{name!r}] has shape {batch[name].shape}, expected {want}")
    for name in keys:
        kind = {"tokens": jnp.integer, "input_mask": jnp.bool_, "loss_mask": jnp.bool_}.get(name, jnp.floating)
        if not jnp.issubdtype(batch[name].dtype, kind):
            raise ValueError(f"batch[{name!r}] has dtype {batch[name].dtype}, expected {kind.__name__}")
    _check_micro_batches(b, micro_batches)
    return b


def _check_micro_batches(b: int, micro_batches: int) -> None:
    if micro_batches < 1 or b % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must be >= 1 and divide the batch size {b}")


def _target_mask(batch: Batch) -> jax.Array:
    """Response tokens that are real and have a predecessor (position 0 is never predicted)."""
    t = batch["tokens"].shape[1]
    return batch["loss_mask"] & batch["input_mask"] & (jnp.arange(t) > 0)[None, :]


def grpo_batch_keys(cfg: grpo.GRPOConfig) -> tuple[str, ...]:
    """The GRPO batch's keys: `ref_logp` only with a KL term (β = 0 computes no reference log-probs)."""
    return GRPO_BATCH_KEYS + ((REF_LOGP,) if cfg.kl_coef > 0 else ())


def _split_micro(tree: Any, micro_batches: int) -> Any:
    """[B, ...] -> [M, B/M, ...] with micro-batch m = rows m, m+M, ... (no resharding of the B dim)."""

    def split(x: jax.Array) -> jax.Array:
        return jnp.swapaxes(x.reshape(x.shape[0] // micro_batches, micro_batches, *x.shape[1:]), 0, 1)

    return jax.tree.map(split, tree)


def _merge_micro(x_MxBxT: jax.Array) -> jax.Array:
    """The inverse of `_split_micro` for one array: [M, B/M, ...] -> [B, ...]."""
    return jnp.swapaxes(x_MxBxT, 0, 1).reshape(-1, *x_MxBxT.shape[2:])


def _constrain(tree: Any, shardings: Any | None) -> Any:
    return tree if shardings is None else jax.lax.with_sharding_constraint(tree, shardings)


def _accumulate(loss_fn: LossFn, params: Params, micro: Batch, grad_shardings: Any | None
                ) -> tuple[Params, Metrics]:
    """Sums gradients and (sum-form) metrics of `loss_fn` over the leading micro-batch axis."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    first = jax.tree.map(lambda x: x[0], micro)
    metrics_shape = jax.eval_shape(loss_fn, params, first)[1]

    def body(carry: tuple[Params, Metrics], mb: Batch) -> tuple[tuple[Params, Metrics], None]:
        grads_acc, metrics_acc = carry
        (_, metrics), grads = grad_fn(params, mb)
        grads_acc = _constrain(jax.tree.map(jnp.add, grads_acc, grads), grad_shardings)
        return (grads_acc, jax.tree.map(jnp.add, metrics_acc, metrics)), None

    zeros = (_constrain(jax.tree.map(jnp.zeros_like, params), grad_shardings),
             jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metrics_shape))
    (grads, metrics), _ = jax.lax.scan(body, zeros, micro)
    return grads, metrics


def _apply_update(state: TrainState, grads: Params, metrics: Metrics) -> tuple[TrainState, Metrics]:
    """Optimizer update unless the loss or gradient is not finite (then params/opt state are kept)."""
    grad_norm = optax.global_norm(grads)
    ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)

    def keep(new: jax.Array, old: jax.Array) -> jax.Array:
        return jnp.where(ok, new, old)

    params = jax.tree.map(keep, params, state.params)
    opt_state = jax.tree.map(keep, opt_state, state.opt_state)
    metrics = {**metrics, "grad_norm": grad_norm, "skipped": 1 - ok.astype(jnp.int32)}
    lr = current_lr(opt_state)
    if lr is not None:
        metrics["lr"] = lr
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def _train_step(state: TrainState, batch: Batch, loss_fn: LossFn, micro_batches: int,
                grad_shardings: Any | None) -> tuple[TrainState, Metrics]:
    grads, metrics = _accumulate(loss_fn, state.params, _split_micro(batch, micro_batches), grad_shardings)
    new_state, metrics = _apply_update(state, grads, metrics)
    metrics["num_tokens"] = batch["metric_w"].astype(bool).sum()
    return new_state, metrics


def _logprobs(graphdef: nnx.GraphDef, params: Params, batch: Batch, chunk_size: int, temperature: float
              ) -> tuple[jax.Array, jax.Array]:
    return grpo.sequence_logprobs(nnx.merge(graphdef, params), batch["tokens"], batch["input_mask"],
                                  chunk_size=chunk_size, temperature=temperature)


def grpo_train_step(state: TrainState, batch: Batch, *, cfg: grpo.GRPOConfig, micro_batches: int = 1,
                    grad_shardings: Any | None = None) -> tuple[TrainState, Metrics]:
    """One GRPO update from a batch that carries its behaviour (`old_logp`) and, when kl_coef > 0,
    reference (`ref_logp`) log-probs: the only forward here is the policy's."""
    _check_batch(batch, grpo_batch_keys(cfg), micro_batches)
    mask = _target_mask(batch)
    batch = {**batch, "loss_mask": mask, "loss_w": grpo.loss_weights(mask, cfg.loss_aggregation, cfg.loss_norm_length),
             "metric_w": grpo.token_mean_weights(mask)}

    def loss_fn(params: Params, mb: Batch) -> tuple[jax.Array, Metrics]:
        logp, entropy = _logprobs(state.graphdef, params, mb, cfg.logprob_chunk_size, cfg.temperature)
        ref_logp = mb[REF_LOGP] if cfg.kl_coef > 0 else None
        loss, metrics = grpo.grpo_objective(logp, mb["old_logp"], ref_logp, mb["advantages"], mb["loss_mask"],
                                            mb["loss_w"], mb["metric_w"], cfg)
        metrics["entropy"] = jnp.sum(mb["metric_w"] * jax.lax.stop_gradient(entropy))
        return loss, metrics

    return _train_step(state, batch, loss_fn, micro_batches, grad_shardings)


def sft_train_step(state: TrainState, batch: Batch, *, micro_batches: int = 1, chunk_size: int = 256,
                   grad_shardings: Any | None = None) -> tuple[TrainState, Metrics]:
    """One supervised update: mean negative log-likelihood over all response tokens of the batch."""
    _check_batch(batch, SFT_BATCH_KEYS, micro_batches)
    mask = _target_mask(batch)
    batch = {**batch, "loss_mask": mask, "metric_w": grpo.token_mean_weights(mask)}

    def loss_fn(params: Params, mb: Batch) -> tuple[jax.Array, Metrics]:
        logp, entropy = _logprobs(state.graphdef, params, mb, chunk_size, 1.0)
        loss = -jnp.sum(mb["metric_w"] * logp)
        return loss, {"loss": loss, "entropy": jnp.sum(mb["metric_w"] * jax.lax.stop_gradient(entropy))}

    return _train_step(state, batch, loss_fn, micro_batches, grad_shardings)


def _micro_batched_logprobs(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, input_mask: jax.Array, *,
                            temperature: float, chunk_size: int, micro_batches: int) -> jax.Array:
    """`grpo.sequence_logprobs` [B, T] over `micro_batches` slices in turn (the train step's split)."""
    _check_micro_batches(tokens.shape[0], micro_batches)

    def one(mb: Batch) -> jax.Array:
        return _logprobs(graphdef, params, mb, chunk_size, temperature)[0]

    micro = _split_micro({"tokens": tokens, "input_mask": input_mask}, micro_batches)
    return _merge_micro(jax.lax.map(one, micro))


def jit_sequence_logprobs(graphdef: nnx.GraphDef, *, temperature: float, chunk_size: int = 256,
                          micro_batches: int = 1, param_shardings: Any | None = None, mesh: Mesh | None = None
                          ) -> Callable[[Params, jax.Array, jax.Array], jax.Array]:
    """Teacher-forced log-probs [B, T] of softmax(logits / temperature) for `(params, tokens, input_mask)`,
    outside any gradient (a rollout's reference and behaviour log-probs; `grpo.sequence_logprobs`, the
    train step's own), compiled once: params in `param_shardings`, batch and result over (data, fsdp),
    `micro_batches` slices at a time so activations stay those of one train micro-batch."""
    if (param_shardings is None) != (mesh is None):
        raise ValueError("give both param_shardings and mesh, or neither")
    batch_sh = None if mesh is None else sharding.batch_sharding(mesh)
    fn = functools.partial(_micro_batched_logprobs, graphdef, temperature=temperature, chunk_size=chunk_size,
                           micro_batches=micro_batches)
    return jax.jit(fn, in_shardings=(param_shardings, batch_sh, batch_sh), out_shardings=batch_sh)


def _batch_shardings(keys: tuple[str, ...], mesh: Mesh | None) -> dict[str, Any] | None:
    return None if mesh is None else {k: sharding.batch_sharding(mesh) for k in keys}


def jit_grpo_step(cfg: grpo.GRPOConfig, *, micro_batches: int = 1, shardings: TrainState | None = None,
                  mesh: Mesh | None = None) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """`grpo_train_step` compiled once: state donated, batch over (data, fsdp), gradients laid out like
    the params. Without a mesh it runs unsharded on one device."""
    if (shardings is None) != (mesh is None):
        raise ValueError("give both shardings and mesh, or neither")
    step = functools.partial(grpo_train_step, cfg=cfg, micro_batches=micro_batches,
                             grad_shardings=None if shardings is None else shardings.params)
    out = None if mesh is None else (shardings, sharding.replicated(mesh))
    return jax.jit(step, in_shardings=(shardings, _batch_shardings(grpo_batch_keys(cfg), mesh)),
                   out_shardings=out, donate_argnums=0)


def jit_sft_step(*, micro_batches: int = 1, chunk_size: int = 256, shardings: TrainState | None = None,
                 mesh: Mesh | None = None) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """`sft_train_step` compiled once with shardings and a donated state (see `jit_grpo_step`)."""
    if (shardings is None) != (mesh is None):
        raise ValueError("give both shardings and mesh, or neither")
    step = functools.partial(sft_train_step, micro_batches=micro_batches, chunk_size=chunk_size,
                             grad_shardings=None if shardings is None else shardings.params)
    out = None if mesh is None else (shardings, sharding.replicated(mesh))
    return jax.jit(step, in_shardings=(shardings, _batch_shardings(SFT_BATCH_KEYS, mesh)),
                   out_shardings=out, donate_argnums=0)
