"""Qwen2 / Llama decoder as an NNX module with stacked layers and an explicit KV cache: parameters, embedding,
projections, RoPE, RMSNorm, MLP and the layer stack here; the attention maths in models/attention.py, the cache's
layout in models/kv_cache.py, the loop over the layers in models/layer_loop.py, and a training forward's in-place
gradient loop over them in models/accumulating_layers.py.

Einsum legend: B batch, T new tokens, S attended (cache) slots, D hidden, V vocab, N query heads,
K key/value heads, G query heads per KV head (N = K·G), H head dim, F MLP width, L layers,
C classifier labels, U shared prefixes, J continuations per prefix (B = U·J), P prefix slots, M query rows
of one KV head in an attention dot (T·G per row; J·T·G per prefix).

The head is an LM head (causal LM) or, when `cfg.num_labels > 0`, a bias-free `score` projection
[D, C] read at one token per row (HF *ForSequenceClassification, e.g. a scalar reward model).

Besides the plain forward (optionally over a KV cache), a prefix + continuation forward
(`prefix_continuation_states`) runs U prefixes once and B = U·J continuations, row b attending [the
keys/values of prefix b // J ; its own causal prefix]: J rows that share a prefix pay for it once, and
the prefix's hidden states receive the summed gradient of its J rows. A cached forward continues shared
prefixes the same way (`kv_cache.SharedPrefix`: a sampler's prompts, each cached once for its J samples).

`cfg.attention` picks the attention of a forward without a KV cache (training, log-probs): our einsums, or
`jax.nn.dot_product_attention` ("xla", or "cudnn": flash attention that never writes the scores).

The module only holds parameters (named after the HF submodules so checkpoint mapping is a short
table); the maths lives in pure functions over plain arrays so that the layer stack runs under
`lax.scan` (or a Python loop) over parameters stacked on a leading L axis.

Placement: parameters carry logical axis names, and the residual stream is handed, at the start of
every layer, to an optional `shard_activation(x, RESIDUAL_AXES)` given at construction. The caller maps
the names to a mesh (rubric_jax.sharding.Layout); this module knows no mesh.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rubric_jax.models import attention
from rubric_jax.models.accumulating_layers import AccumulatingLayers, layers_into
from rubric_jax.models.attention import ShardActivation, attend, attend_continuations
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.kv_cache import KVCache, SharedPrefix
from rubric_jax.models.layer_loop import run_layers
from rubric_jax.models.lora import delta as lora_delta

Params = dict[str, Any]
_INIT_STD = 0.02  # HF initializer_range default for Qwen2 and Llama.
# Logical names of the residual stream [B, T, D], passed to `shard_activation` once per layer.
RESIDUAL_AXES = ("batch", "length", "activation_embed")
# The shared prefixes' residual stream [U, P, D]: U may be fewer than the batch shards, so the layout may
# split the prefix length over the shards its U leaves unused (token-wise maths; attention gathers K/V).
PREFIX_RESIDUAL_AXES = ("batch", "prefix_length", "activation_embed")
# The prefixes' token ids [U, P], split as their residual stream: the embedding's gradient then reaches the
# table without a reshard from a P split into a U split (a full rematerialisation in the 7B dry run's log).
PREFIX_TOKEN_AXES = PREFIX_RESIDUAL_AXES[:2]
# The shared prefixes' keys/values [U, K, P, H] as every query reads them: whole along P. Gathered once per
# layer from the length-split projection, for the prefixes' own attention and their continuations'; left to
# the compiler, the continuations' reshard of a P split into a U split was a full rematerialisation.
PREFIX_KV_AXES = ("batch", "kv_heads", "length", "head_dim")


def unstack_layers(params: Params, num_layers: int, take: Callable[[Any, int], Any] = lambda a, i: a[i]) -> Params:
    """A model's pure params with the layer stack (`params["layers"]`, leaves [L, ...]) as a tuple of L
    per-layer trees: what a decode loop reads in place (see `Transformer.hidden_states`). `take(leaf, i)`
    picks layer i of a leaf (default: a slice, i.e. a copy of arrays; loader passes one for shardings)."""
    return {**params, "layers": tuple(jax.tree.map(lambda a, i=i: take(a, i), params["layers"])
                                      for i in range(num_layers))}


def stack_layers(params: Params) -> Params:
    """The inverse of `unstack_layers` (arrays): the per-layer trees stacked on a leading L axis again."""
    return {**params, "layers": jax.tree.map(lambda *layers: jnp.stack(layers), *params["layers"])}


def has_layer_stack(params: Params) -> bool:
    """Whether `params["layers"]` is the stacked tree (else a tuple of per-layer trees, `unstack_layers`)."""
    return not isinstance(params["layers"], tuple)


def padding_to_positions(input_mask_BxT: jax.Array) -> jax.Array:
    """RoPE positions for (left- or right-) padded rows: the index among real tokens, 0 on padding."""
    return jnp.maximum(jnp.cumsum(input_mask_BxT.astype(jnp.int32), axis=-1) - 1, 0)


def causal_padding_mask(input_mask_BxT: jax.Array) -> jax.Array:
    """[B, T, T] mask: a query attends to earlier-or-same slots that hold real tokens."""
    t = input_mask_BxT.shape[-1]
    causal_TxT = jnp.tril(jnp.ones((t, t), dtype=bool))
    return causal_TxT[None, :, :] & input_mask_BxT.astype(bool)[:, None, :]


def _gathered_names(names: tuple[str | None, ...]) -> tuple[str | None, ...]:
    """A weight's logical names with `embed` (FSDP's split) unsplit: the layout a dot reads it in."""
    return tuple("activation_embed" if n == "embed" else n for n in names)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def for_compute(w: jax.Array, names: tuple[str | None, ...], dtype: Any, shard: ShardActivation) -> jax.Array:
    """A weight with logical axis `names` made ready for its dots: cast to the compute `dtype` in its own layout,
    then laid out whole along `embed` by `shard` (tensor-parallel splits kept); its gradient goes back to the
    weight's own layout, then its dtype.

    Why: under FSDP this pins the weight's all-gather after the cast, in the forward and in a rematerialised
    backward alike (with the cast left to XLA, the 7B update's backward gathered the float32 master weights,
    184 GiB per update), and the gradient's way back to one reduce-scatter (the transpose of a plain sharding
    constraint all-reduces it). XLA reduces the gradient in the dtype the dot made it in: bf16 for the layers'
    bf16 dots and for the vocabulary slices' (`grpo._low_precision_logits`). benchmarks/AOT_RESULTS.md."""
    return shard(shard(w.astype(dtype), names), _gathered_names(names))


