"""Grouped-query softmax attention over rotated queries and keys/values, the maths of a decoder layer's attention
block (models/transformer.py projects and rotates; this module attends): plain, over a KV cache's window, or over
[a shared prefix ; own slots] with one softmax and a flash-style backward, in our einsums or a fused
`jax.nn.dot_product_attention` ("xla", "cudnn"; `cfg.attention`, forwards without a cache).

Einsum legend: B rows, T new tokens, S attended slots, K key/value heads, G query heads per KV head, H head dim,
U shared prefixes, J continuations per prefix (B = U·J), P prefix slots, M query rows of one KV head in an
attention dot (T·G per row; J·T·G per prefix).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rubric_jax.models import decode_attention
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.kv_cache import KVCache, SharedPrefix, write_and_read

# A fused attention kernel's operands: queries [B, T, N, H], keys/values [B, S, K, H], mask [B, T, S]. cuDNN's
# partitioner refuses a split token axis, so prompts split over the batch shards they leave idle
# ("prefix_length") are gathered for it, and wants queries and keys split alike: a tensor-parallel mesh axis
# must divide the KV heads (then query head blocks match their KV heads').
FUSED_QUERY_AXES = ("batch", "length", "heads", "head_dim")
FUSED_KV_AXES = ("batch", "length", "kv_heads", "head_dim")
FUSED_MASK_AXES = ("batch", "length", "length")
# (activation, its logical axis names) -> the activation with a sharding constraint (or unchanged).
ShardActivation = Callable[[jax.Array, tuple[str, ...]], jax.Array]
# `SharedPrefix.kernel` values that run a decode step's attention as `decode_attention`'s kernel.
FUSED_KERNELS = frozenset({"pallas", "interpret"})


def attend(cfg: ModelConfig, q_BxTxKxGxH: jax.Array, k_BxKxTxH: jax.Array, v_BxKxTxH: jax.Array,
           mask_BxTxS: jax.Array, shard: ShardActivation, cache: KVCache | None = None, layer: jax.Array | int = 0,
           cache_index: jax.Array | None = None, prefix: SharedPrefix | None = None
           ) -> tuple[jax.Array, KVCache | None]:
    """A layer's attention output [B, T, K, G, H] and the updated cache (None without one). Without a cache in the
    implementation `cfg.attention` names (`shard` lays out a fused kernel's operands); over a cache (decoding) the
    new keys/values are written into layer `layer` at `cache_index`, then always `_attend` over the cache's first
    S slots (S = the mask's width), or `_attend_with_prefix` over [that layer of the shared prefix ; that window]."""
    if cache is None:
        return _attend_without_cache(cfg, q_BxTxKxGxH, k_BxKxTxH, v_BxKxTxH, mask_BxTxS, shard), None
    window = mask_BxTxS.shape[-1]  # keys [.., H, S] in the cache (`KVCache`)
    k_cache, k_BxKxHxS = write_and_read(cache.k, k_BxKxTxH.swapaxes(2, 3), layer, cache_index, window, axis=3)
    v_cache, v_BxKxSxH = write_and_read(cache.v, v_BxKxTxH, layer, cache_index, window, axis=2)
    cache = KVCache(k=k_cache, v=v_cache)
    dtype = q_BxTxKxGxH.dtype
    k_BxKxHxS, v_BxKxSxH = k_BxKxHxS.astype(dtype), v_BxKxSxH.astype(dtype)
    if prefix is None:
        return _attend(cfg, q_BxTxKxGxH, k_BxKxHxS, v_BxKxSxH, mask_BxTxS, k_transposed=True), cache
    k_UxKxHxP, v_UxKxPxH = (x[layer].astype(dtype) for x in (prefix.cache.k, prefix.cache.v))
    if prefix.kernel == "xla_split":
        return _attend_with_prefix(cfg, q_BxTxKxGxH, k_BxKxHxS, v_BxKxSxH, mask_BxTxS, k_UxKxHxP, v_UxKxPxH,
                                   prefix.mask_UxP, k_transposed=True), cache
    return _attend_cached_with_prefix(cfg, q_BxTxKxGxH, k_BxKxHxS, v_BxKxSxH, mask_BxTxS, k_UxKxHxP, v_UxKxPxH,
                                      prefix.mask_UxP), cache


def decodes_in_kernel(cfg: ModelConfig, x_BxTxD: jax.Array, mask_BxTxS: jax.Array, cache: KVCache | None,
                      prefix: SharedPrefix | None) -> bool:
    """Whether a layer's cached attention runs as `decode_attention`'s kernel (`attend_in_kernel`): a decode step
    (one new token per row) over a shared prefix that asks for it, per-layer caches in the compute dtype as wide as
    the mask, and (compiled for a GPU) tiles that fit."""
    if prefix is None or prefix.kernel not in FUSED_KERNELS or cache is None or not cache.per_layer or x_BxTxD.shape[1] != 1:
        return False
    if mask_BxTxS.shape[-1] != cache.k[0].shape[-1] or cache.k[0].dtype != x_BxTxD.dtype:
        return False
    return prefix.kernel == "interpret" or decode_attention.fits(cfg.head_dim, cfg.num_groups)


def attend_in_kernel(qkv_BxTxCxH: jax.Array, cos_BxTxH: jax.Array, sin_BxTxH: jax.Array, mask_BxTxS: jax.Array,
                     cache: KVCache, layer: int, cache_index: jax.Array, prefix: SharedPrefix
                     ) -> tuple[jax.Array, KVCache]:
    """`attend`'s decode step over [the shared prefix ; the own cache] as one Pallas kernel (`decode_attention`)
    from the unrotated query, key and value heads as one array [B, 1, N + 2K, H]: it rotates them (RoPE tables
    cos/sin, of which it reads one half: XLA then computes both in one fusion) and writes the new key and value into
    layer `layer`'s cache in place. Output [B, 1, K, G, H]."""
    half = cos_BxTxH.shape[-1] // 2
    out_BxKxGxH, k, v = decode_attention.decode_attention(
        qkv_BxTxCxH[:, 0], cos_BxTxH[:, 0, :half], sin_BxTxH[:, 0, :half], mask_BxTxS[:, 0], cache_index,
        cache.k[layer], cache.v[layer], prefix.cache.k[layer], prefix.cache.v[layer], prefix.mask_UxP,
        interpret=prefix.kernel == "interpret")
    cache = KVCache(k=cache.k[:layer] + (k,) + cache.k[layer + 1:], v=cache.v[:layer] + (v,) + cache.v[layer + 1:])
    return out_BxKxGxH[:, None], cache


def _attend_cached_with_prefix(cfg: ModelConfig, q_BxTxKxGxH: jax.Array, k_BxKxHxS: jax.Array, v_BxKxSxH: jax.Array,
                               mask_BxTxS: jax.Array, k_UxKxHxP: jax.Array, v_UxKxPxH: jax.Array,
                               prefix_mask_UxP: jax.Array) -> jax.Array:
    """`_attend_with_prefix` over a KV cache (keys [.., H, S]), forward only: the prefix's scores, a GEMM over its
    J rows' queries as there, are laid out as their rows' [B, K, M, P] and concatenated with the own scores, so one
    softmax spans [prefix ; own] as one array. Why: XLA's GPU compiler ran the two parts' maxima, sums and
    normalisations as six kernels per layer and decode step, the concatenation as three (issue 33)."""
    B, T, K, G, H = q_BxTxKxGxH.shape
    J, M, P = B // prefix_mask_UxP.shape[0], T * G, prefix_mask_UxP.shape[1]
    scale = 1.0 / math.sqrt(cfg.head_dim)
    q_BxKxMxH = q_BxTxKxGxH.transpose(0, 2, 1, 3, 4).reshape(B, K, M, H)
    own_BxKxMxS = _scores(q_BxKxMxH, k_BxKxHxS, k_transposed=True) * scale
    prefix_BxKxMxP = _to_rows(_scores(_to_prefixes(q_BxKxMxH, J), k_UxKxHxP, k_transposed=True) * scale, J)
    prefix_mask_Bx1xMxP = jnp.broadcast_to(jnp.repeat(prefix_mask_UxP, J, axis=0)[:, None, None, :], (B, 1, M, P))
    mask_Bx1xMxQ = jnp.concatenate([prefix_mask_Bx1xMxP, jnp.repeat(mask_BxTxS, G, axis=1)[:, None]], axis=-1)
    scores_BxKxMxQ = jnp.where(mask_Bx1xMxQ, jnp.concatenate([prefix_BxKxMxP, own_BxKxMxS], axis=-1),
                               jnp.finfo(jnp.float32).min)
    probs_BxKxMxQ = jax.nn.softmax(scores_BxKxMxQ, axis=-1).astype(q_BxTxKxGxH.dtype)
    prefix_probs_UxKxJMxP = _to_prefixes(probs_BxKxMxQ[..., :P], J)
    out_BxKxMxH = (jnp.einsum("BKMS,BKSH->BKMH", probs_BxKxMxQ[..., P:], v_BxKxSxH)
                   + _to_rows(jnp.einsum("UKMP,UKPH->UKMH", prefix_probs_UxKxJMxP, v_UxKxPxH), J))
    return out_BxKxMxH.reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4)


def _scores(q_BxKxMxH: jax.Array, k: jax.Array, k_transposed: bool) -> jax.Array:
    """Unscaled float32 scores q·kᵀ [B, K, M, S] of keys k [B, K, S, H], or [B, K, H, S] where `k_transposed` (a
    KV cache's layout, `KVCache`)."""
    spec = "BKMH,BKHS->BKMS" if k_transposed else "BKMH,BKSH->BKMS"
    return jnp.einsum(spec, q_BxKxMxH, k, preferred_element_type=jnp.float32)


def _attend(cfg: ModelConfig, q_BxTxKxGxH: jax.Array, k_BxKxSxH: jax.Array, v_BxKxSxH: jax.Array,
            mask_BxTxS: jax.Array, k_transposed: bool = False) -> jax.Array:
    """Softmax attention [B, T, K, G, H] of the queries over the S slots `mask_BxTxS` allows (keys [B, K, H, S]
    where `k_transposed`, see `_scores`).

    A KV head's T·G queries form one matrix (M = T·G, row t·G + g), so both dots are plain batched GEMMs
    over (B, K), [M, H]·[S, H]ᵀ and [M, S]·[S, H], the probabilities in the layout the second dot reads.
    Written per (G, T) instead, XLA's CPU backend laid the scores out [B, K, S, G] and ran the second dot
    with a transposed operand outside XNNPACK: 1.7x slower decode attention (benchmarks/RESULTS.md). T is
    the major part of M, so a length-sharded T (the training layout's prompts) stays a block split of M.
    """
    B, T, K, G, H = q_BxTxKxGxH.shape
    q_BxKxMxH = q_BxTxKxGxH.transpose(0, 2, 1, 3, 4).reshape(B, K, T * G, H)
    scores_BxKxMxS = _scores(q_BxKxMxH, k_BxKxSxH, k_transposed) / math.sqrt(cfg.head_dim)
    mask_BxMxS = jnp.repeat(mask_BxTxS, G, axis=1)
    scores_BxKxMxS = jnp.where(mask_BxMxS[:, None], scores_BxKxMxS, jnp.finfo(jnp.float32).min)
    probs_BxKxMxS = jax.nn.softmax(scores_BxKxMxS, axis=-1).astype(q_BxTxKxGxH.dtype)
    out_BxKxMxH = jnp.einsum("BKMS,BKSH->BKMH", probs_BxKxMxS, v_BxKxSxH)
    return out_BxKxMxH.reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4)


