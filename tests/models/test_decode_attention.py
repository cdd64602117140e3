"""The decode step's Pallas attention kernel (models/decode_attention.py) against the XLA path it replaces on a GPU,
in Pallas's interpret mode on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax.models import attention, decode_attention
from rubric_jax.models.transformer import apply_rope


def test_the_kernel_gives_the_xla_paths_attention_and_cache_writes():
    """Several blocks of prefix and own slots, the first prefix block wholly padding for some prompts (left-padded),
    J = 2 rows per prompt, G = 6 query rows padded to a tile of 16: the output within 1e-5 of RoPE + cache write +
    `_attend_cached_with_prefix` in float32, and the caches equal to theirs (only slot `index` written). Fails where
    the kernel's RoPE, masks, online softmax across blocks, prefix row (b // J) or new slot are wrong."""
    B, K, G, H, S, U, P, index = 8, 2, 6, 32, 150, 4, 160, 77
    keys = iter(jax.random.split(jax.random.key(0), 8))
    qkv_BxCxH = jax.random.normal(next(keys), (B, K * G + 2 * K, H))
    k_BxKxHxS, v_BxKxSxH = (jax.random.normal(next(keys), shape) for shape in ((B, K, H, S), (B, K, S, H)))
    prefix_k, prefix_v = (jax.random.normal(next(keys), shape) for shape in ((U, K, H, P), (U, K, P, H)))
    starts_U = jnp.array([0, 70, 3, 129])  # left padding: prompt u's real slots begin at starts_U[u]
    prefix_mask_UxP = jnp.arange(P)[None, :] >= starts_U[:, None]
    mask_BxS = jnp.broadcast_to(jnp.arange(S) <= index, (B, S)).at[1, 5].set(False)
    angle_BxH2 = jax.random.uniform(next(keys), (B, H // 2)) * 6  # a RoPE table's half (`rope_tables`)
    cos_BxH, sin_BxH = (jnp.concatenate([f(angle_BxH2)] * 2, axis=-1) for f in (jnp.cos, jnp.sin))

    out_BxKxGxH, k, v = jax.jit(lambda *a: decode_attention.decode_attention(*a, interpret=True))(
        qkv_BxCxH, jnp.cos(angle_BxH2), jnp.sin(angle_BxH2), mask_BxS, jnp.int32(index), k_BxKxHxS, v_BxKxSxH,
        prefix_k, prefix_v, prefix_mask_UxP)

    rotate = lambda x: apply_rope(x[:, None], cos_BxH[:, None], sin_BxH[:, None])[:, 0]  # noqa: E731
    q_BxKxGxH = rotate(qkv_BxCxH[:, :K * G]).reshape(B, K, G, H)
    k_new_BxKxH, v_new_BxKxH = rotate(qkv_BxCxH[:, K * G:K * G + K]), qkv_BxCxH[:, K * G + K:]
    want_k, want_v = k_BxKxHxS.at[..., index].set(k_new_BxKxH), v_BxKxSxH.at[:, :, index].set(v_new_BxKxH)

    class Config:
        head_dim = H

    want = attention._attend_cached_with_prefix(Config, q_BxKxGxH[:, None], want_k, want_v, mask_BxS[:, None],
                                                prefix_k, prefix_v, prefix_mask_UxP)[:, 0]
    np.testing.assert_allclose(out_BxKxGxH, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(k, want_k, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(v, want_v)
