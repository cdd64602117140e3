"""rubric_jax/row_noise.py: Gumbel noise for a block of rows, bit for bit the rows of JAX's own draw."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_jax import row_noise


@pytest.mark.parametrize("offset, rows, vocab", [(0, 4, 64), (5, 3, 2048), (13, 8, 18992), (0, 1, 1)])
def test_rows_are_those_of_jax_random_gumbel(offset, rows, vocab):
    key = jax.random.fold_in(jax.random.key(7), 3)
    want = jax.random.gumbel(key, (offset + rows, vocab))[offset:]
    got = jax.jit(row_noise.gumbel_rows, static_argnums=2)(key, jnp.int32(offset), (rows, vocab))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_element_indices_past_32_bits_are_exact():
    """Row * vocab carries into the high word of the 64-bit element index (a large rollout of a 152k vocab)."""
    x = np.random.default_rng(0).integers(0, 2**32, 500, dtype=np.uint64)
    for c in (1, 2048, 151936, 65537, 2**32 - 1):
        hi, lo = row_noise._times(jnp.asarray(x.astype(np.uint32)), c)
        got = (np.asarray(hi).astype(object) << 32) | np.asarray(lo).astype(object)
        assert list(got) == [int(v) * c for v in x], c


def test_another_generator_is_refused():
    with pytest.raises(ValueError, match="partitionable threefry2x32 draws"):
        row_noise.gumbel_rows(jax.random.key(0, impl="rbg"), 0, (2, 4))