def _for_compute_fwd(w: jax.Array, names: tuple[str | None, ...], dtype: Any, shard: ShardActivation
                     ) -> tuple[jax.Array, jax.Array]:
    return for_compute(w, names, dtype, shard), jnp.zeros((), w.dtype)  # the residual only carries the dtype


def _for_compute_bwd(names: tuple[str | None, ...], dtype: Any, shard: ShardActivation, like: jax.Array,
                     g: jax.Array) -> tuple[jax.Array]:
    return (shard(g.astype(like.dtype), names),)


for_compute.defvjp(_for_compute_fwd, _for_compute_bwd)


def _param(rngs: nnx.Rngs | None, shape: tuple[int, ...], dtype: Any, names: tuple[str | None, ...],
           init: str) -> nnx.Param:
    """A parameter with logical axis names (mapped to mesh axes by rubric_jax.sharding)."""
    if init == "normal":
        value = _INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        value = jnp.zeros(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), sharding_names=names, eager_sharding=False)


class _Projection(nnx.Module):
    """A stacked linear map: kernel [L, in..., out...] and optional bias [L, out...]; with `lora` (the rank and
    how many leading and input axes the kernel has) also the adapters lora_a [lead..., in..., r] (PEFT's kaiming
    uniform) and lora_b [lead..., r, out...] (zeros: the adapted map starts as the kernel's). models/lora.py."""

    def __init__(self, rngs: nnx.Rngs, dtype: Any, kernel_shape: tuple[int, ...],
                 kernel_names: tuple[str | None, ...], bias_ndim: int = 0,
                 lora: tuple[int, int, int] | None = None):
        self.kernel = _param(rngs, kernel_shape, dtype, kernel_names, "normal")
        if bias_ndim:
            self.bias = _param(rngs, (kernel_shape[0], *kernel_shape[-bias_ndim:]), dtype,
                               (kernel_names[0], *kernel_names[-bias_ndim:]), "zeros")
        if lora is not None:
            rank, lead, n_in = lora
            cut = lead + n_in
            fan_in = math.prod(kernel_shape[lead:cut])
            bound = 1 / math.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)), PEFT's default for lora_A
            a = jax.random.uniform(rngs.params(), (*kernel_shape[:cut], rank), jnp.float32, -bound, bound)
            self.lora_a = nnx.Param(a.astype(dtype), sharding_names=(*kernel_names[:cut], None),
                                    eager_sharding=False)
            self.lora_b = _param(None, (*kernel_shape[:lead], rank, *kernel_shape[cut:]), dtype,
                                 (*kernel_names[:lead], None, *kernel_names[cut:]), "zeros")


def _lora(cfg: ModelConfig, name: str, lead: int = 1, n_in: int = 1) -> tuple[int, int, int] | None:
    """The `lora` argument of projection `name` (HF name) of `cfg`: None unless cfg.lora targets it."""
    return None if cfg.lora is None or name not in cfg.lora.targets else (cfg.lora.rank, lead, n_in)


def lora_scale(cfg: ModelConfig) -> float:
    """alpha / rank of cfg's adapters (0 without: no projection then holds any)."""
    return 0.0 if cfg.lora is None else cfg.lora.scale


