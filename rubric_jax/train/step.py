"""Pure train steps `(state, batch) -> (state, metrics)`: `grpo_train_step` and `sft_train_step`, sharing
micro-batch accumulation and the guarded optimizer update; `jit_rollout_logprobs` for the reference and
behaviour log-probs a rollout feeds in the batch; `jit_*` helpers that compile each once with shardings
(and a donated state).

Batches are dicts of arrays with a leading batch dim N (rows b*G + j = sample j of question b):
  GRPO: prompt_tokens [U,P] int32 and prompt_mask [U,P] bool (U = N/G: each group's prompt once, as the
        sampler took it; left- or right-padded), response_tokens [N,R] int32 and response_mask [N,R] bool
        (right-padded), loss_mask [N,R] bool (response tokens trained on), old_logp [N,R] float32
        (behaviour log-probs), advantages [N] float32, and ref_logp [N,R] float32 (reference
        log-probs) exactly when kl_coef > 0. Per-token arrays are aligned with response_tokens; every
        log-prob is of softmax(logits / cfg.temperature), the rollout sampler's distribution. Each
        group's prompt runs once (`grpo.shared_prompt_logprobs`), for the policy, its gradient and the
        rollout log-probs alike.
  SFT:  tokens [N,T], input_mask [N,T], loss_mask [N,T] (one sequence per row, `grpo.sequence_logprobs`).
`loss_mask` is intersected with the tokens that have a prediction (a real token with a real predecessor),
so prompt and padding tokens never contribute. Loss weights are computed once from the whole batch,
then the batch is split into `micro_batches` slices whose gradients are summed under `lax.scan`: the
result equals one big batch. The slices hold whole groups (GRPO) or rows (SFT): micro-batch m holds
groups m, m+M, m+2M, ... (and their prompts) so a batch sharded in contiguous blocks stays spread over the
devices in each micro-batch. When M does not divide the groups, each group is first split into equal parts of
consecutive rows, each with its own copy of the prompt (`_split_groups`): the micro-batch count follows memory,
not the group size. The prompt arrays take the sharding they arrive in (`batch_shardings`: over the
batch axes that divide U), the rest are over (data, fsdp).

A step whose loss or gradient norm is not finite leaves params and optimizer state untouched and
reports `skipped` = 1 (the step counter still advances).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from rubric_jax import grpo, sharding
from rubric_jax.models import lora
from rubric_jax.models.accumulating_layers import AccumulatingLayers, use_copy
from rubric_jax.models.config import ModelConfig
from rubric_jax.train.state import Params, TrainState, current_lr

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
PROMPT_KEYS = ("prompt_tokens", "prompt_mask")
RESPONSE_KEYS = ("response_tokens", "response_mask")
GRPO_BATCH_KEYS = (*PROMPT_KEYS, *RESPONSE_KEYS, "loss_mask", "old_logp", "advantages")
REF_LOGP = "ref_logp"  # the reference log-probs' batch key, present exactly when kl_coef > 0
BEHAVIOUR_WEIGHT = "behaviour_weight"  # truncated IS weights [N, R], present exactly with behaviour_correction_cap
SFT_BATCH_KEYS = ("tokens", "input_mask", "loss_mask")
LossFn = Callable[[Params, Batch, AccumulatingLayers | None], tuple[jax.Array, Metrics]]
_INTEGER_KEYS = ("tokens", "prompt_tokens", "response_tokens")
_BOOL_KEYS = ("input_mask", "prompt_mask", "response_mask", "loss_mask")


def _check_batch(batch: Batch, keys: tuple[str, ...], micro_batches: int, group_size: int = 1) -> None:
    """Validates keys, shapes and dtypes at trace time: [N] advantages, [N / group_size, P] prompt arrays,
    [N, T] the rest (T from `tokens` or `response_tokens`); micro-batches of whole groups of `group_size` rows."""
    if set(batch) != set(keys):
        raise ValueError(f"batch keys {sorted(batch)}: expected exactly {sorted(keys)}")
    n, t = batch["response_tokens" if "response_tokens" in batch else "tokens"].shape
    _check_micro_batches(n, micro_batches, group_size)
    p = batch["prompt_tokens"].shape[-1] if "prompt_tokens" in batch else None
    for name in keys:
        want = (n,) if name == "advantages" else (n // group_size, p) if name in PROMPT_KEYS else (n, t)
        if batch[name].shape != want:
            raise ValueError(f"batch[{name!r}] has shape {batch[name].shape}, expected {want}")
        kind = jnp.integer if name in _INTEGER_KEYS else jnp.bool_ if name in _BOOL_KEYS else jnp.floating
        if not jnp.issubdtype(batch[name].dtype, kind):
            raise ValueError(f"batch[{name!r}] has dtype {batch[name].dtype}, expected {kind.__name__}")


def _check_micro_batches(n: int, micro_batches: int, group_size: int) -> None:
    if n % group_size:
        raise ValueError(f"{n} rows are not whole groups of group_size={group_size}")
    if micro_batches < 1 or group_size % group_parts(n // group_size, micro_batches):
        what = (f"the batch size {n}" if group_size == 1 else f"the {n // group_size} groups of {group_size} rows, "
                "or split each group into equal parts that they divide")
        raise ValueError(f"micro_batches={micro_batches} must be >= 1 and divide {what}")


def group_parts(groups: int, micro_batches: int) -> int:
    """Into how many parts each group is split so that `micro_batches` divides the parts: 1 when it divides the
    groups (each micro-batch holds whole groups), else micro_batches / gcd(groups, micro_batches)."""
    return micro_batches // math.gcd(groups, micro_batches)


def _split_groups(batch: Batch, micro_batches: int, group_size: int) -> tuple[Batch, int]:
    """The batch with each group split into `group_parts` groups of consecutive rows, each with its own copy of
    the prompt, and their size: micro-batching chosen by memory, not by the group size (the rows of a micro-batch
    need not be whole groups; a split group's prompt runs once per part). Unchanged when the parts are 1."""
    parts = group_parts(batch["prompt_tokens"].shape[0], micro_batches)
    if parts == 1:
        return batch, group_size
    return {k: jnp.repeat(x, parts, axis=0) if k in PROMPT_KEYS else x for k, x in batch.items()}, group_size // parts


def _sft_target_mask(batch: Batch) -> jax.Array:
    """Response tokens that are real and have a predecessor (position 0 is never predicted)."""
    t = batch["tokens"].shape[1]
    return batch["loss_mask"] & batch["input_mask"] & (jnp.arange(t) > 0)[None, :]


def grpo_batch_keys(cfg: grpo.GRPOConfig) -> tuple[str, ...]:
    """The GRPO batch's keys: `ref_logp` only with a KL term (β = 0 computes no reference log-probs), and
    `behaviour_weight` only with the sampler/trainer correction."""
    return (GRPO_BATCH_KEYS + ((REF_LOGP,) if cfg.kl_coef > 0 else ())
            + ((BEHAVIOUR_WEIGHT,) if cfg.behaviour_correction_cap is not None else ()))


def _split_micro(batch: Batch, micro_batches: int, group_size: int = 1) -> Batch:
    """[N, ...] -> [M, N/M, ...] with micro-batch m = groups m, m+M, ... of `group_size` consecutive rows, and
    the prompts [U, P] -> [M, U/M, P] alike (one row per group): no resharding of the N dim when every device
    holds whole groups of each micro-batch."""

    def split(x: jax.Array, rows: int) -> jax.Array:
        n, rest = x.shape[0], x.shape[1:]
        grouped = x.reshape(n // (micro_batches * rows), micro_batches, rows, *rest)
        return jnp.swapaxes(grouped, 0, 1).reshape(micro_batches, n // micro_batches, *rest)

    return {k: split(x, 1 if k in PROMPT_KEYS else group_size) for k, x in batch.items()}


def _merge_micro(x_MxBxT: jax.Array, group_size: int = 1) -> jax.Array:
    """The inverse of `_split_micro` for one array: [M, N/M, ...] -> [N, ...]."""
    m, rows, rest = x_MxBxT.shape[0], x_MxBxT.shape[1], x_MxBxT.shape[2:]
    grouped = x_MxBxT.reshape(m, rows // group_size, group_size, *rest)
    return jnp.swapaxes(grouped, 0, 1).reshape(m * rows, *rest)


def _constrain(tree: Any, shardings: Any | None) -> Any:
    return tree if shardings is None else jax.lax.with_sharding_constraint(tree, shardings)


def _layer_copies(params: Params, dtype: Any, grad_shardings: Any | None) -> Params | None:
    """The decoder layers' weights in the compute `dtype`, in their own layout, made once per update (None when
    they already are in it): read by every micro-batch's forward and rematerialised backward, where a cast at use
    ran again in each (~240 GB per 1.5B update on an H200, benchmarks/AOT_RESULTS.md). The embedding stays
    float32: its lookup's gradient sums tokens into rows in float32."""
    layers = params["layers"]
    if all(w.dtype == dtype for w in jax.tree.leaves(layers)):
        return None
    return _constrain(jax.tree.map(lambda w: w.astype(dtype), layers),
                      None if grad_shardings is None else grad_shardings["layers"])


def _per_layer(stacked: Params, num_layers: int) -> tuple[Params, ...]:
    """The stacked layer weights as L per-layer trees, each its own arrays (made once per update): what unrolled
    layers read in place, where a slice of the stack is a copy in every micro-batch's forward and backward."""
    return tuple(jax.tree.map(lambda w, i=i: w[i], stacked) for i in range(num_layers))


def _accumulate(loss_fn: LossFn, params: Params, micro: Batch, grad_shardings: Any | None, model_cfg: ModelConfig,
                frozen: Params | None = None, head: Callable[[], jax.Array] | None = None) -> tuple[Params, Metrics]:
    """Sums gradients and (sum-form) metrics of `loss_fn` over the leading micro-batch axis; the layers' weights
    are cast to the compute dtype once, before the loop (`_layer_copies`). Under full remat the layers' backward
    adds their gradient into the accumulator itself (`AccumulatingLayers`); otherwise each micro-batch's is added
    after its backward. With `frozen` (LoRA's base, already in the compute dtype) `params` are the adapters: the
    only leaves differentiated. With the accumulating layers, the LM head's projection as the log-probs read it
    (`head()`) is made once before the loop too (`AccumulatingLayers.head`), and unrolled layers (`cfg.scan_layers`
    off) read a copy of their own each (`_per_layer`)."""
    if frozen is not None:
        with_base = loss_fn

        def loss_fn(p: Params, mb: Batch, into: AccumulatingLayers | None) -> tuple[jax.Array, Metrics]:
            return with_base(lora.join(p, frozen), mb, into)

    copies = None if frozen is not None else _layer_copies(params, jnp.dtype(model_cfg.compute_dtype), grad_shardings)
    accumulating = copies is not None and model_cfg.remat and model_cfg.remat_policy == "full"
    if accumulating and not model_cfg.scan_layers:
        copies = _per_layer(copies, model_cfg.num_layers)
    if copies is not None and not accumulating:
        inner = loss_fn

        def loss_fn(p: Params, mb: Batch, into: AccumulatingLayers | None) -> tuple[jax.Array, Metrics]:
            return inner({**p, "layers": jax.tree.map(use_copy, p["layers"], copies)}, mb, into)

    projection = head() if accumulating and head is not None else None
    first = jax.tree.map(lambda x: x[0], micro)
    metrics_shape = jax.eval_shape(loss_fn, params, first, None)[1]

    def body(carry: tuple[Params, Metrics], mb: Batch) -> tuple[tuple[Params, Metrics], None]:
        grads_acc, metrics_acc = carry
        into = AccumulatingLayers(copies, grads_acc["layers"], projection) if accumulating else None
        (_, metrics), grads = jax.value_and_grad(lambda p: loss_fn(p, mb, into), has_aux=True)(params)
        grads_acc = {k: grads[k] if into is not None and k == "layers" else jax.tree.map(jnp.add, grads_acc[k], g)
                     for k, g in grads.items()}
        return (_constrain(grads_acc, grad_shardings), jax.tree.map(jnp.add, metrics_acc, metrics)), None

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


def _train_step(state: TrainState, batch: Batch, group_size: int, loss_fn: LossFn, micro_batches: int,
                grad_shardings: Any | None, chunk_size: int) -> tuple[TrainState, Metrics]:
    micro = _split_micro(batch, micro_batches, group_size)
    model = nnx.merge(state.graphdef, state.model_params())
    tokens = batch["response_tokens" if "response_tokens" in batch else "tokens"].shape[1]
    grads, metrics = _accumulate(loss_fn, state.params, micro, grad_shardings, model.cfg, state.frozen,
                                 lambda: model.vocab_projection(grpo.vocab_slices(model.cfg.vocab_size, tokens,
                                                                                  chunk_size)))
    new_state, metrics = _apply_update(state, grads, metrics)
    metrics["num_tokens"] = batch["metric_w"].astype(bool).sum()
    return new_state, metrics


def _rollout_logprobs(graphdef: nnx.GraphDef, params: Params, batch: Batch, chunk_size: int, temperature: float,
                      into: AccumulatingLayers | None = None) -> tuple[jax.Array, jax.Array]:
    """`grpo.shared_prompt_logprobs` [N, R] of a batch (or slice) of whole groups: each group's prompt runs
    once."""
    return grpo.shared_prompt_logprobs(
        nnx.merge(graphdef, params), batch["prompt_tokens"], batch["prompt_mask"], batch["response_tokens"],
        batch["response_mask"], chunk_size=chunk_size, temperature=temperature, into=into)


def grpo_train_step(state: TrainState, batch: Batch, *, cfg: grpo.GRPOConfig, micro_batches: int = 1,
                    grad_shardings: Any | None = None) -> tuple[TrainState, Metrics]:
    """One GRPO update from a batch that carries its behaviour (`old_logp`) and, when kl_coef > 0,
    reference (`ref_logp`) log-probs: the only forward here is the policy's (each group's prompt once)."""
    g = cfg.group_size
    _check_batch(batch, grpo_batch_keys(cfg), micro_batches, g)
    mask = batch["loss_mask"] & grpo.response_targets(batch["prompt_mask"], batch["response_mask"])
    batch = {**batch, "loss_mask": mask, "loss_w": grpo.loss_weights(mask, cfg.loss_aggregation, cfg.loss_norm_length),
             "metric_w": grpo.token_mean_weights(mask)}

    def loss_fn(params: Params, mb: Batch, into: AccumulatingLayers | None) -> tuple[jax.Array, Metrics]:
        logp, entropy = _rollout_logprobs(state.graphdef, params, mb, cfg.logprob_chunk_size, cfg.temperature, into)
        ref_logp = mb[REF_LOGP] if cfg.kl_coef > 0 else None
        loss, metrics = grpo.grpo_objective(logp, mb["old_logp"], ref_logp, mb["advantages"], mb["loss_mask"],
                                            mb["loss_w"], mb["metric_w"], cfg, mb.get(BEHAVIOUR_WEIGHT),
                                            entropy if cfg.entropy_coef > 0 else None)
        metrics["entropy"] = jnp.sum(mb["metric_w"] * jax.lax.stop_gradient(entropy))
        return loss, metrics

    return _train_step(state, *_split_groups(batch, micro_batches, g), loss_fn, micro_batches, grad_shardings,
                       cfg.logprob_chunk_size)


def sft_train_step(state: TrainState, batch: Batch, *, micro_batches: int = 1, chunk_size: int = 256,
                   grad_shardings: Any | None = None) -> tuple[TrainState, Metrics]:
    """One supervised update: mean negative log-likelihood over all response tokens of the batch."""
    _check_batch(batch, SFT_BATCH_KEYS, micro_batches)
    mask = _sft_target_mask(batch)
    batch = {**batch, "loss_mask": mask, "metric_w": grpo.token_mean_weights(mask)}

    def loss_fn(params: Params, mb: Batch, into: AccumulatingLayers | None) -> tuple[jax.Array, Metrics]:
        logp, entropy = grpo.sequence_logprobs(nnx.merge(state.graphdef, params), mb["tokens"], mb["input_mask"],
                                               chunk_size=chunk_size, temperature=1.0, into=into)
        loss = -jnp.sum(mb["metric_w"] * logp)
        return loss, {"loss": loss, "entropy": jnp.sum(mb["metric_w"] * jax.lax.stop_gradient(entropy))}

    return _train_step(state, batch, 1, loss_fn, micro_batches, grad_shardings, chunk_size)


def logprob_inputs(batch: Batch) -> tuple[jax.Array, ...]:
    """The arrays of a GRPO batch that `jit_rollout_logprobs` takes after the params, in its order."""
    return tuple(batch[k] for k in PROMPT_KEYS + RESPONSE_KEYS)


def _micro_batched_logprobs(graphdef: nnx.GraphDef, params: Params, *arrays: jax.Array, group_size: int,
                            temperature: float, chunk_size: int, micro_batches: int) -> jax.Array:
    """`_rollout_logprobs` [N, R] over `micro_batches` slices of whole groups in turn (the train step's split)."""
    batch = dict(zip(PROMPT_KEYS + RESPONSE_KEYS, arrays))
    _check_batch(batch, PROMPT_KEYS + RESPONSE_KEYS, micro_batches, group_size)
    batch, group_size = _split_groups(batch, micro_batches, group_size)

    def one(mb: Batch) -> jax.Array:
        return _rollout_logprobs(graphdef, params, mb, chunk_size, temperature)[0]

    return _merge_micro(jax.lax.map(one, _split_micro(batch, micro_batches, group_size)), group_size)


def jit_rollout_logprobs(graphdef: nnx.GraphDef, *, group_size: int, temperature: float, chunk_size: int = 256,
                         micro_batches: int = 1, param_shardings: Any | None = None, mesh: Mesh | None = None
                         ) -> Callable[..., jax.Array]:
    """Teacher-forced response log-probs [N, R] of softmax(logits / temperature) for
    `(params, prompt_tokens, prompt_mask, response_tokens, response_mask)` (a GRPO batch's arrays) outside
    any gradient: a rollout's reference and behaviour log-probs, by the train step's own function (each
    group's prompt once), compiled once: params in `param_shardings`, responses and result over (data, fsdp),
    prompts as they come (`batch_shardings`), `micro_batches` slices at a time so activations stay those of
    one train micro-batch."""
    if (param_shardings is None) != (mesh is None):
        raise ValueError("give both param_shardings and mesh, or neither")
    batch_sh = None if mesh is None else sharding.batch_sharding(mesh)
    fn = functools.partial(_micro_batched_logprobs, graphdef, group_size=group_size, temperature=temperature,
                           chunk_size=chunk_size, micro_batches=micro_batches)
    return jax.jit(fn, in_shardings=(param_shardings, None, None, batch_sh, batch_sh), out_shardings=batch_sh)


def batch_shardings(batch: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    """Where a batch's arrays live on `mesh`: rows over (data, fsdp), the prompts [U, P] over those of the axes
    that divide U (the GRPO programs take the prompts' sharding as it comes)."""
    return {k: sharding.batch_sharding(mesh, x.shape if k in PROMPT_KEYS else None) for k, x in batch.items()}


def _batch_shardings(keys: tuple[str, ...], mesh: Mesh | None) -> dict[str, Any] | None:
    """The jitted steps' batch in_shardings: over (data, fsdp), the prompts as they come (their U need not
    divide the mesh)."""
    return None if mesh is None else {k: None if k in PROMPT_KEYS else sharding.batch_sharding(mesh) for k in keys}


def jit_grpo_step(cfg: grpo.GRPOConfig, *, micro_batches: int = 1, shardings: TrainState | None = None,
                  mesh: Mesh | None = None) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """`grpo_train_step` compiled once: state donated, batch over (data, fsdp) (the prompts as they come:
    `batch_shardings`), gradients laid out like the params. Without a mesh it runs unsharded on one device."""
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
