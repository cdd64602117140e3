"""Samplers by name ("greedy", "temperature(0.7)", "topk(40)", "nucleus(0.9)", "nucleus(0.9, 0.7)"; parsed by
rubric_jax/sampler_names.py) and the draw of one token per row with its log-prob under softmax(logits / T): what
`rubric_jax.sampling`'s decode loop calls each step. The temperature and top_p reach a compiled program as runtime data (`sampling._program_sampler`).

Shape legend: B rows, V vocabulary, C vocabulary blocks (a vocabulary split over devices).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax import row_noise, sharding
from rubric_jax.sampler_names import Sampler

def top_k_filter(logits_BxV: jax.Array, k: int) -> jax.Array:
    """Keeps the k largest logits per row (ties with the k-th are kept), the rest become -inf."""
    kth_Bx1 = jax.lax.top_k(logits_BxV, min(k, logits_BxV.shape[-1]))[0][:, -1:]
    return jnp.where(logits_BxV >= kth_Bx1, logits_BxV, -jnp.inf)


def top_p_filter(logits_BxV: jax.Array, p: float) -> jax.Array:
    """Keeps the smallest set of most likely tokens whose probability reaches p (always >= 1 token);
    p = 1 keeps every token; a traced p (the runtime top_p of `generate`) always runs the filter.

    A token is kept iff the mass of the more likely tokens is < p, i.e. iff its tail mass (itself and
    every less likely token) is > 1 - p. The tail is summed from the least likely token up, so float32
    rounding stays at the scale of the tail: a cumulative sum from the top drifts by ~1e-4 at vocab
    32k, enough to drop about a thousand tokens at p = 1.
    """
    if isinstance(p, float) and p >= 1.0:
        return logits_BxV
    ascending_BxV = jnp.sort(logits_BxV, axis=-1)
    tail_BxV = jnp.cumsum(jax.nn.softmax(ascending_BxV, axis=-1), axis=-1)
    most_likely_V = jnp.arange(logits_BxV.shape[-1]) == logits_BxV.shape[-1] - 1
    keep_BxV = (tail_BxV > 1.0 - p) | most_likely_V[None, :]
    threshold_Bx1 = jnp.min(jnp.where(keep_BxV, ascending_BxV, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits_BxV >= threshold_Bx1, logits_BxV, -jnp.inf)


def _argmax(x_BxV: jax.Array) -> jax.Array:
    """`jnp.argmax` over the last axis (the first maximal index) as two reductions, a max and a min of
    the maximal indices: over a vocab split across devices that is two tiny all-reduces, where argmax's
    (value, index) reduction all-gathers every shard's pair on each decode step. A row with a NaN has no maximal
    index: it gets the last id, never the vocabulary size."""
    best_Bx1 = jnp.max(x_BxV, axis=-1, keepdims=True)
    vocab = x_BxV.shape[-1]
    return jnp.min(jnp.where(x_BxV == best_Bx1, jnp.arange(vocab, dtype=jnp.int32), vocab - 1), axis=-1)


def sample_tokens(logits_BxV: jax.Array, key: jax.Array, sampler: Sampler, row_offset: jax.Array | None = None
                  ) -> jax.Array:
    """Draws one token per row from float32 logits according to `sampler` (the same draws as
    `jax.random.categorical`: the argmax of logits plus Gumbel noise); with `row_offset` the rows draw the noise of
    rows row_offset.. of a larger batch (`row_noise`)."""
    if sampler.kind == "greedy":
        return _argmax(logits_BxV)
    scaled_BxV = logits_BxV / sampler.temperature
    if sampler.kind == "topk":
        scaled_BxV = top_k_filter(scaled_BxV, sampler.top_k)
    elif sampler.kind == "nucleus":
        scaled_BxV = top_p_filter(scaled_BxV, sampler.top_p)
    noise_BxV = (jax.random.gumbel(key, scaled_BxV.shape, scaled_BxV.dtype) if row_offset is None else
                 row_noise.gumbel_rows(key, row_offset, scaled_BxV.shape, scaled_BxV.dtype))
    return _argmax(scaled_BxV + noise_BxV)


def _best_and_logsumexp(a: tuple[jax.Array, ...], b: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """`_fused_draw`'s reducer over (key, index, scaled at index, running max, sum of exp(scaled - max)): the larger
    key (the lower index on a tie, as `_argmax`) with its index and scaled logit, and the two partial sums merged at
    their common maximum (online softmax)."""
    key_a, index_a, at_a, max_a, sum_a = a
    key_b, index_b, at_b, max_b, sum_b = b
    take_b = (key_b > key_a) | ((key_b == key_a) & (index_b < index_a))
    top = jnp.maximum(max_a, max_b)
    return (jnp.where(take_b, key_b, key_a), jnp.where(take_b, index_b, index_a), jnp.where(take_b, at_b, at_a), top,
            sum_a * jnp.exp(max_a - top) + sum_b * jnp.exp(max_b - top))


def _fused_draw(logits_BxV: jax.Array, key: jax.Array, sampler: Sampler, row_offset: jax.Array | None,
                vocab_shards: int) -> tuple[jax.Array, jax.Array]:
    """`sample_tokens`'s token (greedy or temperature) and its log-prob under softmax(logits / T), from one variadic
    reduction over the vocabulary that reads the logits once, in their own dtype (a decode step's compute-dtype
    logits: no float32 [B, V] copy in memory, one reduction kernel where an argmax and a log-softmax took five on
    XLA's GPU compiler, issue 33). The same draws and tokens; the log-prob's sum runs in another order (float32
    rounding). Over a vocabulary split in `vocab_shards` blocks each block reduces its own part, merged by
    `_merge_blocks` (all-reduces: the partitioner all-gathers the partial results of a variadic reduction)."""
    batch, vocab = logits_BxV.shape
    scaled_BxV = logits_BxV.astype(jnp.float32) / sampler.temperature
    drawn_BxV = scaled_BxV
    if sampler.kind != "greedy":
        drawn_BxV = scaled_BxV + (jax.random.gumbel(key, scaled_BxV.shape, jnp.float32) if row_offset is None else
                                  row_noise.gumbel_rows(key, row_offset, scaled_BxV.shape, jnp.float32))
    shape = (batch, vocab_shards, vocab // vocab_shards)
    index = jax.lax.broadcasted_iota(jnp.int32, shape, 1) * shape[2] + jax.lax.broadcasted_iota(jnp.int32, shape, 2)
    lowest = jnp.float32(jnp.finfo(jnp.float32).min)  # a finite start: exp(lowest - lowest) is 1, not nan
    inits = (jnp.float32(-jnp.inf), jnp.int32(vocab), jnp.float32(0), lowest, jnp.float32(0))
    operands = (drawn_BxV.reshape(shape), index, scaled_BxV.reshape(shape), scaled_BxV.reshape(shape),
                jnp.ones(shape, jnp.float32))
    parts = jax.lax.reduce(operands, inits, _best_and_logsumexp, (2,))
    token_B, at_B, max_B, sum_B = _merge_blocks(*parts, vocab) if vocab_shards > 1 else (p[:, 0] for p in parts[1:])
    # A row with a NaN has no best key: it gets the last id, as `_argmax`, never the vocabulary size.
    return jnp.minimum(token_B, vocab - 1), at_B - max_B - jnp.log(sum_B)


def _merge_blocks(key_BxC: jax.Array, index_BxC: jax.Array, at_BxC: jax.Array, max_BxC: jax.Array, sum_BxC: jax.Array,
                  vocab: int) -> tuple[jax.Array, ...]:
    """`_best_and_logsumexp` over the C vocabulary blocks' partial results, by plain reductions (an all-reduce each
    over a split vocabulary): the token, its scaled logit, the maximum and the sum of exp(scaled - maximum)."""
    best_Bx1 = jnp.max(key_BxC, axis=1, keepdims=True)
    token_B = jnp.min(jnp.where(key_BxC == best_Bx1, index_BxC, vocab), axis=1)
    at_B = jnp.sum(jnp.where(index_BxC == token_B[:, None], at_BxC, 0.0), axis=1)  # one block holds the token
    max_Bx1 = jnp.max(max_BxC, axis=1, keepdims=True)
    return token_B, at_B, max_Bx1[:, 0], jnp.sum(sum_BxC * jnp.exp(max_BxC - max_Bx1), axis=1)


def draw_with_logprobs(logits_BxV: jax.Array, key: jax.Array, sampler: Sampler, row_offset: jax.Array | None = None,
                       vocab_shards: int = 1, one_pass: bool = True) -> tuple[jax.Array, jax.Array]:
    """One token per row (`sample_tokens`' draw) and its log-prob under softmax(logits / T): where `one_pass`, for
    greedy and temperature in one pass over the logits (`_fused_draw`, the vocabulary split in `vocab_shards` blocks
    like the logits, which must divide it); else, and for top-k and nucleus (which sort), as `sample_tokens` and a
    log-softmax."""
    if one_pass and sampler.kind in ("greedy", "temperature"):
        return _fused_draw(logits_BxV, key, sampler, row_offset, vocab_shards)
    logits_BxV = logits_BxV.astype(jnp.float32)
    token_B = sample_tokens(logits_BxV, key, sampler, row_offset)
    logp_BxV = jax.nn.log_softmax(logits_BxV / sampler.temperature, axis=-1)
    return token_B, jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0]


def vocab_blocks(layout: sharding.Layout, vocab: int) -> int:
    """The blocks a [B, V] array's vocabulary is split in by `layout` (1 where it is whole, or where they would not
    divide it evenly)."""
    axes = layout.sharding(("batch", "vocab"), (layout.batch_multiple, vocab)).spec[1]
    blocks = math.prod(layout.mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes or ()))
    return blocks if vocab % blocks == 0 else 1
