"""Gumbel noise for rows `offset .. offset + B - 1` of a larger draw: bit for bit `jax.random.gumbel(key, (offset + B,
V))[offset:]`, computed for those B rows only. A rollout sampled in chunks of prompts (train/collect.py) draws with it
what one sampler call over every prompt draws, so chunking changes no token.

It relies on how JAX draws (checked by `check_supported`, tested against `jax.random.gumbel`): the threefry2x32
generator in its partitionable form, where element i of a draw (row-major) is threefry2x32(key, (i >> 32, i &
0xFFFFFFFF)), its two words xor-ed into 32 random bits, the uniform in [tiny, 1) built from the top 23 of them, and
the "low" dynamic-range Gumbel -log(-log(u)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p

_MASK16 = 0xFFFF


def check_supported(key: jax.Array) -> None:
    """Raises ValueError unless JAX draws as this module reproduces (threefry2x32 keys, partitionable threefry,
    the low dynamic-range Gumbel)."""
    impl = str(jax.random.key_impl(key)) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else (
        jax.config.jax_default_prng_impl)
    if "threefry2x32" not in impl or not jax.config.jax_threefry_partitionable or (
            jax.config.jax_high_dynamic_range_gumbel):
        raise ValueError(f"row_noise: chunked sampling reproduces JAX's partitionable threefry2x32 draws with the "
                         f"low-range Gumbel; this run has PRNG {impl}, jax_threefry_partitionable="
                         f"{jax.config.jax_threefry_partitionable}, jax_high_dynamic_range_gumbel="
                         f"{jax.config.jax_high_dynamic_range_gumbel}")


def _times(x_u32: jax.Array, c: int) -> tuple[jax.Array, jax.Array]:
    """(high, low) 32-bit words of the 64-bit product of uint32 `x_u32` and the constant 0 <= c < 2**32."""
    x_lo, x_hi = x_u32 & _MASK16, x_u32 >> 16
    c_lo, c_hi = np.uint32(c & _MASK16), np.uint32(c >> 16)
    low, cross_a, cross_b, high = x_lo * c_lo, x_lo * c_hi, x_hi * c_lo, x_hi * c_hi  # each < 2**32
    cross = cross_a + cross_b
    cross_carry = (cross < cross_a).astype(jnp.uint32)  # the sum of the cross terms overflowed 32 bits
    lo = low + (cross << 16)
    return high + (cross >> 16) + (cross_carry << 16) + (lo < low).astype(jnp.uint32), lo


def gumbel_rows(key: jax.Array, row_offset: jax.Array, shape: tuple[int, int], dtype: jnp.dtype = jnp.float32
                ) -> jax.Array:
    """Gumbel noise [B, V] equal to rows row_offset .. row_offset + B - 1 of `jax.random.gumbel(key, (., V))`
    (float32; `row_offset` may be traced)."""
    check_supported(key)
    if jnp.dtype(dtype) != jnp.float32:
        raise ValueError(f"gumbel_rows: float32 only, got {dtype}")
    rows, vocab = shape
    row_B = jnp.asarray(row_offset, jnp.uint32) + jnp.arange(rows, dtype=jnp.uint32)
    base_hi, base_lo = _times(row_B, vocab)  # first element of each row: row * V
    lo_BxV = base_lo[:, None] + jnp.arange(vocab, dtype=jnp.uint32)[None, :]
    hi_BxV = base_hi[:, None] + (lo_BxV < base_lo[:, None]).astype(jnp.uint32)
    words = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    bits_a, bits_b = threefry2x32_p.bind(words[0], words[1], hi_BxV, lo_BxV)
    mantissa = ((bits_a ^ bits_b) >> np.uint32(9)) | np.array(1.0, np.float32).view(np.uint32)
    floats = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - jnp.float32(1.0)
    low, high = jnp.float32(np.finfo(np.float32).tiny), jnp.float32(1.0)
    return -jnp.log(-jnp.log(jnp.maximum(low, floats * (high - low) + low)))