class _RMSNorm(nnx.Module):
    def __init__(self, shape: tuple[int, ...], names: tuple[str | None, ...], dtype: Any):
        self.scale = _param(None, shape, dtype, names, "ones")


class _Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, dtype: Any):
        L, D, N, K, H = cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = 2 if cfg.attention_bias else 0
        self.q_proj = _Projection(rngs, dtype, (L, D, N, H), ("layers", "embed", "heads", "head_dim"), bias,
                                  _lora(cfg, "q_proj"))
        self.k_proj = _Projection(rngs, dtype, (L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), bias,
                                  _lora(cfg, "k_proj"))
        self.v_proj = _Projection(rngs, dtype, (L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), bias,
                                  _lora(cfg, "v_proj"))
        self.o_proj = _Projection(rngs, dtype, (L, N, H, D), ("layers", "heads", "head_dim", "embed"),
                                  lora=_lora(cfg, "o_proj", n_in=2))


class _MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, dtype: Any):
        L, D, F = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _Projection(rngs, dtype, (L, D, F), ("layers", "embed", "mlp"), lora=_lora(cfg, "gate_proj"))
        self.up_proj = _Projection(rngs, dtype, (L, D, F), ("layers", "embed", "mlp"), lora=_lora(cfg, "up_proj"))
        self.down_proj = _Projection(rngs, dtype, (L, F, D), ("layers", "mlp", "embed"), lora=_lora(cfg, "down_proj"))


