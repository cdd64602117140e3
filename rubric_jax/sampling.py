"""Batched autoregressive sampling: one jitted prefill + `lax.while_loop` decode over an explicit KV cache.

Shape legend: U distinct prompts (padded to a bucket), B = U·n rows (prompt u's samples are rows u·n + j),
P prompt slots (bucketed), R response slots (bucketed max_new_tokens), V vocab, C prefill chunk (P is written
into the cache C slots at a time), W attention window (the response cache's first W slots), D hidden,
T suffix slots (bucketed; 0 without suffixes).

Cache layout: each distinct prompt is prefilled once into a prompt cache (values [U, K, P, H], keys [U, K, H, P]
per layer: `models.kv_cache.KVCache`), left-padded to the longest one (`width`, runtime data), and never
repeated. Decode writes response token t of row b into slot t of a per-row response cache (values [B, K, W, H],
keys [B, K, H, W]) per layer; each step's attention is one softmax over [the real
slots of prompt b // n ; response slots 0..t of row b] (`models.kv_cache.SharedPrefix`), so the n samples
of a prompt read its keys/values once per step, as one GEMM, and hold no copy of them. With suffixes
(`generate(suffix_ids=...)`: a judge's shared [system; question; response] prompt and its D criteria), row b
first prefills its own suffix into its own cache, attending [prompt b // n ; its suffix], then decodes after it:
the shared part is prefilled once for its n rows. Prefill chunk c attends
over a window of at most twice its causal need (`prefill_windows`); decode over a window of the response cache
at most one block past its filled slots (`decode_windows`: the decode loop is a sequence of `while_loop`
segments, one per window, each compiled once and each growing the response cache to its window), so a long
response bucket costs what its filled part costs. Prefill and decode run the layers unrolled over per-layer
weights (`unstack_layers`) and per-layer caches (L arrays), and a decode segment carries exactly its window
of the response cache: every per-token slice of a stacked weight or of a cache is a copy in XLA's compiled
loop (see benchmarks/RESULTS.md). Memory: U·P + B·R KV slots per layer (not B·(P + R)); weights in per-layer
form (`loader.to_layout(..., per_layer=True)`, what a run's rollouts and judges use) are read in place, while
stacked weights are sliced into per-layer copies once per call, a second copy of the layers
(benchmarks/AOT_RESULTS.md).

Conventions (what the GRPO trainer relies on):
  * Log-probs are those of the tempered distribution softmax(logits / T) at the sampled token (T = 1
    for greedy), before any top-k / top-p truncation: for "temperature(T)" exactly the distribution
    the token was drawn from, and what the trainer computes teacher-forced with the same T
    (`rubric_jax.grpo.shared_prompt_logprobs`). GRPO rollouts use "temperature(T)" only
    (`rubric_jax.train.rollout.rollout_temperature` says why).
  * A stop token is part of the response: it is emitted, counted in `lengths` and has a log-prob;
    every slot after it holds `pad_id` with log-prob 0. finish_reason is "stop" when a stop token was
    emitted, else "length" (max_new_tokens reached).
  * Row b * n + j of every output is sample j of prompt b.
  * Prompt length, response length and batch are padded up to buckets (`padding.bucket_size`; the output
    rows to the caller's `response_buckets` where given), and jitted functions are cached per (graphdef,
    sampler kind and top_k, response buckets, prefill chunk, decode block, n, layout, suffix bucket); stop tokens,
    pad id, max_new_tokens, the prompt width, the temperature and top_p are runtime data (a served judge's clients
    cannot make it compile one program per temperature). Repeated calls within one bucket reuse one
    compiled program; `TRACES` counts traces per function (tests assert on it).
  * Placement is the caller's: `generate` is given `Weights` and the `sharding.Layout` they live in
    (usually the decode layout, `sharding.decode_layout`), checks every parameter's sharding and dtype
    against it and raises naming the first misplaced one; it never moves parameters. Rows are sharded
    like the layout's batch (the prompt bucket U is rounded up to a multiple of data * fsdp), the prompt and
    response caches like the batch and over KV heads on `tensor`.
  * `sample` leaves its outputs on the device (`Samples`, rows like the layout's batch): a rollout builds its
    training batch from them there and fetches only the tokens and lengths its judges read (`host_result`);
    `generate` is `sample` then `host_result`.
  * Multi-process: every process passes its own prompts (equally many), which become its block of the
    global batch, and gets back its own rows (`distributed.global_batch` / `local_rows`); only the
    padded shapes are agreed on across hosts, no rows cross them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from rubric_jax import distributed, loader, padding, sharding
from rubric_jax.sampler_names import Sampler, parse_sampler
from rubric_jax.samplers import draw_with_logprobs, vocab_blocks
from rubric_jax.models import attention as attention_lib
from rubric_jax.models.kv_cache import KVCache, SharedPrefix, init_cache
from rubric_jax.models.transformer import (Params, has_layer_stack, padding_to_positions, rope_tables, stack_layers,
                                           unstack_layers, with_merged_qkv)

TRACES: collections.Counter[str] = collections.Counter()
FINISH_STOP, FINISH_LENGTH = "stop", "length"
# Largest prefill chunk (tokens): bounds the prefill attention scores to [B, N, PREFILL_CHUNK, S]. 128 rather
# than 256: 1,024-token prompts prefill ~10% faster on CPU (the scores stay nearer the caches; RESULTS.md).
PREFILL_CHUNK = 128
# Smallest step between decode attention windows (response slots); see `decode_windows`.
DECODE_BLOCK = 128
# Decode steps per stop test, by device platform (1 where absent; `steps_per_check`). A GPU's runtime copies the
# predicate of a loop of unknown length to the host and waits for it every iteration, so there the decode loop tests
# every 8 tokens, running them as a loop of known length; CPU and TPU read it where it is.
STEPS_PER_CHECK = {"gpu": 8}
# Platforms whose decode draws the token and its log-prob in one variadic reduction (`samplers._fused_draw`): on XLA's GPU
# compiler two kernels where an argmax and a log-softmax took five; XLA's CPU backend runs that reduction ~10x slower
# than the two (4.5-5.5 ms vs 0.45 ms at 8 x 32k logits, measured under load), so CPU keeps them.
ONE_PASS_DRAW = frozenset({"gpu"})
# How a decode step attends its prompt and own cache, by device platform ("xla" where absent; `SharedPrefix.kernel`):
# on a GPU one Pallas kernel per layer (models/decode_attention.py), where XLA's GPU compiler ran ten; on a CPU the
# two parts' softmax statistics apart, as `_attend_with_prefix` does: the joined [prefix ; own] scores, written for
# XLA's GPU compiler (2431bb7), cost CPU rollouts 19% more sampling CPU time (0.140 vs 0.118 s a call, 8 samples
# per prompt; benchmarks/RESULTS.md).
DECODE_ATTENTION = {"gpu": "pallas", "cpu": "xla_split"}


# ------------------------------------------------------------------------------------------ generate


@struct.dataclass
class SamplingState:
    """Loop carry of the decode `while_loop`."""

    step: jax.Array  # [] int32: response slot the next token goes to
    tokens_BxR: jax.Array  # int32, pad_id where not (yet) generated
    logprobs_BxR: jax.Array  # float32, 0 where not generated
    done_B: jax.Array  # bool: row finished (stop token emitted, or a bucket-padding row)
    stopped_B: jax.Array  # bool: row emitted a stop token
    lengths_B: jax.Array  # int32: tokens emitted so far (including a stop token)
    # The response cache, per layer k [B, K, H, W] and v [B, K, W, H] (response token t in slot t); None once the
    # loop ends (not an output).
    cache: KVCache | None
    key: jax.Array


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """Host-side outputs; row b * n + j is sample j of prompt b."""

    tokens: np.ndarray  # [B*n, max_new_tokens] int32, response only, pad_id after the end
    logprobs: np.ndarray | None  # [B*n, max_new_tokens] float32, log softmax(logits / T) of each token, 0 after
    # the end; None where they were left on the device (`host_result(..., logprobs=False)`)
    lengths: np.ndarray  # [B*n] int32, generated tokens including the stop token
    finish_reason: np.ndarray  # [B*n] str, "stop" | "length"
    num_steps: int  # tokens generated per row by the loop (< max_new_tokens when all rows stopped early)


def _emit(state: SamplingState, logits_BxV: jax.Array, sampler: Sampler, stop_S: jax.Array,
          pad_id: jax.Array, row_offset: jax.Array | None, draw: tuple[int, bool], active: jax.Array | bool = True
          ) -> SamplingState:
    """Samples the next token of every unfinished row into slot `state.step`, with its log-prob under
    softmax(logits / T) (see the module docstring; `draw`: `draw_with_logprobs`' vocab_shards and one_pass); where
    not `active` (a step past the end of a loop that tests
    its stop every few steps) the state is left as it is."""
    key = jax.random.fold_in(state.key, state.step)
    token_B, logprob_B = draw_with_logprobs(logits_BxV, key, sampler, row_offset, *draw)
    live_B = ~state.done_B & active
    # A finished row writes pad_id / 0 into its slot `step`, which holds them already; an inactive step writes back
    # what slot `step` holds (the last slot when step is the bucket: the index clamps).
    token_B = jnp.where(live_B, token_B, jnp.where(active, pad_id, state.tokens_BxR[:, jnp.minimum(
        state.step, state.tokens_BxR.shape[1] - 1)]))
    logprob_B = jnp.where(live_B, logprob_B, jnp.where(active, 0.0, state.logprobs_BxR[:, jnp.minimum(
        state.step, state.logprobs_BxR.shape[1] - 1)]))
    hit_stop_B = live_B & jnp.isin(token_B, stop_S)
    return state.replace(
        step=state.step + jnp.int32(active),
        tokens_BxR=jax.lax.dynamic_update_slice(state.tokens_BxR, token_B[:, None], (0, state.step)),
        logprobs_BxR=jax.lax.dynamic_update_slice(state.logprobs_BxR, logprob_B[:, None], (0, state.step)),
        done_B=state.done_B | hit_stop_B,
        stopped_B=state.stopped_B | hit_stop_B,
        lengths_B=state.lengths_B + live_B.astype(jnp.int32),
    )


def _decode_logits(model: nnx.Module, h_BxD: jax.Array, one_pass: bool) -> jax.Array:
    """The LM head's float32 logits [B, V] of final hidden states [B, D]; for a `one_pass` draw in their compute
    dtype (the dot accumulates in float32 and rounds once), which `_fused_draw` reads once: no float32 [B, V] array
    in memory on a bf16 model (identical logits on a float32 one)."""
    dtype = h_BxD.dtype if one_pass else jnp.float32
    return jnp.einsum("BD,DV->BV", h_BxD, model.vocab_slice(0, 1), preferred_element_type=dtype)


def prefill_chunk_size(prompt_slots: int) -> int:
    """Prefill chunk: the whole prompt bucket if it fits in PREFILL_CHUNK, else the largest power of
    two <= PREFILL_CHUNK that divides it (buckets above 4 are multiples of 2^k with k >= 1)."""
    if prompt_slots <= PREFILL_CHUNK:
        return prompt_slots
    chunk = 1
    while chunk < PREFILL_CHUNK and prompt_slots % (2 * chunk) == 0:
        chunk *= 2
    return chunk


def prefill_windows(prompt_slots: int, chunk: int) -> tuple[tuple[int, int, int], ...]:
    """(first chunk, chunks, window) groups: chunk c attends over the first chunk * 2^ceil(log2(c + 1))
    slots (capped at the prompt bucket), at most twice its causal need, so prefill costs ~half of
    attending over the whole cache; one traced model call per group (log2 of the chunk count + 1)."""
    groups: list[tuple[int, int, int]] = []
    for c in range(prompt_slots // chunk):
        window = min(prompt_slots, chunk * _next_power_of_two(c + 1))
        if groups and groups[-1][2] == window:
            first, count, _ = groups[-1]
            groups[-1] = (first, count + 1, window)
        else:
            groups.append((c, 1, window))
    return tuple(groups)


def _next_power_of_two(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def decode_windows(response_slots: int, min_block: int) -> tuple[int, ...]:
    """Response-cache windows of the decode loop's segments, ascending, the last the whole response bucket: a
    step whose response tokens so far fit in a window runs in the first such segment, so decode reads at most
    `min_block` response slots (or 1/8 of the bucket) past the filled ones."""
    block = max(min_block, -(-response_slots // 8))
    return tuple(range(block, response_slots, block)) + (response_slots,)


def _prefill(model: nnx.Module, layers: Sequence[Params], prompt_BxP: jax.Array, prompt_mask_BxP: jax.Array,
             positions_BxP: jax.Array, width: jax.Array | int, cache: KVCache, chunk: int,
             prefix: SharedPrefix | None = None) -> tuple[jax.Array, KVCache]:
    """Writes the prompt into the cache chunk by chunk (`lax.scan`s over [B, C] chunks, each attending
    over its `prefill_windows` window W: scores [B, N, C, W]) through the per-layer weights `layers`; returns
    the hidden state [B, D] of slot width - 1, the prompts' last token. With a `prefix`, row b's tokens also
    attend the shared prefix b // J they continue (the suffixes of `generate(suffix_ids=...)`)."""
    batch, prompt_slots = prompt_BxP.shape
    last_h_BxD = jnp.zeros((batch, model.cfg.hidden_size), jnp.dtype(model.cfg.compute_dtype))
    rope_BxPxH = rope_tables(model.cfg, positions_BxP)  # once, not in every chunk's q/k fusions of every layer
    for first, count, window in prefill_windows(prompt_slots, chunk):
        prompt_slot_BxW = prompt_mask_BxP[:, :window]

        def body(carry: tuple[KVCache, jax.Array], xs: tuple[jax.Array, ...],
                 window: int = window, prompt_slot_BxW: jax.Array = prompt_slot_BxW
                 ) -> tuple[tuple[KVCache, jax.Array], None]:
            cache, last_h_BxD = carry
            start, tokens_BxC, positions_BxC, cos_BxCxH, sin_BxCxH = xs
            query_slot_C = start + jnp.arange(chunk)
            causal_CxW = jnp.arange(window)[None, :] <= query_slot_C[:, None]
            mask_BxCxW = causal_CxW[None, :, :] & prompt_slot_BxW[:, None, :]
            h_BxCxD, cache = model.hidden_states(tokens_BxC, positions_BxC, mask_BxCxW, cache, start, layers,
                                                 prefix, rope=(cos_BxCxH, sin_BxCxH))
            last = width - 1 - start  # the last prompt token's place in this chunk, if it is in it
            h_BxD = jax.lax.dynamic_index_in_dim(h_BxCxD, jnp.clip(last, 0, chunk - 1), axis=1, keepdims=False)
            return (cache, jnp.where((last >= 0) & (last < chunk), h_BxD, last_h_BxD)), None

        def to_chunks(x_BxP: jax.Array) -> jax.Array:  # [B, P, ...] -> [count, B, C, ...]
            part = x_BxP[:, first * chunk:(first + count) * chunk]
            return part.reshape(batch, count, chunk, *x_BxP.shape[2:]).swapaxes(0, 1)

        starts = jnp.arange(first, first + count, dtype=jnp.int32) * chunk
        (cache, last_h_BxD), _ = jax.lax.scan(
            body, (cache, last_h_BxD),
            (starts, *map(to_chunks, (prompt_BxP, positions_BxP, *rope_BxPxH))))
    return last_h_BxD, cache


def steps_per_check(platform: str, windows: Sequence[int]) -> int:
    """Decode steps per stop test on `platform`: the largest divisor of its STEPS_PER_CHECK that divides every decode
    segment's steps (`decode_windows`; steps 1..windows[0] run in the first), so that a segment's steps come in whole
    groups and none writes past its window. At most that many - 1 steps run idle after the last token."""
    return math.gcd(STEPS_PER_CHECK.get(platform, 1), *windows)


def decode_attention(layout: sharding.Layout) -> str:
    """`DECODE_ATTENTION` of the layout's platform; a fused kernel on one device only: it has no partitioning rule,
    so XLA would gather a sharded cache for it."""
    kernel = DECODE_ATTENTION.get(layout.mesh.devices.flat[0].platform, "xla")
    return "xla" if kernel in attention_lib.FUSED_KERNELS and layout.mesh.devices.size > 1 else kernel


def layout_steps_per_check(layout: sharding.Layout, max_new_tokens: int) -> int:
    """`steps_per_check` of a generate call in `layout` (its devices' platform) for `max_new_tokens`: the tokens one
    iteration of its decode loop generates (a dry run divides that loop's per-iteration collectives by it)."""
    return steps_per_check(layout.mesh.devices.flat[0].platform,
                           decode_windows(padding.bucket_size(max_new_tokens), DECODE_BLOCK))


def _grow(cache: KVCache, window: int) -> KVCache:
    """A per-layer response cache with empty slots added up to `window` (past the filled ones: never read
    unmasked); slots are the last axis of k [B, K, H, W] and the third of v [B, K, W, H]."""

    def grow(x: jax.Array, axis: int) -> jax.Array:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, window - x.shape[axis])
        return jnp.pad(x, pad)

    return KVCache(k=tuple(grow(k, 3) for k in cache.k), v=tuple(grow(v, 2) for v in cache.v))