def _attend_with_prefix(cfg: ModelConfig, q_BxTxKxGxH: jax.Array, k_BxKxSxH: jax.Array, v_BxKxSxH: jax.Array,
                        mask_BxTxS: jax.Array, k_UxKxPxH: jax.Array, v_UxKxPxH: jax.Array,
                        prefix_mask_UxP: jax.Array, k_transposed: bool = False) -> jax.Array:
    """`_attend` over [prefix b // J ; own slots] with one softmax; the J rows of a prefix read its keys and
    values in place (no [B, K, P, H] copy). Both parts' keys are [.., H, S] where `k_transposed` (`_scores`).

    As in `_attend`, each dot is a plain batched GEMM: the own dot over (B, K) with a row's T·G queries
    (M = T·G), the prefix dot over (U, K) with its J rows' queries (J·M, row j·M + m), so J rows that share a
    prefix are one GEMM with J times the rows, not J GEMMs. The softmax spans both parts: their maxima and
    sums meet in the small [B, K, M] layout. Its gradient is `_prefix_attention_bwd`'s.
    """
    return _prefix_attention(1.0 / math.sqrt(cfg.head_dim), k_transposed, q_BxTxKxGxH, k_BxKxSxH, v_BxKxSxH,
                             mask_BxTxS, k_UxKxPxH, v_UxKxPxH, prefix_mask_UxP)