class _DecoderLayers(nnx.Module):
    """All decoder layers' parameters, stacked on a leading L axis."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, dtype: Any):
        L, D = cfg.num_layers, cfg.hidden_size
        self.input_layernorm = _RMSNorm((L, D), ("layers", "embed"), dtype)
        self.self_attn = _Attention(cfg, rngs, dtype)
        self.post_attention_layernorm = _RMSNorm((L, D), ("layers", "embed"), dtype)
        self.mlp = _MLP(cfg, rngs, dtype)


class _Embedding(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, dtype: Any):
        self.embedding = _param(rngs, (cfg.vocab_size, cfg.hidden_size), dtype, ("vocab", "embed"), "normal")


class Transformer(nnx.Module):
    """Decoder-only LM: `model(tokens, positions, mask, cache, cache_index) -> (logits, cache)`.

    With a cache, the mask [B, T, W] may be narrower than the cache: the new tokens attend over the cache's
    first W slots only (a sampler whose filled slots are a prefix pays for those, not for the capacity).
    A `SharedPrefix` extends a cached forward: row b also attends the prefix b // J it continues (the
    sampler's prompts, each held once for its n samples).
    `layers` (per-layer parameter trees, `unstack_layers(params)["layers"]`) runs the layers unrolled over
    arrays of their own instead of scanning the stacked parameters: XLA copies the slice of the stacked weights
    that a layer scan reads (a loop fusion on CPU, a device memcpy on GPU, seen in the compiled HLO), so a
    decode loop that scanned the stack would copy every weight once per generated token.

    `shard_activation` (static, part of the graphdef; must be hashable) lays out the residual stream
    of every layer, e.g. batch over (data, fsdp) for FSDP training; None leaves it to the compiler.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, shard_activation: ShardActivation | None = None):
        self.cfg = cfg
        self.shard_activation = shard_activation
        dtype = jnp.dtype(cfg.param_dtype)
        self.embed_tokens = _Embedding(cfg, rngs, dtype)
        self.layers = _DecoderLayers(cfg, rngs, dtype)
        self.norm = _RMSNorm((cfg.hidden_size,), ("embed",), dtype)
        if cfg.is_classifier:
            self.score = _Projection(rngs, dtype, (cfg.hidden_size, cfg.num_labels), ("embed", None))
        elif not cfg.tie_word_embeddings:
            self.lm_head = _Projection(rngs, dtype, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"),
                                       lora=_lora(cfg, "lm_head", lead=0))

    def __call__(self, tokens_BxT: jax.Array, positions_BxT: jax.Array, mask_BxTxS: jax.Array,
                 cache: KVCache | None = None, cache_index: jax.Array | None = None,
                 layers: Sequence[Params] | None = None, prefix: SharedPrefix | None = None
                 ) -> tuple[jax.Array, KVCache | None]:
        """Float32 logits [B, T, V] for the new tokens, and the updated cache (None without one)."""
        h_BxTxD, cache = self.hidden_states(tokens_BxT, positions_BxT, mask_BxTxS, cache, cache_index, layers,
                                            prefix)
        return self.logits_from_hidden(h_BxTxD), cache

    def hidden_states(self, tokens_BxT: jax.Array, positions_BxT: jax.Array, mask_BxTxS: jax.Array,
                      cache: KVCache | None = None, cache_index: jax.Array | None = None,
                      layers: Sequence[Params] | None = None, prefix: SharedPrefix | None = None, *,
                      rope: tuple[jax.Array, jax.Array] | None = None, into: AccumulatingLayers | None = None
                      ) -> tuple[jax.Array, KVCache | None]:
        """Final-norm hidden states [B, T, D] in the compute dtype (the trainer's chunked log-probs use it). `rope`:
        `rope_tables(cfg, positions_BxT)` when the caller has them (a chunked prefill makes them once, outside its
        loop: made inside, XLA CPU fused sin and cos into every layer's query and key fusions). `into`: a training
        forward's layer weights and gradient accumulator (`AccumulatingLayers`; without a cache)."""
        if prefix is not None and cache is None:
            raise ValueError("a shared prefix extends a KV cache: pass the cache its rows write to")
        if prefix is not None and tokens_BxT.shape[0] % prefix.mask_UxP.shape[0]:
            raise ValueError(f"{tokens_BxT.shape[0]} rows continue {prefix.mask_UxP.shape[0]} prefixes: must be a "
                             "whole number per prefix")
        if cache is not None and cache_index is None:
            raise ValueError("a KV cache needs cache_index (the slot where the new tokens go)")
        if cache is not None and cache.per_layer and layers is None:
            raise ValueError("a per-layer KV cache needs per-layer weights: layers=unstack_layers(params)['layers']")
        if into is not None and (cache is not None or layers is not None):
            raise ValueError("into (a training forward's accumulating layers) runs the stacked layers, without a cache")
        if layers is not None and len(layers) != self.cfg.num_layers:
            raise ValueError(f"layers: {len(layers)} given, the model has {self.cfg.num_layers}")
        cfg = self.cfg
        cos_BxTxH, sin_BxTxH = rope_tables(cfg, positions_BxT) if rope is None else rope

        def layer(carry, xs):
            x_BxTxD, cache = carry
            params, index = xs
            if cache is None:  # a teacher-forced forward over the stacked (under FSDP: split) weights
                params = self._compute_weights(params)

            def attend_block(attn: Params, h_BxTxD: jax.Array):
                return self_attention(cfg, attn, h_BxTxD, cos_BxTxH, sin_BxTxH, mask_BxTxS, cache, index,
                                      cache_index, self._shard, prefix)

            x_BxTxD, cache = decoder_layer(cfg, params, self._shard(x_BxTxD), attend_block)
            return (x_BxTxD, cache), None

        if layers is None:
            (x_BxTxD, cache), _ = self._layers(layer, (self._embed(tokens_BxT), cache), jnp.arange(cfg.num_layers),
                                               into)
        else:  # unrolled, the layer index static (an inference path: no remat)
            carry = (self._embed(tokens_BxT), cache)
            for index, params in enumerate(layers):
                carry, _ = layer(carry, (params, index))
            x_BxTxD, cache = carry
        return self._final_norm(x_BxTxD), cache

    def prefix_continuation_states(self, prefix_tokens_UxP: jax.Array, prefix_positions_UxP: jax.Array,
                                   prefix_mask_UxPxP: jax.Array, tokens_BxT: jax.Array, positions_BxT: jax.Array,
                                   mask_BxTxT: jax.Array, prefix_slots_UxP: jax.Array,
                                   into: AccumulatingLayers | None = None) -> tuple[jax.Array, jax.Array]:
        """Final-norm hidden states of U prefixes [U, P, D] and of B = U·J continuations [B, T, D]: row b
        attends the slots of prefix b // J that `prefix_slots_UxP` marks real and its own tokens as
        `mask_BxTxT` allows; `positions_BxT` continue the prefix's positions. Differentiable in both; `into` as
        in `hidden_states`.

        Each layer runs the prefixes, then the continuations on that layer's prefix keys/values, so a
        layer's weights serve both (one FSDP gather) and no [L, U, P, K, H] stack is kept.
        """
        cfg = self.cfg
        u, b = prefix_tokens_UxP.shape[0], tokens_BxT.shape[0]
        if b % u:
            raise ValueError(f"{b} continuation rows of {u} prefixes: must be a whole number per prefix")
        cos_UxPxH, sin_UxPxH = rope_tables(cfg, prefix_positions_UxP)
        cos_BxTxH, sin_BxTxH = rope_tables(cfg, positions_BxT)

        def layer(carry, xs):
            x_UxPxD, x_BxTxD = carry
            params = self._compute_weights(xs[0])

            def attend_prefix(attn: Params, h_UxPxD: jax.Array):
                q, k_UxKxPxH, v_UxKxPxH = _qkv(cfg, attn, h_UxPxD, cos_UxPxH, sin_UxPxH, length_split=True)
                k_UxKxPxH, v_UxKxPxH = self._shard(k_UxKxPxH, PREFIX_KV_AXES), self._shard(v_UxKxPxH, PREFIX_KV_AXES)
                out, _ = attend(cfg, q, k_UxKxPxH, v_UxKxPxH, prefix_mask_UxPxP, self._shard)
                return _output(cfg, attn, out), (k_UxKxPxH, v_UxKxPxH)

            x_UxPxD, (k_UxKxPxH, v_UxKxPxH) = decoder_layer(cfg, params, self._shard(x_UxPxD, PREFIX_RESIDUAL_AXES),
                                                            attend_prefix, length_split=True)

            def attend_rows(attn: Params, h_BxTxD: jax.Array):
                q, k_BxKxTxH, v_BxKxTxH = _qkv(cfg, attn, h_BxTxD, cos_BxTxH, sin_BxTxH)
                out = attend_continuations(cfg, q, k_BxKxTxH, v_BxKxTxH, mask_BxTxT, k_UxKxPxH, v_UxKxPxH,
                                           prefix_slots_UxP, self._shard)
                return _output(cfg, attn, out), None

            x_BxTxD, _ = decoder_layer(cfg, params, self._shard(x_BxTxD), attend_rows)
            return (x_UxPxD, x_BxTxD), None

        prefix_UxPxD = self._embed(self._shard(prefix_tokens_UxP, PREFIX_TOKEN_AXES))
        (x_UxPxD, x_BxTxD), _ = self._layers(layer, (prefix_UxPxD, self._embed(tokens_BxT)), None, into)
        return self._final_norm(x_UxPxD), self._final_norm(x_BxTxD)

    def _embed(self, tokens_BxT: jax.Array) -> jax.Array:
        dtype = jnp.dtype(self.cfg.compute_dtype)
        return jnp.take(self.embed_tokens.embedding[...], tokens_BxT, axis=0).astype(dtype)

    def _shard(self, x_BxTxD: jax.Array, axes: tuple[str, ...] = RESIDUAL_AXES) -> jax.Array:
        """An activation (default: the residual stream) in the layout given at construction (else unchanged)."""
        return x_BxTxD if self.shard_activation is None else self.shard_activation(x_BxTxD, axes)

    def _compute_weights(self, layer_params: Params) -> Params:
        """One layer's weights as its dots read them (`for_compute`: in the compute dtype, whole along `embed`),
        so an FSDP-split weight is all-gathered once per layer in the compute dtype, also when a forward runs it
        twice (prefixes, then continuations), and its gradient reduce-scattered once. Without a layout only the
        cast."""
        dtype = jnp.dtype(self.cfg.compute_dtype)
        if self.shard_activation is None:
            return jax.tree.map(lambda w: w.astype(dtype), layer_params)
        logical = nnx.to_pure_dict(jax.tree.map(lambda v: nnx.get_partition_spec(v).get_value(),
                                                nnx.state(self.layers, nnx.Param),
                                                is_leaf=lambda x: isinstance(x, nnx.Variable)))
        return jax.tree.map(lambda w, names: for_compute(w, tuple(names[1:]), dtype, self.shard_activation),
                            layer_params, logical, is_leaf=lambda x: isinstance(x, jax.Array))

    def _final_norm(self, x_BxTxD: jax.Array) -> jax.Array:
        return rms_norm(x_BxTxD, self.norm.scale[...], self.cfg.rms_norm_eps)

    def _layers(self, layer: Callable[[Any, Any], tuple[Any, Any]], carry: Any, extra: Any,
                into: AccumulatingLayers | None) -> tuple[Any, Any]:
        """`layer(carry, (params[l], extra[l])) -> (carry, ys[l])` over the L layers (rematerialised when cfg.remat,
        keeping what cfg.remat_policy names). With `into`, the layers compute with `into.compute` and their backward
        recomputes each layer (full remat) and adds its gradient into `into.grads` (`accumulating_layers.layers_into`)."""
        params = _arrays(self.layers)
        if into is not None:
            return layers_into(self.cfg, layer, carry, params, into.compute, into.grads, extra), None
        if not self.cfg.remat:
            return run_layers(self.cfg, layer, carry, (params, extra))
        policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable if self.cfg.remat_policy == "dots" else None
        return run_layers(self.cfg, jax.checkpoint(layer, policy=policy), carry, (params, extra))

    def logits_from_hidden(self, h_BxTxD: jax.Array) -> jax.Array:
        """Float32 logits from hidden states through the LM head (or the tied embedding)."""
        return jnp.einsum("BTD,DV->BTV", h_BxTxD, self.vocab_slice(0, 1), preferred_element_type=jnp.float32)

    def vocab_slice(self, i: jax.Array | int, n: int) -> jax.Array:
        """The LM head's (or tied embedding's) projection of vocabulary ids i, i + n, i + 2n, ...: [D, V / n] in
        the compute dtype, as a dot reads it (`for_compute`); n must divide V. Strided, so that a vocabulary split
        over `tensor` stays split alike in every slice (`grpo.chunked_token_logprobs` runs the slices in turn)."""
        w_DxS = jax.lax.dynamic_index_in_dim(self._head_by_slice(n, "vocab_slice(i, n="), i, axis=2, keepdims=False)
        dtype = jnp.dtype(self.cfg.compute_dtype)
        if self.shard_activation is None:
            return w_DxS.astype(dtype)
        return for_compute(w_DxS, ("embed", "vocab"), dtype, self.shard_activation)

    def vocab_projection(self, n: int) -> jax.Array:
        """The LM head's (or tied embedding's) projection as n vocabulary slices [n, D, V / n], slice i the ids
        i, i + n, i + 2n, ... (as `vocab_slice(i, n)`), in the compute dtype and the weight's own layout (under
        FSDP still split: `vocab_slice_for_dot` gathers one slice at a time). One cast and transpose of the whole
        weight, whose gradient is one transpose back: `grpo.chunked_token_logprobs` scans over the slices."""
        w_NxDxS = self._head_by_slice(n, "vocab_projection(n=").transpose(2, 0, 1)
        return self._shard(w_NxDxS.astype(jnp.dtype(self.cfg.compute_dtype)), (None, "embed", "vocab"))

    def _head_by_slice(self, n: int, caller: str) -> jax.Array:
        """The LM head's (or tied embedding's) [D, V] weight as [D, V / n, n]: [:, :, i] projects ids i, i + n, ..."""
        if self.cfg.is_classifier:
            raise ValueError("this model is a sequence classifier (a score head, no LM head): use sequence_logits")
        if self.cfg.vocab_size % n:
            raise ValueError(f"{caller}{n}): n must divide the vocabulary size {self.cfg.vocab_size}")
        w_DxV = self.embed_tokens.embedding[...].T if self.cfg.tie_word_embeddings else self.lm_head.kernel[...]
        if hasattr(self, "lm_head") and hasattr(self.lm_head, "lora_a"):  # merged per use: [D, V] once per forward
            head = self.lm_head
            w_DxV = w_DxV.astype(jnp.float32) + lora_delta(w_DxV, head.lora_a[...], head.lora_b[...],
                                                           lora_scale(self.cfg))
        d, v = w_DxV.shape
        return w_DxV.reshape(d, v // n, n)

    def vocab_slice_for_dot(self, w_DxS: jax.Array) -> jax.Array:
        """One slice of `vocab_projection` as a dot reads it (`for_compute`: whole along `embed`)."""
        if self.shard_activation is None:
            return w_DxS
        return for_compute(w_DxS, ("embed", "vocab"), w_DxS.dtype, self.shard_activation)

    def sequence_logits(self, tokens_BxT: jax.Array, positions_BxT: jax.Array, mask_BxTxS: jax.Array) -> jax.Array:
        """Float32 classifier logits [B, C]: the score head on the final-norm hidden state of each row's
        last token that is not `cfg.pad_token_id` (transformers' *ForSequenceClassification pooling)."""
        if not self.cfg.is_classifier:
            raise ValueError("this model is a causal LM (no score head): sequence_logits needs num_labels > 0")
        h_BxTxD, _ = self.hidden_states(tokens_BxT, positions_BxT, mask_BxTxS)
        last_B = last_non_pad_index(tokens_BxT, self.cfg.pad_token_id)
        h_BxD = jnp.take_along_axis(h_BxTxD, last_B[:, None, None], axis=1)[:, 0]
        return jnp.einsum("BD,DC->BC", h_BxD, self.score.kernel[...].astype(h_BxD.dtype),
                          preferred_element_type=jnp.float32)


def last_non_pad_index(tokens_BxT: jax.Array, pad_id: int) -> jax.Array:
    """Index [B] of each row's rightmost token that is not `pad_id` (0 for an all-pad row), as transformers
    picks it: works for left and right padding, and skips a trailing real token equal to `pad_id`."""
    t = tokens_BxT.shape[-1]
    return jnp.max(jnp.arange(t, dtype=jnp.int32)[None, :] * (tokens_BxT != pad_id), axis=-1)


def _arrays(module: nnx.Module) -> Params:
    """The module's parameters as a plain nested dict of arrays (scan slices its leading L axis)."""
    return nnx.to_pure_dict(nnx.state(module, nnx.Param))


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """HF RMSNorm: normalise in float32, cast back, then scale."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    scale = scale.astype(x.dtype).reshape((1,) * (x.ndim - scale.ndim) + scale.shape)
    return scale * normed.astype(x.dtype)


def inverse_frequencies(cfg: ModelConfig) -> jax.Array:
    """RoPE inverse frequencies [H/2], with Llama-3 scaling when configured."""
    exponents = jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** exponents)
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return jnp.where(is_medium, smoothed, scaled)


def rope_tables(cfg: ModelConfig, positions_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, T, H] in float32 (HF layout: the half-dim frequencies repeated twice)."""
    freqs_BxTxH2 = positions_BxT.astype(jnp.float32)[:, :, None] * inverse_frequencies(cfg)[None, None, :]
    emb_BxTxH = jnp.concatenate([freqs_BxTxH2, freqs_BxTxH2], axis=-1)
    return jnp.cos(emb_BxTxH), jnp.sin(emb_BxTxH)


def apply_rope(x_BxTxNxH: jax.Array, cos_BxTxH: jax.Array, sin_BxTxH: jax.Array) -> jax.Array:
    """Rotates query/key heads by their positions (HF rotate_half convention)."""
    half = x_BxTxNxH.shape[-1] // 2
    rotated = jnp.concatenate([-x_BxTxNxH[..., half:], x_BxTxNxH[..., :half]], axis=-1)
    cos = cos_BxTxH[:, :, None, :].astype(x_BxTxNxH.dtype)
    sin = sin_BxTxH[:, :, None, :].astype(x_BxTxNxH.dtype)
    return x_BxTxNxH * cos + rotated * sin


def _token_matmul(x_BxTxI: jax.Array, w_IxO: jax.Array, length_split: bool) -> jax.Array:
    """x [B, T, I] @ w [I, *out] -> [B, T, *out]: one 2-D GEMM over the B·T tokens, or, where the token axis
    may be split over devices (`length_split`: the shared prefixes' [U, P] tokens), a 3-D contraction.

    Why 2-D: its weight gradient contracts one token axis instead of (B, T), which XLA CPU runs without
    transposing copies of the activations' gradients (the MLP's silu gradients were the update's largest
    copies; benchmarks/RESULTS.md). Why not for split tokens: merging [U, P] with P split into U·P rows is a
    tiling no sharding can express, and the 7B update then all-reduced 110 GiB more (the same file)."""
    w_IxO = w_IxO.astype(x_BxTxI.dtype)
    if length_split:
        return jnp.tensordot(x_BxTxI, w_IxO, axes=1)
    b, t, i = x_BxTxI.shape
    return jnp.tensordot(x_BxTxI.reshape(b * t, i), w_IxO, axes=1).reshape(b, t, *w_IxO.shape[1:])


def _project(x_BxTxD: jax.Array, proj: Params, length_split: bool, scale: float) -> jax.Array:
    """x [B, T, D] through a kernel [D, *out] plus its bias [*out], if any: [B, T, *out]; with adapters also
    `scale` · (x @ lora_a) @ lora_b (unmerged: the adapters' gradient never makes a kernel-sized array)."""
    y = _token_matmul(x_BxTxD, proj["kernel"], length_split)
    if "lora_a" in proj:
        y = y + _token_matmul(scale * _token_matmul(x_BxTxD, proj["lora_a"], length_split), proj["lora_b"],
                              length_split)
    if "bias" in proj:
        y = y + proj["bias"].astype(y.dtype)[None, None]
    return y


def merged_qkv(attn: Params) -> Params:
    """A layer's query, key and value projections as one (kernel [D, N + 2K, H], bias [N + 2K, H]): what a decode
    step's attention kernel reads (`attention.attend_in_kernel`). A decode loop merges them once, before it
    (`with_merged_qkv`): merged inside, XLA copies every layer's weights again for every token."""
    names = ("q_proj", "k_proj", "v_proj")
    return {key: jnp.concatenate([attn[name][key] for name in names], axis=attn["q_proj"][key].ndim - 2)
            for key in ("kernel", "bias") if key in attn["q_proj"]}


def with_merged_qkv(layers: Sequence[Params]) -> list[Params]:
    """Per-layer parameter trees with each layer's `merged_qkv` added as attn["qkv_proj"] (the others kept)."""
    return [{**layer, "self_attn": {**layer["self_attn"], "qkv_proj": merged_qkv(layer["self_attn"])}}
            for layer in layers]


def _qkv(cfg: ModelConfig, attn: Params, x_BxTxD: jax.Array, cos_BxTxH: jax.Array, sin_BxTxH: jax.Array,
         length_split: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Rotated queries [B, T, K, G, H] (grouped by KV head), rotated keys and values [B, K, T, H] (the cache's
    layout); `length_split` as in `_token_matmul`."""
    B, T, _ = x_BxTxD.shape
    scale = lora_scale(cfg)
    q_BxTxNxH = apply_rope(_project(x_BxTxD, attn["q_proj"], length_split, scale), cos_BxTxH, sin_BxTxH)
    k_BxTxKxH = apply_rope(_project(x_BxTxD, attn["k_proj"], length_split, scale), cos_BxTxH, sin_BxTxH)
    v_BxTxKxH = _project(x_BxTxD, attn["v_proj"], length_split, scale)
    k_BxKxTxH, v_BxKxTxH = k_BxTxKxH.swapaxes(1, 2), v_BxTxKxH.swapaxes(1, 2)
    return q_BxTxNxH.reshape(B, T, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim), k_BxKxTxH, v_BxKxTxH


def _output(cfg: ModelConfig, attn: Params, out_BxTxKxGxH: jax.Array) -> jax.Array:
    """The heads concatenated and projected back: [B, T, D]."""
    B, T = out_BxTxKxGxH.shape[:2]
    # One [N*H] contraction: with two contracted axes XLA transposes the kernel on every call (every token).
    out_BxTxF = out_BxTxKxGxH.reshape(B, T, cfg.num_heads * cfg.head_dim)
    kernel_FxD = attn["o_proj"]["kernel"].reshape(cfg.num_heads * cfg.head_dim, -1)
    y_BxTxD = jnp.einsum("BTF,FD->BTD", out_BxTxF, kernel_FxD.astype(out_BxTxF.dtype))
    if "lora_a" in attn["o_proj"]:
        a_FxR = attn["o_proj"]["lora_a"].reshape(cfg.num_heads * cfg.head_dim, -1).astype(out_BxTxF.dtype)
        down_BxTxR = lora_scale(cfg) * jnp.einsum("BTF,FR->BTR", out_BxTxF, a_FxR)
        y_BxTxD = y_BxTxD + jnp.einsum("BTR,RD->BTD", down_BxTxR, attn["o_proj"]["lora_b"].astype(out_BxTxF.dtype))
    return y_BxTxD


def self_attention(cfg: ModelConfig, attn: Params, x_BxTxD: jax.Array, cos_BxTxH: jax.Array, sin_BxTxH: jax.Array,
                   mask_BxTxS: jax.Array, cache: KVCache | None, layer: jax.Array | int,
                   cache_index: jax.Array | None, shard: ShardActivation, prefix: SharedPrefix | None = None
                   ) -> tuple[jax.Array, KVCache | None]:
    """A layer's grouped-query self-attention block [B, T, D]: projections and RoPE here, the attention (over the
    cache's window and the shared prefix, if any, writing the new keys/values into layer `layer`) `attend`'s, or
    a decode step's RoPE and attention in one kernel (`attention.decodes_in_kernel`; not with unmerged LoRA adapters)."""
    if "lora_a" not in attn["q_proj"] and attention.decodes_in_kernel(cfg, x_BxTxD, mask_BxTxS, cache, prefix):
        qkv = attn["qkv_proj"] if "qkv_proj" in attn else merged_qkv(attn)  # rollouts decode with LoRA merged
        qkv_BxTxCxH = _project(x_BxTxD, qkv, length_split=False, scale=1.0)
        out_BxTxKxGxH, cache = attention.attend_in_kernel(qkv_BxTxCxH, cos_BxTxH, sin_BxTxH, mask_BxTxS, cache,
                                                          layer, cache_index, prefix)
    else:
        q_BxTxKxGxH, k_BxKxTxH, v_BxKxTxH = _qkv(cfg, attn, x_BxTxD, cos_BxTxH, sin_BxTxH)
        out_BxTxKxGxH, cache = attend(cfg, q_BxTxKxGxH, k_BxKxTxH, v_BxKxTxH, mask_BxTxS, shard, cache, layer,
                                      cache_index, prefix)
    return _output(cfg, attn, out_BxTxKxGxH), cache


def mlp(mlp_params: Params, x_BxTxD: jax.Array, length_split: bool = False, scale: float = 0.0) -> jax.Array:
    """SwiGLU: down(silu(gate(x)) * up(x)); `length_split` as in `_token_matmul`, `scale` the adapters'
    (`lora_scale`)."""
    gate_BxTxF = _project(x_BxTxD, mlp_params["gate_proj"], length_split, scale)
    up_BxTxF = _project(x_BxTxD, mlp_params["up_proj"], length_split, scale)
    return _project(jax.nn.silu(gate_BxTxF) * up_BxTxF, mlp_params["down_proj"], length_split, scale)


def decoder_layer(cfg: ModelConfig, params: Params, x_BxTxD: jax.Array,
                  attend: Callable[[Params, jax.Array], tuple[jax.Array, Any]], length_split: bool = False
                  ) -> tuple[jax.Array, Any]:
    """One pre-norm block: x + attn(norm(x)), then + mlp(norm(x)). `attend(attn_params, h)` is the
    attention of this forward (over a cache, a prefix, ...) and returns its output and what it hands
    out (the updated cache, this layer's keys/values, or None); `length_split` (the MLP's) as in `_token_matmul`."""
    h = rms_norm(x_BxTxD, params["input_layernorm"]["scale"], cfg.rms_norm_eps)
    attn_out, out = attend(params["self_attn"], h)
    x_BxTxD = x_BxTxD + attn_out
    h = rms_norm(x_BxTxD, params["post_attention_layernorm"]["scale"], cfg.rms_norm_eps)
    return x_BxTxD + mlp(params["mlp"], h, length_split, lora_scale(cfg)), out