def _cache_sharding(layout: sharding.Layout, cache: KVCache) -> Any:
    """A per-layer cache's k [B, K, H, S] and v [B, K, S, H] (or the prompts' [U, K, H, P], [U, K, P, H]): rows
    like the batch, KV heads over tensor (in the layout's rules)."""
    k_spec = layout.sharding(("batch", "kv_heads", "head_dim", "length"), cache.k[0].shape)
    v_spec = layout.sharding(("batch", "kv_heads", "length", "head_dim"), cache.v[0].shape)
    return KVCache(k=(k_spec,) * len(cache.k), v=(v_spec,) * len(cache.v))


@functools.lru_cache(maxsize=64)
def _generate_fn(graphdef: nnx.GraphDef, sampler: Sampler, response_slots: int, cache_slots: int,
                 prefill_chunk: int, decode_block: int, n: int, layout: sharding.Layout, suffix_slots: int = 0,
                 checks: int = 1, one_pass: bool = False, attention: str = "xla"):
    """The jitted prefill + decode program for one (model graph, sampler kind and top_k (`_program_sampler`), R
    bucket of the outputs, response cache bucket, chunk, decode block, n, layout, suffix bucket, decode steps per
    stop test (`steps_per_check`), one-pass draw (`ONE_PASS_DRAW`), decode attention (`DECODE_ATTENTION`)); the
    temperature and top_p are its arguments.

    Each distinct prompt is prefilled once into the prompt cache, which its n rows (u * n + j) then continue
    as a `SharedPrefix`, each row writing its own cache: with `suffix_slots` (Ts > 0) row b first prefills its
    own suffix into slots [0, Ts) of that cache (left-padded, positions continuing its prompt's), then decodes
    response token t into slot Ts + t; without, its samples decode straight from the prompt's last token. Both
    run over per-layer weights and per-layer caches (see the module docstring); stacked weights are sliced per
    layer first (a copy).
    """

    def constrain(cache: KVCache) -> KVCache:
        return jax.lax.with_sharding_constraint(cache, _cache_sharding(layout, cache))

    def run(params: loader.Params, prompt_UxP: jax.Array, prompt_mask_UxP: jax.Array, live_B: jax.Array,
            suffix_BxT: jax.Array | None, suffix_mask_BxT: jax.Array | None, stop_S: jax.Array, pad_id: jax.Array,
            max_new_tokens: jax.Array, width: jax.Array, temperature: jax.Array, top_p: jax.Array, key: jax.Array,
            row_offset: jax.Array | None) -> SamplingState:
        TRACES["generate"] += 1
        tempered = dataclasses.replace(sampler, temperature=temperature, top_p=top_p)
        if has_layer_stack(params):
            model = nnx.merge(graphdef, params)
            layers = unstack_layers(params, model.cfg.num_layers)["layers"]
        else:  # the stack the model holds is never read (every forward below passes `layers`): XLA drops it
            model, layers = nnx.merge(graphdef, stack_layers(params)), params["layers"]
        prompts, prompt_slots = prompt_UxP.shape
        h_UxD, prompt_cache = _prefill(model, layers, prompt_UxP, prompt_mask_UxP,
                                       padding_to_positions(prompt_mask_UxP), width,
                                       constrain(init_cache(model.cfg, prompts, prompt_slots, per_layer=True)),
                                       prefill_chunk)
        prefix = SharedPrefix(cache=constrain(prompt_cache), mask_UxP=prompt_mask_UxP, kernel=attention)
        if attention in attention_lib.FUSED_KERNELS:  # the kernel's projection, merged once (`transformer.merged_qkv`)
            layers = with_merged_qkv(layers)
        batch = prompts * n
        windows = decode_windows(cache_slots, decode_block)
        cache = init_cache(model.cfg, batch, suffix_slots + windows[0], per_layer=True)
        position_B = jnp.repeat(jnp.sum(prompt_mask_UxP, axis=1, dtype=jnp.int32), n)  # of the row's next token
        if suffix_slots:  # each row's suffix continues its prompt's cache, in the row's own cache
            h_BxD, cache = _prefill(model, layers, suffix_BxT, suffix_mask_BxT,
                                    position_B[:, None] + padding_to_positions(suffix_mask_BxT), suffix_slots,
                                    constrain(cache), prefill_chunk_size(suffix_slots), prefix)
            position_B = position_B + jnp.sum(suffix_mask_BxT, axis=1, dtype=jnp.int32)
        else:
            h_BxD = jnp.repeat(h_UxD, n, axis=0)
        logits_BxV = _decode_logits(model, h_BxD, one_pass)
        state = SamplingState(
            step=jnp.int32(0),
            tokens_BxR=jnp.full((batch, response_slots), pad_id, jnp.int32),
            logprobs_BxR=jnp.zeros((batch, response_slots), jnp.float32),
            done_B=~live_B,
            stopped_B=jnp.zeros((batch,), bool),
            lengths_B=jnp.zeros((batch,), jnp.int32),
            cache=cache,
            key=key,
        )
        draw = (vocab_blocks(layout, model.cfg.vocab_size), one_pass)
        state = _emit(state, logits_BxV, tempered, stop_S, pad_id, row_offset, draw)

        # Response slot t holds response token t (own cache slot Ts + t); a segment runs while the tokens so far
        # fit its window, `checks` steps per test (`steps_per_check`).
        def cond(s: SamplingState, window: int) -> jax.Array:
            return (s.step < max_new_tokens) & ~jnp.all(s.done_B) & (s.step <= window)

        def body(s: SamplingState, window: int) -> SamplingState:
            if checks == 1:
                return step(s, window, True)
            return jax.lax.fori_loop(0, checks, lambda _, s: step(s, window, cond(s, window)), s)

        def step(s: SamplingState, window: int, active: jax.Array | bool) -> SamplingState:
            """One decode step; an inactive one (past max_new_tokens or every row's stop, inside a loop of `checks`
            steps) feeds the last token again, rewriting its own cache slot with the same keys and values, and
            leaves the state as it is (`_emit`)."""
            index = s.step - 1  # the response slot of the token fed in
            last_B = jax.lax.dynamic_slice_in_dim(s.tokens_BxR, index, 1, axis=1)
            mask_BxW = jnp.broadcast_to(jnp.arange(suffix_slots + window) <= suffix_slots + index,
                                        (batch, suffix_slots + window))
            if suffix_slots:
                mask_BxW = mask_BxW.at[:, :suffix_slots].set(suffix_mask_BxT)
            h_Bx1xD, cache = model.hidden_states(last_B, (position_B + index)[:, None], mask_BxW[:, None], s.cache,
                                                 suffix_slots + index, layers, prefix)
            logits_BxV = _decode_logits(model, h_Bx1xD[:, 0], one_pass)
            return _emit(s.replace(cache=cache), logits_BxV, tempered, stop_S, pad_id, row_offset, draw, active)

        # A segment carries exactly its window of the response cache (a per-token slice of a larger cache would
        # make XLA copy the whole cache, twice, to update it in place).
        for window in windows:
            state = jax.lax.while_loop(functools.partial(cond, window=window), functools.partial(body, window=window),
                                       state.replace(cache=constrain(_grow(state.cache, suffix_slots + window))))
        return state.replace(cache=None)  # not an output: its buffers are freed with the loop's

    return jax.jit(run)


