"""One decode step's attention as one Pallas (Triton) kernel: a row's new token attends [the real slots of its
shared prefix ; its own cache's slots] with one online softmax, writing its new key and value into its own cache
in place (the cache buffers are aliased to the kernel's outputs).

Why: XLA's GPU compiler ran this as ten launches per layer and token (the key and value cache writes, the query
RoPE, the scores, a masked concatenate, two probability slices, two P.V GEMMs and their add; benchmarks/
AOT_RESULTS.md, "Decode kernels"); here it is one, after the key/query RoPE fusion. The maths is
`attention._attend_cached_with_prefix`'s (a KV cache's layout, `KVCache`), except that the probabilities are
normalised after the P.V dot (online softmax) rather than before. Used on GPUs only (`sampling.
FUSED_DECODE_ATTENTION`); CPU and TPU keep the XLA path. Tests run it in Pallas's interpret mode on CPU.

Einsum legend as in models/attention.py: B rows, K key/value heads, G query heads per KV head, H head dim, S own
slots, U shared prefixes, J rows per prefix (B = U·J), P prefix slots, M = G query rows of one KV head.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Key/value slots per block of the online softmax; query rows of one KV head padded to a tile of at least this
# many (Triton's dot wants every side >= 16).
BLOCK_SLOTS = 64
MIN_ROWS = 16


def _online_block(carry: tuple[jax.Array, jax.Array, jax.Array], s_MxN: jax.Array, v_NxH: jax.Array
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The running (unnormalised output [M, H], maximum [M], sum [M]) after one more block of masked float32
    scores [M, N] and their values [N, H] (flash attention's update)."""
    o_MxH, m_M, l_M = carry
    m_next = jnp.maximum(m_M, s_MxN.max(axis=1))
    correction = jnp.exp(m_M - m_next)
    p_MxN = jnp.exp(s_MxN - m_next[:, None])
    o_MxH = correction[:, None] * o_MxH + plgpu.dot(p_MxN.astype(v_NxH.dtype), v_NxH,
                                                    allow_tf32=v_NxH.dtype != jnp.float32)
    return o_MxH, m_next, correction * l_M + p_MxN.sum(axis=1)


def _kernel(index_ref, q_ref, k_new_ref, v_new_ref, mask_ref, k_ref, v_ref, prefix_k_ref, prefix_v_ref,
            prefix_mask_ref, o_ref, k_out_ref, v_out_ref, *, rows: int, tile: int, slots: int, prefix_slots: int,
            scale: float) -> None:
    """One (row, KV head): its G queries [tile, H] (rows past G masked) over the prefix's slots, then its own
    slots with slot `index` read from the new key/value; the new key/value stored into that slot."""
    row_mask = (jnp.arange(tile) < rows)[:, None]
    q_MxH = plgpu.load(q_ref.at[pl.ds(0, tile), :], mask=row_mask, other=0)
    index = index_ref[0]
    k_new_H, v_new_H = k_new_ref[...], v_new_ref[...]
    exact = q_MxH.dtype != jnp.float32

    def scores(k_HxN: jax.Array, keep_N: jax.Array) -> jax.Array:
        s_MxN = plgpu.dot(q_MxH, k_HxN, allow_tf32=exact) * scale
        return jnp.where(keep_N[None, :], s_MxN, jnp.finfo(jnp.float32).min)

    def prefix_block(i, carry):
        cols_N = i * BLOCK_SLOTS + jnp.arange(BLOCK_SLOTS)
        valid_N = cols_N < prefix_slots
        k_HxN = plgpu.load(prefix_k_ref.at[:, pl.ds(i * BLOCK_SLOTS, BLOCK_SLOTS)], mask=valid_N[None, :], other=0)
        v_NxH = plgpu.load(prefix_v_ref.at[pl.ds(i * BLOCK_SLOTS, BLOCK_SLOTS), :], mask=valid_N[:, None], other=0)
        keep_N = plgpu.load(prefix_mask_ref.at[pl.ds(i * BLOCK_SLOTS, BLOCK_SLOTS)], mask=valid_N, other=0) != 0
        return _online_block(carry, scores(k_HxN, keep_N), v_NxH)

    def own_block(i, carry):
        cols_N = i * BLOCK_SLOTS + jnp.arange(BLOCK_SLOTS)
        valid_N = cols_N < slots
        new_N = cols_N == index
        k_HxN = plgpu.load(k_ref.at[:, pl.ds(i * BLOCK_SLOTS, BLOCK_SLOTS)], mask=valid_N[None, :], other=0)
        k_HxN = jnp.where(new_N[None, :], k_new_H[:, None], k_HxN)
        v_NxH = plgpu.load(v_ref.at[pl.ds(i * BLOCK_SLOTS, BLOCK_SLOTS), :], mask=valid_N[:, None], other=0)
        v_NxH = jnp.where(new_N[:, None], v_new_H[None, :], v_NxH)
        keep_N = plgpu.load(mask_ref.at[pl.ds(i * BLOCK_SLOTS, BLOCK_SLOTS)], mask=valid_N, other=0) != 0
        return _online_block(carry, scores(k_HxN, keep_N), v_NxH)

    head_dim = q_MxH.shape[1]
    carry = (jnp.zeros((tile, head_dim), jnp.float32), jnp.full((tile,), jnp.finfo(jnp.float32).min, jnp.float32),
             jnp.zeros((tile,), jnp.float32))
    carry = lax.fori_loop(0, pl.cdiv(prefix_slots, BLOCK_SLOTS), prefix_block, carry)
    o_MxH, _, l_M = lax.fori_loop(0, pl.cdiv(slots, BLOCK_SLOTS), own_block, carry)
    plgpu.store(o_ref.at[pl.ds(0, tile), :], (o_MxH / l_M[:, None]).astype(o_ref.dtype), mask=row_mask)
    plgpu.store(k_out_ref.at[:, pl.ds(index, 1)], k_new_H[:, None].astype(k_out_ref.dtype))
    plgpu.store(v_out_ref.at[pl.ds(index, 1), :], v_new_H[None, :].astype(v_out_ref.dtype))


