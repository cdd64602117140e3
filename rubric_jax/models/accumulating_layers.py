"""The in-place gradient loop over a decoder's layers: a training forward that adds each layer's weight gradient
into its slice of the caller's accumulator inside the layers' backward, and `use_copy`, which reads a compute-dtype
copy of a weight made once per update while its gradient still reaches the float32 master weight.

Why: the GRPO update's micro-batch loop (`train/step.py`) accumulates the layers' gradient over its micro-batches.
Autodiff of a layer scan writes each micro-batch's layer gradients into a new stacked float32 array, which the
loop then adds to its accumulator: two passes more over the float32 gradient per micro-batch. With
`AccumulatingLayers` the layers' backward (a custom VJP, `layers_into`; full remat) reads, adds and writes each
layer's slice in place as it is made (the 1.5B update on an H200: 407.5 -> 372.1 GB of non-matmul traffic), and
unrolled layers read per-layer bf16 copies made once per update, with no slice copied per micro-batch (352.1 -> 296.2
GB; benchmarks/AOT_RESULTS.md, issue 33). Used only when the layers compute below float32 under full remat
(`train/step.py`); `Transformer._layers` runs it when given `into`; the layer loop itself is
`layer_loop.run_layers`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rubric_jax.models.config import ModelConfig
from rubric_jax.models.layer_loop import run_layers

Params = dict[str, Any]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AccumulatingLayers:
    """What a training forward reads for the decoder layers and where their gradient goes: `compute`, the stacked
    layer weights in the compute dtype (cast once per update), are what the layers compute with, and the gradient
    of the model's own (master) layer weights comes out as `grads` plus this forward's, each layer's added into
    its slice of `grads` in the layers' backward loop (in place: no stacked per-forward gradient written, then
    added). Both trees are shaped as the model's stacked layers, `grads` in their dtype; `compute` may instead be
    a tuple of L per-layer trees (unrolled layers read them in place: no slice copied per forward). `head`: the
    LM head's `vocab_projection(n)` made once per update, which the log-probs read in place of the head's own
    cast (`grpo.chunked_token_logprobs`; its gradient still reaches the head's master weight), or None."""

    compute: Params | tuple[Params, ...]
    grads: Params
    head: jax.Array | None = None


@jax.custom_vjp
def use_copy(w: jax.Array, copy: jax.Array) -> jax.Array:
    """`copy` (w cast to the compute dtype once per update) where `w` would be read: the forward reads the copy,
    the gradient goes to `w` in w's dtype."""
    return copy


def _use_copy_fwd(w: jax.Array, copy: jax.Array) -> tuple[jax.Array, jax.Array]:
    return copy, jnp.zeros((), w.dtype)  # the residual only carries the dtype


def _use_copy_bwd(like: jax.Array, g: jax.Array) -> tuple[jax.Array, None]:
    return g.astype(like.dtype), None


use_copy.defvjp(_use_copy_fwd, _use_copy_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def layers_into(cfg: ModelConfig, layer: Callable[[Any, Any], tuple[Any, Any]], carry: Any, masters: Params,
                compute: Params | tuple[Params, ...], grads: Params, extra: Any) -> Any:
    """The last carry of `layer(carry, (compute[l], extra[l]))` over the L layers, differentiable in `carry` and
    in `masters` (the model's stacked layer weights, which it does not read): their gradient is `grads` plus this
    forward's gradient of `compute`, in `grads`' dtype. `compute` is stacked (a loop over the layers slices it)
    or a tuple of L per-layer trees (the layers unrolled, each reading its own arrays in place).

    Why: the backward loop adds each layer's weight gradient into its slice of `grads` as it is made (read, add,
    write in place), where autodiff of a layer scan writes it into a new stacked array for the caller to add to
    its accumulator (two passes more over the float32 gradient per micro-batch; benchmarks/AOT_RESULTS.md). The
    forward keeps each layer's input carry and the backward recomputes the layer (cfg.remat with nothing kept)."""
    del masters, grads
    return _layers_into_fwd(cfg, layer, carry, None, compute, None, extra)[0]


def _layers_into_fwd(cfg: ModelConfig, layer: Callable[[Any, Any], tuple[Any, Any]], carry: Any, masters: Params,
                     compute: Params | tuple[Params, ...], grads: Params, extra: Any) -> tuple[Any, tuple[Any, ...]]:
    del masters
    if isinstance(compute, tuple):  # per-layer arrays: unrolled, each layer's input kept as its own array
        inputs = []
        for index, weights in enumerate(compute):
            inputs.append(carry)
            carry = layer(carry, (weights, _layer_slice(extra, index)))[0]
        return carry, (tuple(inputs), compute, grads, extra)

    def keep_input(c: Any, xs: Any) -> tuple[Any, Any]:
        return layer(c, xs)[0], c

    out, inputs = run_layers(cfg, keep_input, carry, (compute, extra))
    return out, (inputs, compute, grads, extra)


def _layers_into_bwd(cfg: ModelConfig, layer: Callable[[Any, Any], tuple[Any, Any]], residuals: tuple[Any, ...],
                     d_out: Any) -> tuple[Any, Params, None, None, None]:
    inputs, compute, grads, extra = residuals
    unrolled = isinstance(compute, tuple)

    def back(index: jax.Array | int, d_carry: Any, grads: Params) -> tuple[Any, Params]:
        if unrolled:  # behind a barrier with the layer's output gradient and the accumulator: else XLA merges the
            # recompute with the forward (keeping its activations) or runs the layers out of order
            c, w, d_carry, grads = jax.lax.optimization_barrier((inputs[index], compute[index], d_carry, grads))
        else:
            c, w = _layer_slice((inputs, compute), index)
        e = _layer_slice(extra, index)
        _, pullback = jax.vjp(lambda c, w: layer(c, (w, e))[0], c, w)
        d_carry, d_w = pullback(d_carry)
        return d_carry, jax.tree.map(lambda g, d: _add_into(g, index, d), grads, d_w)

    if unrolled or not cfg.scan_layers:
        d_in = d_out
        for index in reversed(range(cfg.num_layers)):
            d_in, grads = back(index, d_in, grads)
        return d_in, grads, None, None, None
    # Last layer to first, the loop's counter the layer index (the slices and `_add_into` read it as is).
    _, d_in, grads = jax.lax.while_loop(lambda s: s[0] >= 0, lambda s: (s[0] - 1, *back(s[0], *s[1:])),
                                        (jnp.int32(cfg.num_layers - 1), d_out, grads))
    return d_in, grads, None, None, None


layers_into.defvjp(_layers_into_fwd, _layers_into_bwd)


def _layer_slice(stacks: Any, index: jax.Array | int) -> Any:
    """Slice `index` (in [0, L)) of each stacked array of a tree, the index used as given (no wrap of negative
    indices)."""
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, index, keepdims=False, allow_negative_indices=False),
                        stacks)


def _add_into(stack_LxA: jax.Array, index: jax.Array | int, x_A: jax.Array) -> jax.Array:
    """`stack_LxA` with `x_A` added into slice `index` (in [0, L)): one read and one write of that slice, in place.

    A scatter-add, which XLA's GPU compiler turns into one in-place fusion of the slice's read, the add and the
    write; written as a dynamic slice, an add and a dynamic update slice, the read stayed a kernel of its own
    (a copy of the slice) even with the same index value."""
    return stack_LxA.at[index].add(x_A.astype(stack_LxA.dtype), mode="promise_in_bounds", unique_indices=True,
                                   indices_are_sorted=True)