def _prepare(weights: loader.Weights, prompt_ids: Sequence[Sequence[int]] | np.ndarray,
             prompt_mask: np.ndarray | None, *, key: jax.Array, n: int, max_new_tokens: int, sampler: str,
             stop_tokens: Sequence[int], pad_id: int, layout: sharding.Layout | None,
             response_buckets: Sequence[int] | None = None, suffix_ids: Sequence[Sequence[int]] | None = None,
             row_offset: int | None = None) -> tuple[Any, tuple, tuple, int]:
    """Checks arguments and placement; returns the jitted program, its host inputs (after the params),
    their shardings, and the row count."""
    if row_offset is not None and (row_offset < 0 or jax.process_count() > 1):
        raise ValueError(f"row_offset={row_offset}: must be >= 0, on one process (another process's rows would "
                         "not be those rows of the larger call)")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    parsed = parse_sampler(sampler)
    layout = layout or sharding.single_device_layout()
    loader.check_placement(weights, layout, what="generate")
    tokens, mask = padding.left_padded(prompt_ids, pad_id, prompt_mask)
    prompts, width = tokens.shape
    lengths_B = np.repeat(mask.sum(axis=1), n)
    if suffix_ids is not None:
        if len(suffix_ids) != prompts * n:
            raise ValueError(f"suffix_ids: {len(suffix_ids)} suffixes for {prompts} prompts x n={n}: need one per row "
                             "(row u * n + j continues prompt u)")
        suffix_tokens, suffix_mask = padding.left_padded(suffix_ids, pad_id)
        lengths_B = lengths_B + suffix_mask.sum(axis=1)
    longest = int(lengths_B.max()) + max_new_tokens
    if longest > weights.cfg.max_position_embeddings:
        raise ValueError(
            f"longest prompt ({longest - max_new_tokens} tokens) + max_new_tokens ({max_new_tokens}) = {longest} "
            f"exceeds the model's max_position_embeddings ({weights.cfg.max_position_embeddings})"
        )
    # Across processes every host passes its own prompts (equally many); shapes are agreed on first.
    most_prompts, width, suffix_width = distributed.max_over_processes(
        prompts, width, 0 if suffix_ids is None else suffix_tokens.shape[1])
    if most_prompts != prompts:
        raise ValueError(f"generate: this process has {prompts} prompts, another {most_prompts}; every process "
                         "must pass equally many")
    tokens_UxP, mask_UxP = placed_prompts(tokens, mask, width, pad_id, layout)
    padded_prompts, prompt_slots = tokens_UxP.shape
    live_B = np.arange(padded_prompts * n) < prompts * n
    suffix_BxT = suffix_mask_BxT = None
    suffix_slots = padding.bucket_size(suffix_width) if suffix_ids is not None else 0
    if suffix_ids is not None:  # left-padded to the suffix bucket: every suffix ends at its last slot
        suffix_BxT, suffix_mask_BxT = (np.full((padded_prompts * n, suffix_slots), fill, dtype)
                                       for fill, dtype in ((pad_id, np.int32), (False, bool)))
        suffix_BxT[:prompts * n, suffix_slots - suffix_tokens.shape[1]:] = suffix_tokens
        suffix_mask_BxT[:prompts * n, suffix_slots - suffix_tokens.shape[1]:] = suffix_mask
        suffix_BxT[prompts * n:], suffix_mask_BxT[prompts * n:] = suffix_BxT[0], suffix_mask_BxT[0]

    # Stop ids are data, not part of the compiled program: padded with -1 (never a token) to a bucket of
    # at least 4, so the usual few stop ids never change the program's shapes.
    stop_S = np.full(padding.bucket_size(max(len(stop_tokens), 4)), -1, np.int32)
    stop_S[:len(stop_tokens)] = stop_tokens
    # The response cache is the sampler's own bucket of max_new_tokens; the output rows are as wide as the
    # caller's response bucket (a rollout's: its training batch is then a column prefix of them).
    cache_slots = padding.bucket_size(max_new_tokens)
    response_slots = cache_slots if response_buckets is None else padding.bucket_length(max_new_tokens,
                                                                                         response_buckets)
    platform = layout.mesh.devices.flat[0].platform
    run = _generate_fn(weights.graphdef, _program_sampler(parsed), response_slots, cache_slots,
                       prefill_chunk_size(prompt_slots), DECODE_BLOCK, n, layout, suffix_slots,
                       layout_steps_per_check(layout, max_new_tokens), platform in ONE_PASS_DRAW,
                       decode_attention(layout))
    # Host inputs go rows like the batch (this process's rows are its block of the global batch), the rest
    # replicated; `generate` places them, parameters are never moved.
    global_shape = (padded_prompts * jax.process_count(), prompt_slots)
    rows, rest = layout.sharding(("batch",), global_shape), sharding.replicated(layout.mesh)
    inputs = (tokens_UxP, mask_UxP, live_B, suffix_BxT, suffix_mask_BxT, stop_S, np.int32(pad_id),
              np.int32(max_new_tokens), np.int32(width), np.float32(parsed.temperature), np.float32(parsed.top_p), key,
              None if row_offset is None else np.int32(row_offset))
    return run, inputs, (rows,) * ROW_INPUTS + (rest,) * 8, prompts * n


