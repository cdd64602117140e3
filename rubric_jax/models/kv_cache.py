"""The decoder's KV cache: every layer's keys and values for S slots per row, laid out as the attention dots read
them (`KVCache`), the shared prefixes a cached forward continues (`SharedPrefix`), and a layer's write-then-read
of its new slots (`write_and_read`).

Einsum legend (as in models/transformer.py): L layers, B rows, K key/value heads, H head dim, S slots, T new
tokens, U shared prefixes, P prefix slots.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rubric_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
    """Keys and values of every layer for S slots, stacked: k [L, B, K, H, S], v [L, B, K, S, H] (what a layer scan
    updates in place), or per layer: k, v tuples of L arrays [B, K, H, S] and [B, K, S, H] (`init_cache(per_layer=
    True)`, for a forward over per-layer weights, `unstack_layers`). A layer's k and v are what the attention dots
    read, batch dims first and each the plain right operand of its dot, q [M, H]·k [H, S] and p [M, S]·v [S, H]:
    no transpose of the cache per layer and token (XLA CPU's dot packed a [S, H] key cache for every decode step:
    3.5-4x slower scores, benchmarks/RESULTS.md)."""

    k: jax.Array | tuple[jax.Array, ...]
    v: jax.Array | tuple[jax.Array, ...]

    @property
    def per_layer(self) -> bool:
        """Whether k and v are tuples of per-layer arrays (else stacked on L)."""
        return isinstance(self.k, tuple)


@struct.dataclass
class SharedPrefix:
    """The cached keys/values of U prefixes that a cached forward's B = U·J rows continue: row b attends
    [the real slots of prefix b // J ; its own cache's slots] with one softmax, so J rows that share a
    prefix (a prompt's samples) read it once and never hold a copy of it. Laid out like a `KVCache`."""

    cache: KVCache  # k [U, K, H, P], v [U, K, P, H] per layer (or stacked on L)
    mask_UxP: jax.Array  # bool: which prefix slots hold real tokens
    # How a decode step (one new token per row, per-layer caches) attends it: "xla" (einsums, one softmax over
    # [prefix ; own] as one array), "xla_split" (einsums, the two parts' maxima and sums kept apart: CPUs), "pallas"
    # (one fused Pallas kernel per layer, `decode_attention`: GPUs) or "interpret" (that kernel in Pallas's
    # interpret mode). `attention.FUSED_KERNELS` are the last two.
    kernel: str = struct.field(pytree_node=False, default="xla")


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: Any = None, *, per_layer: bool = False) -> KVCache:
    """An all-zero cache with `max_len` slots per sequence (keys [.., H, S], values [.., S, H]: `KVCache`), in the
    compute dtype by default: stacked, or per layer (L arrays of their own, what a forward over `unstack_layers`
    weights writes in place)."""
    k_shape = (batch, cfg.num_kv_heads, cfg.head_dim, max_len)
    v_shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    dtype = dtype or jnp.dtype(cfg.compute_dtype)
    if per_layer:
        return KVCache(k=tuple(jnp.zeros(k_shape, dtype) for _ in range(cfg.num_layers)),
                       v=tuple(jnp.zeros(v_shape, dtype) for _ in range(cfg.num_layers)))
    return KVCache(k=jnp.zeros((cfg.num_layers, *k_shape), dtype), v=jnp.zeros((cfg.num_layers, *v_shape), dtype))


def write_and_read(cache: jax.Array | tuple[jax.Array, ...], new: jax.Array, layer: jax.Array | int,
                   cache_index: jax.Array, window: int, axis: int) -> tuple[jax.Array | tuple[jax.Array, ...],
                                                                            jax.Array]:
    """One of a cache's k or v (stacked on L, or per layer, `layer` then a Python int) with the new slots `new`
    (a layer's layout, slots on `axis`: 3 for k [B, K, H, T], 2 for v [B, K, T, H]) written at `cache_index` of
    layer `layer`, and that layer's first `window` slots."""
    start = [0, 0, 0, 0]
    start[axis] = cache_index
    if isinstance(cache, tuple):
        written = jax.lax.dynamic_update_slice(cache[layer], new.astype(cache[layer].dtype), tuple(start))
        return cache[:layer] + (written,) + cache[layer + 1:], jax.lax.slice_in_dim(written, 0, window, axis=axis)
    written = jax.lax.dynamic_update_slice(cache, new[None].astype(cache.dtype), (layer, *start))
    sizes = list(cache.shape[1:])
    sizes[axis] = window
    return written, jax.lax.dynamic_slice(written, (layer, 0, 0, 0, 0), (1, *sizes))[0]