def fits(head_dim: int, rows: int) -> bool:
    """Whether the kernel's tiles fit these shapes on a GPU: Triton tiles are powers of two of at least 16."""
    return head_dim >= MIN_ROWS and head_dim & (head_dim - 1) == 0 and rows <= 128


def decode_attention(q_BxKxMxH: jax.Array, k_new_BxKxH: jax.Array, v_new_BxKxH: jax.Array, mask_BxS: jax.Array,
                     index: jax.Array, k_BxKxHxS: jax.Array, v_BxKxSxH: jax.Array, prefix_k_UxKxHxP: jax.Array,
                     prefix_v_UxKxPxH: jax.Array, prefix_mask_UxP: jax.Array, *, interpret: bool = False
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention [B, K, M, H] of each row's one new token (rotated queries q, key k_new, value v_new) over
    [its prefix b // J's slots that `prefix_mask_UxP` marks ; its own slots that `mask_BxS` marks], with k_new and
    v_new written into own slot `index` of the caches (returned: k [B, K, H, S], v [B, K, S, H], in place)."""
    B, K, M, H = q_BxKxMxH.shape
    S, (U, P) = k_BxKxHxS.shape[3], prefix_mask_UxP.shape
    J, tile = B // U, max(MIN_ROWS, 1 << (M - 1).bit_length())
    kernel = functools.partial(_kernel, rows=M, tile=tile, slots=S, prefix_slots=P, scale=1.0 / math.sqrt(H))
    own, shared = (lambda b, k: (b, k, 0, 0)), (lambda b, k: (b // J, k, 0, 0))
    in_specs = [pl.BlockSpec((1,), lambda b, k: (0,)),
                pl.BlockSpec((None, None, tile, H), own),
                pl.BlockSpec((None, None, H), lambda b, k: (b, k, 0)),
                pl.BlockSpec((None, None, H), lambda b, k: (b, k, 0)),
                pl.BlockSpec((None, S), lambda b, k: (b, 0)),
                pl.BlockSpec((None, None, H, S), own),
                pl.BlockSpec((None, None, S, H), own),
                pl.BlockSpec((None, None, H, P), shared),
                pl.BlockSpec((None, None, P, H), shared),
                pl.BlockSpec((None, P), lambda b, k: (b // J, 0))]
    return pl.pallas_call(
        kernel, grid=(B, K), in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, None, tile, H), own), pl.BlockSpec((None, None, H, S), own),
                   pl.BlockSpec((None, None, S, H), own)],
        out_shape=[jax.ShapeDtypeStruct(q_BxKxMxH.shape, q_BxKxMxH.dtype),
                   jax.ShapeDtypeStruct(k_BxKxHxS.shape, k_BxKxHxS.dtype),
                   jax.ShapeDtypeStruct(v_BxKxSxH.shape, v_BxKxSxH.dtype)],
        input_output_aliases={5: 1, 6: 2}, interpret=interpret, name="decode_attention",
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
    )(jnp.reshape(index, (1,)).astype(jnp.int32), q_BxKxMxH, k_new_BxKxH, v_new_BxKxH, mask_BxS.astype(jnp.int32),
      k_BxKxHxS, v_BxKxSxH, prefix_k_UxKxHxP, prefix_v_UxKxPxH, prefix_mask_UxP.astype(jnp.int32))
