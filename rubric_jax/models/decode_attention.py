"""One decode step's attention as one Pallas (Triton) kernel: a row's new token, its query, key and value heads as
one projected array, is rotated (RoPE) and attends [the real slots of its shared prefix ; its own cache's slots]
with one online softmax, its key and value written into its own cache in place (the cache buffers are aliased to
the kernel's outputs).

Why: XLA's GPU compiler ran this as eleven launches per layer and token (the query RoPE, the key RoPE and cache
write, the value write, the scores, a masked concatenate, two probability slices, two P.V GEMMs and their add;
benchmarks/AOT_RESULTS.md, "Decode kernels"); here it is one, after the one fusion that sums the merged QKV GEMM's
split-K partials and adds its bias. The maths is `attention._attend_cached_with_prefix`'s over `transformer.
apply_rope`'s rotations (a KV cache's layout, `KVCache`), except that the probabilities are normalised after the
P.V dot (online softmax) rather than before. Used on one GPU only (`sampling.DECODE_ATTENTION`); CPU and TPU keep
the XLA path. Tests run it in Pallas's interpret mode on CPU.

Einsum legend as in models/attention.py: B rows, K key/value heads, G query heads per KV head (N = K·G), H head
dim, S own slots, U shared prefixes, J rows per prefix (B = U·J), P prefix slots, C = N + 2K projected heads.
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


def _kernel(index_ref, qkv_ref, cos_ref, sin_ref, mask_ref, k_ref, v_ref, prefix_k_ref, prefix_v_ref,
            prefix_mask_ref, o_ref, k_out_ref, v_out_ref, *, rows: int, tile: int, slots: int, prefix_slots: int,
            scale: float) -> None:
    """One (row, KV head k): its G queries [tile, H] (rows past G masked) and its new key rotated (`_rope`), then
    attending the prefix's slots and its own slots, slot `index` read from the new key/value; the new key/value
    stored into that slot. Head dims are handled in halves [lo ; hi] (RoPE's rotate_half pairs them)."""
    head_dim = qkv_ref.shape[-1]
    kv_head, heads = pl.program_id(1), qkv_ref.shape[0] - 2 * pl.num_programs(1)
    lo, hi = pl.ds(0, head_dim // 2), pl.ds(head_dim // 2, head_dim // 2)
    dtype = qkv_ref.dtype
    row_mask = (jnp.arange(tile) < rows)[:, None]
    cos, sin = (ref[...].astype(dtype) for ref in (cos_ref, sin_ref))
    queries = pl.ds(kv_head * rows, tile)
    q_lo, q_hi = _rope(*(plgpu.load(qkv_ref.at[queries, half], mask=row_mask, other=0) for half in (lo, hi)),
                       cos[None, :], sin[None, :])
    k_new_lo, k_new_hi = _rope(*(plgpu.load(qkv_ref.at[heads + kv_head, half]) for half in (lo, hi)), cos, sin)
    v_new_H = plgpu.load(qkv_ref.at[heads + pl.num_programs(1) + kv_head, :])
    index = index_ref[0]
    tf32 = dtype != jnp.float32

    def attend_block(carry, k_ref_, v_ref_, keep_ref, i, limit, new_N=None):
        cols = pl.ds(i * BLOCK_SLOTS, BLOCK_SLOTS)
        valid_N = i * BLOCK_SLOTS + jnp.arange(BLOCK_SLOTS) < limit
        k_lo, k_hi = (plgpu.load(k_ref_.at[half, cols], mask=valid_N[None, :], other=0) for half in (lo, hi))
        v_NxH = plgpu.load(v_ref_.at[cols, :], mask=valid_N[:, None], other=0)
        if new_N is not None:  # the own cache's slot `index` holds the new key/value (written at the end)
            k_lo, k_hi = (jnp.where(new_N[None, :], x[:, None], k) for x, k in ((k_new_lo, k_lo), (k_new_hi, k_hi)))
            v_NxH = jnp.where(new_N[:, None], v_new_H[None, :], v_NxH)
        s_MxN = (plgpu.dot(q_lo, k_lo, allow_tf32=tf32) + plgpu.dot(q_hi, k_hi, allow_tf32=tf32)) * scale
        keep_N = plgpu.load(keep_ref.at[cols], mask=valid_N, other=False)
        return _online_block(carry, jnp.where(keep_N[None, :], s_MxN, jnp.finfo(jnp.float32).min), v_NxH)

    def prefix_block(i, carry):
        return attend_block(carry, prefix_k_ref, prefix_v_ref, prefix_mask_ref, i, prefix_slots)

    def own_block(i, carry):
        new_N = i * BLOCK_SLOTS + jnp.arange(BLOCK_SLOTS) == index
        return attend_block(carry, k_ref, v_ref, mask_ref, i, slots, new_N)

    carry = (jnp.zeros((tile, head_dim), jnp.float32), jnp.full((tile,), jnp.finfo(jnp.float32).min, jnp.float32),
             jnp.zeros((tile,), jnp.float32))
    carry = lax.fori_loop(0, pl.cdiv(prefix_slots, BLOCK_SLOTS), prefix_block, carry)
    o_MxH, _, l_M = lax.fori_loop(0, pl.cdiv(slots, BLOCK_SLOTS), own_block, carry)
    plgpu.store(o_ref.at[pl.ds(0, tile), :], (o_MxH / l_M[:, None]).astype(o_ref.dtype), mask=row_mask)
    for half, x in ((lo, k_new_lo), (hi, k_new_hi)):
        plgpu.store(k_out_ref.at[half, pl.ds(index, 1)], x[:, None].astype(k_out_ref.dtype))
    plgpu.store(v_out_ref.at[pl.ds(index, 1), :], v_new_H[None, :].astype(v_out_ref.dtype))


def _rope(x_lo: jax.Array, x_hi: jax.Array, cos: jax.Array, sin: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`transformer.apply_rope` on a head's halves: x·[cos ; cos] + rotate_half(x)·[sin ; sin], rotate_half(x) =
    [-x_hi ; x_lo] (a RoPE table's two halves are equal, `transformer.rope_tables`)."""
    return x_lo * cos - x_hi * sin, x_hi * cos + x_lo * sin


def fits(head_dim: int, rows: int) -> bool:
    """Whether the kernel's tiles fit these shapes on a GPU: Triton tiles are powers of two of at least 16 (a head
    dim in halves)."""
    return head_dim >= 2 * MIN_ROWS and head_dim & (head_dim - 1) == 0 and rows <= 128


def decode_attention(qkv_BxCxH: jax.Array, cos_BxH2: jax.Array, sin_BxH2: jax.Array, mask_BxS: jax.Array,
                     index: jax.Array, k_BxKxHxS: jax.Array, v_BxKxSxH: jax.Array, prefix_k_UxKxHxP: jax.Array,
                     prefix_v_UxKxPxH: jax.Array, prefix_mask_UxP: jax.Array, *, interpret: bool = False
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention [B, K, G, H] of each row's one new token over [its prefix b // J's slots that `prefix_mask_UxP`
    marks ; its own slots that `mask_BxS` marks], with its key and value written into own slot `index` of the caches
    (returned: k [B, K, H, S], v [B, K, S, H], in place). `qkv_BxCxH` is the token's projection as one array, C =
    N + 2K: its N = K·G query heads, K keys and K values, queries and keys unrotated (rotated here by cos/sin
    [B, H / 2] of its position, either half of a RoPE table): one array, so that XLA writes it with one fusion,
    not three."""
    B, C, H = qkv_BxCxH.shape
    K, S, (U, P) = k_BxKxHxS.shape[1], k_BxKxHxS.shape[3], prefix_mask_UxP.shape
    G, J = (C - 2 * K) // K, B // U
    tile = max(MIN_ROWS, 1 << (G - 1).bit_length())
    kernel = functools.partial(_kernel, rows=G, tile=tile, slots=S, prefix_slots=P, scale=1.0 / math.sqrt(H))
    own, shared = (lambda b, k: (b, k, 0, 0)), (lambda b, k: (b // J, k, 0, 0))
    row = lambda b, k: (b, 0)  # noqa: E731
    in_specs = [pl.BlockSpec((1,), lambda b, k: (0,)), pl.BlockSpec((None, C, H), lambda b, k: (b, 0, 0)),
                pl.BlockSpec((None, H // 2), row), pl.BlockSpec((None, H // 2), row), pl.BlockSpec((None, S), row),
                pl.BlockSpec((None, None, H, S), own), pl.BlockSpec((None, None, S, H), own),
                pl.BlockSpec((None, None, H, P), shared), pl.BlockSpec((None, None, P, H), shared),
                pl.BlockSpec((None, P), lambda b, k: (b // J, 0))]
    return pl.pallas_call(
        kernel, grid=(B, K), in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, None, tile, H), own), pl.BlockSpec((None, None, H, S), own),
                   pl.BlockSpec((None, None, S, H), own)],
        out_shape=[jax.ShapeDtypeStruct((B, K, G, H), qkv_BxCxH.dtype),
                   jax.ShapeDtypeStruct(k_BxKxHxS.shape, k_BxKxHxS.dtype),
                   jax.ShapeDtypeStruct(v_BxKxSxH.shape, v_BxKxSxH.dtype)],
        input_output_aliases={5: 1, 6: 2}, interpret=interpret, name="decode_attention",
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
    )(jnp.reshape(index, (1,)).astype(jnp.int32), qkv_BxCxH, cos_BxH2, sin_BxH2, mask_BxS, k_BxKxHxS,
      v_BxKxSxH, prefix_k_UxKxHxP, prefix_v_UxKxPxH, prefix_mask_UxP)