def _to_rows(x_UxKxJM: jax.Array, j: int) -> jax.Array:
    """A prefix-major [U, K, J·M, ...] array as its rows' [B, K, M, ...] (B = U·J)."""
    u, k, jm, rest = x_UxKxJM.shape[0], x_UxKxJM.shape[1], x_UxKxJM.shape[2], x_UxKxJM.shape[3:]
    x = x_UxKxJM.reshape(u, k, j, jm // j, *rest)
    return x.swapaxes(1, 2).reshape(u * j, k, jm // j, *rest)


def _to_prefixes(x_BxKxM: jax.Array, j: int) -> jax.Array:
    """The inverse of `_to_rows`: [B, K, M, ...] -> [U, K, J·M, ...]."""
    b, k, m, rest = x_BxKxM.shape[0], x_BxKxM.shape[1], x_BxKxM.shape[2], x_BxKxM.shape[3:]
    x = x_BxKxM.reshape(b // j, j, k, m, *rest)
    return x.swapaxes(1, 2).reshape(b // j, k, j * m, *rest)


def _prefix_attention_fwd(scale: float, k_transposed: bool, q_BxTxKxGxH: jax.Array, k_BxKxSxH: jax.Array,
                          v_BxKxSxH: jax.Array, mask_BxTxS: jax.Array, k_UxKxPxH: jax.Array, v_UxKxPxH: jax.Array,
                          prefix_mask_UxP: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """`_attend_with_prefix`'s output and what its backward reads: the queries, keys, values, masks, both parts'
    probabilities and the output in the [B, K, M, H] layout."""
    B, T, K, G, H = q_BxTxKxGxH.shape
    U = prefix_mask_UxP.shape[0]
    J, M = B // U, T * G
    neg = jnp.finfo(jnp.float32).min
    q_BxKxMxH = q_BxTxKxGxH.transpose(0, 2, 1, 3, 4).reshape(B, K, M, H)
    own_mask_Bx1xMxS = jnp.repeat(mask_BxTxS, G, axis=1)[:, None]
    own_BxKxMxS = jnp.where(own_mask_Bx1xMxS, _scores(q_BxKxMxH, k_BxKxSxH, k_transposed) * scale, neg)
    prefix_UxKxJMxP = _scores(_to_prefixes(q_BxKxMxH, J), k_UxKxPxH, k_transposed) * scale
    prefix_UxKxJMxP = jnp.where(prefix_mask_UxP[:, None, None, :], prefix_UxKxJMxP, neg)
    # softmax(s) = exp(s - m) / sum exp(s - m) for any m.
    max_BxKxM = jnp.maximum(jnp.max(own_BxKxMxS, axis=-1), _to_rows(jnp.max(prefix_UxKxJMxP, axis=-1), J))
    own_BxKxMxS = jnp.exp(own_BxKxMxS - max_BxKxM[..., None])
    prefix_UxKxJMxP = jnp.exp(prefix_UxKxJMxP - _to_prefixes(max_BxKxM, J)[..., None])
    total_BxKxM = jnp.sum(own_BxKxMxS, axis=-1) + _to_rows(jnp.sum(prefix_UxKxJMxP, axis=-1), J)
    dtype = q_BxTxKxGxH.dtype
    own_probs_BxKxMxS = (own_BxKxMxS / total_BxKxM[..., None]).astype(dtype)
    prefix_probs_UxKxJMxP = (prefix_UxKxJMxP / _to_prefixes(total_BxKxM, J)[..., None]).astype(dtype)
    out_BxKxMxH = (jnp.einsum("BKMS,BKSH->BKMH", own_probs_BxKxMxS, v_BxKxSxH)
                   + _to_rows(jnp.einsum("UKMP,UKPH->UKMH", prefix_probs_UxKxJMxP, v_UxKxPxH), J))
    residuals = (q_BxKxMxH, k_BxKxSxH, v_BxKxSxH, own_mask_Bx1xMxS, k_UxKxPxH, v_UxKxPxH, prefix_mask_UxP,
                 own_probs_BxKxMxS, prefix_probs_UxKxJMxP, out_BxKxMxH)
    return out_BxKxMxH.reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4), residuals


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _prefix_attention(scale: float, k_transposed: bool, q_BxTxKxGxH: jax.Array, k_BxKxSxH: jax.Array,
                      v_BxKxSxH: jax.Array, mask_BxTxS: jax.Array, k_UxKxPxH: jax.Array, v_UxKxPxH: jax.Array,
                      prefix_mask_UxP: jax.Array) -> jax.Array:
    """`_attend_with_prefix` with `scale` = 1/√H, differentiated by `_prefix_attention_bwd`."""
    return _prefix_attention_fwd(scale, k_transposed, q_BxTxKxGxH, k_BxKxSxH, v_BxKxSxH, mask_BxTxS, k_UxKxPxH,
                                 v_UxKxPxH, prefix_mask_UxP)[0]


def _prefix_attention_bwd(scale: float, k_transposed: bool, residuals: tuple[jax.Array, ...], g_BxTxKxGxH: jax.Array
                          ) -> tuple[jax.Array | None, ...]:
    """Flash attention's backward: with D = rowsum(dO ∘ O), each part's score gradient is P ∘ (dO·Vᵀ − D),
    a reduction over the head dim H where autodiff of the softmax reduced over the S + P slots (CPU update
    ~25% faster in this attention; benchmarks/RESULTS.md "GRPO step vs TRL", ninth session)."""
    (q_BxKxMxH, k_BxKxSxH, v_BxKxSxH, own_mask_Bx1xMxS, k_UxKxPxH, v_UxKxPxH, prefix_mask_UxP,
     own_probs_BxKxMxS, prefix_probs_UxKxJMxP, out_BxKxMxH) = residuals
    if k_transposed:  # keys [.., H, S] (`_scores`): the maths below reads them [.., S, H]
        k_BxKxSxH, k_UxKxPxH = k_BxKxSxH.swapaxes(-1, -2), k_UxKxPxH.swapaxes(-1, -2)
    B, T, K, G, H = g_BxTxKxGxH.shape
    J = B // prefix_mask_UxP.shape[0]
    dtype = q_BxKxMxH.dtype
    g_BxKxMxH = g_BxTxKxGxH.transpose(0, 2, 1, 3, 4).reshape(B, K, T * G, H)
    d_BxKxM = jnp.sum(g_BxKxMxH.astype(jnp.float32) * out_BxKxMxH.astype(jnp.float32), axis=-1)
    g_UxKxJMxH, q_UxKxJMxH = _to_prefixes(g_BxKxMxH, J), _to_prefixes(q_BxKxMxH, J)
    own_dp_BxKxMxS = jnp.einsum("BKMH,BKSH->BKMS", g_BxKxMxH, v_BxKxSxH, preferred_element_type=jnp.float32)
    own_ds_BxKxMxS = jnp.where(own_mask_Bx1xMxS, own_probs_BxKxMxS * (own_dp_BxKxMxS - d_BxKxM[..., None]) * scale,
                               0.0).astype(dtype)
    prefix_dp_UxKxJMxP = jnp.einsum("UKMH,UKPH->UKMP", g_UxKxJMxH, v_UxKxPxH, preferred_element_type=jnp.float32)
    prefix_ds_UxKxJMxP = jnp.where(
        prefix_mask_UxP[:, None, None, :],
        prefix_probs_UxKxJMxP * (prefix_dp_UxKxJMxP - _to_prefixes(d_BxKxM, J)[..., None]) * scale, 0.0).astype(dtype)
    dq_BxKxMxH = (jnp.einsum("BKMS,BKSH->BKMH", own_ds_BxKxMxS, k_BxKxSxH)
                  + _to_rows(jnp.einsum("UKMP,UKPH->UKMH", prefix_ds_UxKxJMxP, k_UxKxPxH), J))
    dk_BxKxSxH = jnp.einsum("BKMS,BKMH->BKSH", own_ds_BxKxMxS, q_BxKxMxH)
    dk_UxKxPxH = jnp.einsum("UKMP,UKMH->UKPH", prefix_ds_UxKxJMxP, q_UxKxJMxH)
    if k_transposed:
        dk_BxKxSxH, dk_UxKxPxH = dk_BxKxSxH.swapaxes(-1, -2), dk_UxKxPxH.swapaxes(-1, -2)
    return (dq_BxKxMxH.reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4), dk_BxKxSxH,
            jnp.einsum("BKMS,BKMH->BKSH", own_probs_BxKxMxS, g_BxKxMxH), None, dk_UxKxPxH,
            jnp.einsum("UKMP,UKMH->UKPH", prefix_probs_UxKxJMxP, g_UxKxJMxH), None)


_prefix_attention.defvjp(_prefix_attention_fwd, _prefix_attention_bwd)


def _continuation_prefix_mask(prefix_mask_UxP: jax.Array, b: int, t: int) -> jax.Array:
    """[B, T, P]: the prefix slots each continuation query attends (its prefix's real ones; row b: prefix b // J)."""
    u, p = prefix_mask_UxP.shape
    return jnp.broadcast_to(jnp.repeat(prefix_mask_UxP, b // u, axis=0)[:, None, :], (b, t, p))


def _fused_attend(cfg: ModelConfig, q_BxTxKxGxH: jax.Array, k_BxKxSxH: jax.Array, v_BxKxSxH: jax.Array,
                  mask_BxTxS: jax.Array, shard: ShardActivation) -> jax.Array:
    """`_attend` by `jax.nn.dot_product_attention` (implementation `cfg.attention`: "xla" or "cudnn"), which
    takes the grouped K/V heads as they are (query head k·G + g reads KV head k, our grouping) and the
    boolean mask, so any padding pattern is exact; cuDNN turns the mask into an additive [B, 1, T, S] bias
    and never writes the [B, N, T, S] scores (flash attention)."""
    B, T, K, G, H = q_BxTxKxGxH.shape
    out_BxTxNxH = jax.nn.dot_product_attention(
        shard(q_BxTxKxGxH.reshape(B, T, K * G, H), FUSED_QUERY_AXES), shard(k_BxKxSxH.swapaxes(1, 2), FUSED_KV_AXES),
        shard(v_BxKxSxH.swapaxes(1, 2), FUSED_KV_AXES), mask=shard(mask_BxTxS, FUSED_MASK_AXES)[:, None],
        scale=1.0 / math.sqrt(cfg.head_dim), implementation=cfg.attention)
    return out_BxTxNxH.reshape(B, T, K, G, H)


def _attend_without_cache(cfg: ModelConfig, q_BxTxKxGxH: jax.Array, k_BxKxSxH: jax.Array, v_BxKxSxH: jax.Array,
                          mask_BxTxS: jax.Array, shard: ShardActivation) -> jax.Array:
    """The attention of a forward without a KV cache, in the implementation `cfg.attention` names; `shard`
    lays out a fused kernel's operands (`Transformer._shard`)."""
    if cfg.attention == "einsum":
        return _attend(cfg, q_BxTxKxGxH, k_BxKxSxH, v_BxKxSxH, mask_BxTxS)
    return _fused_attend(cfg, q_BxTxKxGxH, k_BxKxSxH, v_BxKxSxH, mask_BxTxS, shard)


def attend_continuations(cfg: ModelConfig, q_BxTxKxGxH: jax.Array, k_BxKxTxH: jax.Array, v_BxKxTxH: jax.Array,
                         mask_BxTxT: jax.Array, k_UxKxPxH: jax.Array, v_UxKxPxH: jax.Array,
                         prefix_mask_UxP: jax.Array, shard: ShardActivation) -> jax.Array:
    """`_attend_with_prefix` in the implementation `cfg.attention` names. A fused kernel reads one K/V
    sequence per row, so it gets [prefix b // J ; own tokens] concatenated, S = P + T (the J rows of a prefix
    copy its K/V: B·P·K·H per layer, small next to the [B, N, T, S] scores the einsum path writes)."""
    if cfg.attention == "einsum":
        return _attend_with_prefix(cfg, q_BxTxKxGxH, k_BxKxTxH, v_BxKxTxH, mask_BxTxT, k_UxKxPxH, v_UxKxPxH,
                                   prefix_mask_UxP)
    B, T = mask_BxTxT.shape[:2]
    J = B // prefix_mask_UxP.shape[0]
    k_BxKxSxH = jnp.concatenate([jnp.repeat(k_UxKxPxH, J, axis=0), k_BxKxTxH], axis=2)
    v_BxKxSxH = jnp.concatenate([jnp.repeat(v_UxKxPxH, J, axis=0), v_BxKxTxH], axis=2)
    mask_BxTxS = jnp.concatenate([_continuation_prefix_mask(prefix_mask_UxP, B, T), mask_BxTxT], axis=-1)
    return _fused_attend(cfg, q_BxTxKxGxH, k_BxKxSxH, v_BxKxSxH, mask_BxTxS, shard)