def placed_prompts(tokens: np.ndarray, mask: np.ndarray, width: int, pad_id: int, layout: sharding.Layout
                   ) -> tuple[np.ndarray, np.ndarray]:
    """This process's left-padded prompts [prompts, <= width] as the sampler's program takes them: rows padded to a
    bucket (a multiple of the layout's batch share), columns to the bucket of `width` (the longest across processes).
    Prompts end at slot width - 1 and responses start at slot width, so the filled slots are a prefix of the cache;
    bucket padding goes after them, and extra prompts copy prompt 0 (their samples start finished)."""
    prompts = tokens.shape[0]
    local_multiple = max(1, layout.batch_multiple // jax.process_count())
    padded_prompts = -(-padding.bucket_size(prompts) // local_multiple) * local_multiple
    prompt_slots = padding.bucket_size(width)
    if (padded_prompts, prompt_slots) == tokens.shape:  # already padded to a bucket (a rollout's prompt batch)
        return tokens, mask
    tokens_UxP = np.full((padded_prompts, prompt_slots), pad_id, np.int32)
    mask_UxP = np.zeros((padded_prompts, prompt_slots), bool)
    start = width - tokens.shape[1]
    tokens_UxP[:prompts, start:width], mask_UxP[:prompts, start:width] = tokens, mask
    tokens_UxP[prompts:], mask_UxP[prompts:] = tokens_UxP[0], mask_UxP[0]
    return tokens_UxP, mask_UxP


def _program_sampler(parsed: Sampler) -> Sampler:
    """What of a sampler its compiled program is specialised on (kind, top_k): the temperature and top_p, which the
    program is given at run time, set to 1, so every temperature and top_p of a kind share one program."""
    return dataclasses.replace(parsed, temperature=1.0, top_p=1.0)


# `_prepare`'s inputs sharded like the batch (prompts, their mask, live rows, suffixes and their mask); the rest
# are replicated.
ROW_INPUTS = 5


@struct.dataclass
class Samples:
    """`sample`'s outputs, left on the device: global arrays with rows like the layout's batch, process p's
    rows its block (its `rows` real rows first, then bucket padding); row u * n + j is sample j of prompt u.
    The prompts are the sampler's own placed inputs, so a rollout's training batch reuses them."""

    prompt_UxP: jax.Array  # int32 [U, P], left-padded (U: every process's block of prompts, padded)
    prompt_mask_UxP: jax.Array  # bool [U, P]
    tokens_BxR: jax.Array  # int32 [U * n, R] (R response slots >= max_new_tokens), pad_id after the end
    logprobs_BxR: jax.Array  # float32 [U * n, R], log softmax(logits / T) of each token, 0 after the end
    lengths_B: jax.Array  # int32 [U * n], generated tokens including the stop token
    stopped_B: jax.Array  # bool [U * n], a stop token was emitted
    num_steps: jax.Array  # int32 []: tokens generated per row by the loop
    rows: int = struct.field(pytree_node=False)  # this process's real rows (its prompts x n)
    max_new_tokens: int = struct.field(pytree_node=False)


def sample(weights: loader.Weights, prompt_ids: Sequence[Sequence[int]] | np.ndarray, *,
           prompt_mask: np.ndarray | None = None, key: jax.Array, n: int = 1, max_new_tokens: int,
           sampler: str = "greedy", stop_tokens: Sequence[int], pad_id: int, layout: sharding.Layout | None = None,
           response_buckets: Sequence[int] | None = None, suffix_ids: Sequence[Sequence[int]] | None = None,
           row_offset: int | None = None) -> Samples:
    """`generate` without the fetch: the samples stay on the device (`host_result` fetches them). The response
    slots are the smallest of `response_buckets` (default: `padding.bucket_size`) holding max_new_tokens, so a
    training batch padded to one of those buckets is a column prefix of them. With `row_offset` (one process) row b
    draws the sampling noise of row row_offset + b of a call with the same key (`row_noise`): prompts sampled in
    chunks, chunk c at row offset (its first prompt) · n, draw what one call over all of them draws."""
    run, inputs, placements, rows = _prepare(weights, prompt_ids, prompt_mask, key=key, n=n,
                                             max_new_tokens=max_new_tokens, sampler=sampler, stop_tokens=stop_tokens,
                                             pad_id=pad_id, layout=layout, response_buckets=response_buckets,
                                             suffix_ids=suffix_ids, row_offset=row_offset)
    prompt_UxP, mask_UxP, *row_inputs = distributed.global_batch(inputs[:ROW_INPUTS], placements[0])
    out = run(weights.params, prompt_UxP, mask_UxP, *row_inputs,
              *distributed.replicate(inputs[ROW_INPUTS:], placements[-1]))
    return Samples(prompt_UxP, mask_UxP, out.tokens_BxR, out.logprobs_BxR, out.lengths_B, out.stopped_B, out.step,
                   rows, max_new_tokens)


def host_result(samples: Samples, *, logprobs: bool = True) -> GenerationResult:
    """This process's rows of `samples` on the host (tokens cut at max_new_tokens); without `logprobs` (a
    rollout, whose log-probs stay on the device for the training batch) they are not fetched (None)."""
    rows, cols = samples.rows, samples.max_new_tokens
    fetched = [samples.tokens_BxR, samples.lengths_B, samples.stopped_B] + ([samples.logprobs_BxR] if logprobs else [])
    tokens, lengths, stopped, *logp = (distributed.local_rows(x) for x in fetched)
    return GenerationResult(
        tokens=tokens[:rows, :cols],
        logprobs=logp[0][:rows, :cols] if logprobs else None,
        lengths=lengths[:rows],
        finish_reason=np.where(stopped[:rows], FINISH_STOP, FINISH_LENGTH),
        num_steps=int(distributed.host_array(samples.num_steps)),
    )


def generate(weights: loader.Weights, prompt_ids: Sequence[Sequence[int]] | np.ndarray, *,
             prompt_mask: np.ndarray | None = None, key: jax.Array, n: int = 1, max_new_tokens: int,
             sampler: str = "greedy", stop_tokens: Sequence[int], pad_id: int,
             layout: sharding.Layout | None = None,
             suffix_ids: Sequence[Sequence[int]] | None = None) -> GenerationResult:
    """Samples n responses per prompt from `weights`, which must already live in `layout` (default: one
    device) in their config's dtype; see the module docstring for conventions. With `suffix_ids` (one
    non-empty suffix per row, row u * n + j continuing prompt u), row b generates after prompt b // n +
    suffix b: each prompt is prefilled once and its n suffixes continue from its cache (a judge's shared
    response prefix and its criteria). In a multi-process job every process calls it with its own prompts
    (equally many) and gets its own rows back."""
    return host_result(sample(weights, prompt_ids, prompt_mask=prompt_mask, key=key, n=n,
                              max_new_tokens=max_new_tokens, sampler=sampler, stop_tokens=stop_tokens, pad_id=pad_id,
                              layout=layout, suffix_ids=suffix_ids))


def lower_generate(weights: loader.Weights, prompt_ids: Sequence[Sequence[int]] | np.ndarray, *,
                   prompt_mask: np.ndarray | None = None, n: int = 1, max_new_tokens: int, sampler: str = "greedy",
                   stop_tokens: Sequence[int], pad_id: int, layout: sharding.Layout | None = None,
                   response_buckets: Sequence[int] | None = None,
                   suffix_ids: Sequence[Sequence[int]] | None = None) -> jax.stages.Lowered:
    """The program `sample` (and `generate`) would run for these arguments, lowered and not run (`.compile()`
    it to read its HLO or memory); `weights` may be abstract (`loader.abstract_weights`) and the layout's
    devices those of a compile-only topology (nothing is placed on them)."""
    run, inputs, placements, _ = _prepare(weights, prompt_ids, prompt_mask, key=jax.random.key(0), n=n,
                                          max_new_tokens=max_new_tokens, sampler=sampler, stop_tokens=stop_tokens,
                                          pad_id=pad_id, layout=layout, response_buckets=response_buckets,
                                          suffix_ids=suffix_ids)
    return run.lower(weights.params, *(None if x is None else jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s)
                                       for x, s in zip(inputs, placements)))
