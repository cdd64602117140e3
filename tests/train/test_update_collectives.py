"""What the FSDP GRPO update and rollout log-probs move, on 8 simulated CPU devices (compile-only): the
vocabulary projection is gathered once per pass over a micro-batch, not once per log-prob chunk, and every
weight all-gather moves the bf16 compute dtype, not the float32 master weights (also in the rematerialised
backward). The 7B figures these guard are in benchmarks/AOT_RESULTS.md (XLA's GPU compiler)."""

import math

import jax
import jax.numpy as jnp
import pytest

from rubric_jax import grpo, hlo_stats, loader, sharding
from rubric_jax.models.config import ModelConfig
from rubric_jax.train import state as train_state, step as train_step

D, V, MICRO = 32, 64, 2
# The 7B training setup in small: bf16 compute over float32 master weights, remat, a layer scan, FSDP over 8.
MODEL = ModelConfig(architecture="qwen2", vocab_size=V, hidden_size=D, intermediate_size=96, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e4, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, attention_bias=True, rope_scaling=None, max_position_embeddings=128,
                    compute_dtype="bfloat16", remat=True, scan_layers=True)
# 64 response tokens with chunk 16: 4 vocabulary slices of 16 ids (the old code: 4 chunks of 16 tokens).
CFG = grpo.GRPOConfig(group_size=2, kl_coef=0.04, logprob_chunk_size=16)
ROWS, PROMPT, RESPONSE, SLICES = 16, 8, 64, 4


@pytest.fixture(scope="module")
def programs():
    """(optimised HLO, SPMD-partitioned HLO) of the GRPO update, and the optimised HLO of the rollout log-probs."""
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tensor=1)))
    policy = loader.abstract_weights(MODEL, layout)
    tx = train_state.make_optimizer(train_state.OptimizerConfig(learning_rate=1e-3))
    state, shardings = train_state.abstract_train_state(policy, tx, layout.mesh)
    rows = sharding.batch_sharding(layout.mesh)
    prompts = sharding.batch_sharding(layout.mesh, (ROWS // CFG.group_size, PROMPT))
    batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=prompts if k in train_step.PROMPT_KEYS else rows)
             for k, shape, dtype in (
        ("prompt_tokens", (ROWS // CFG.group_size, PROMPT), jnp.int32),
        ("prompt_mask", (ROWS // CFG.group_size, PROMPT), bool),
        ("response_tokens", (ROWS, RESPONSE), jnp.int32), ("response_mask", (ROWS, RESPONSE), bool),
        ("loss_mask", (ROWS, RESPONSE), bool), ("old_logp", (ROWS, RESPONSE), jnp.float32),
        (train_step.REF_LOGP, (ROWS, RESPONSE), jnp.float32), ("advantages", (ROWS,), jnp.float32))}
    assert grpo.vocab_slices(V, RESPONSE, CFG.logprob_chunk_size) == SLICES
    update = train_step.jit_grpo_step(CFG, micro_batches=MICRO, shardings=shardings, mesh=layout.mesh)
    compiled, partitioned = hlo_stats.compile_partitioned(update.lower(state, batch))
    logprobs = train_step.jit_rollout_logprobs(
        policy.graphdef, group_size=CFG.group_size, temperature=1.0, chunk_size=CFG.logprob_chunk_size,
        micro_batches=MICRO, param_shardings=shardings.params, mesh=layout.mesh)
    forward = logprobs.lower(state.params, *train_step.logprob_inputs(batch)).compile()
    return compiled.as_text(), partitioned, forward.as_text()


def _head_elements(hlo_text, kinds, in_loop=False):
    """Elements per run of the `kinds` collectives of [D, V]- or [D, V / 4]-shaped arrays, in either order: the
    vocabulary projection or one of its 4 slices (elements, not bytes: the CPU backend widens bf16 collectives
    to f32); with `in_loop`, only those inside the micro-batch loop."""
    shapes = {tuple(sorted((D, V // n))) for n in (1, SLICES)}
    return sum(c.executions * math.prod(dims) for c in hlo_stats.collectives(hlo_text, kinds)
               for dims in hlo_stats.array_dims(c.shape) if tuple(sorted(dims)) in shapes and c.in_loop >= in_loop)


def test_vocabulary_projection_is_gathered_once_per_pass_not_per_chunk(programs):
    """Each micro-batch gathers the [D, V] projection once in the forward and once in the rematerialised
    backward, and reduces its gradient once; the rollout log-probs gather it once per micro-batch. A log-prob
    loop over token chunks that closes over the projection gathers it in every chunk, forward and backward
    (4 chunks here: 6x these counts; the 7B update gathered it 192 times, 195 GiB)."""
    update, _, forward = programs
    assert _head_elements(update, ("all-gather",)) == 2 * MICRO * D * V
    # its gradient, in the micro-batch loop: all-reduced by the CPU backend (reduce-scattered on the GPU)
    assert _head_elements(update, ("all-reduce", "reduce-scatter"), in_loop=True) == MICRO * D * V
    assert _head_elements(forward, ("all-gather",)) == MICRO * D * V


def test_weight_gathers_move_the_compute_dtype_also_in_the_backward(programs):
    """With bf16 compute, every floating-point all-gather the partitioner places in the update is bf16: the
    layer weights are cast before they are gathered in the forward and in the rematerialised backward alike
    (left to XLA, the backward gathered the float32 master weights: 184 of the 7B update's 511 GiB)."""
    _, partitioned, _ = programs
    gathered = [(dtype, dims) for c in hlo_stats.collectives(partitioned, ("all-gather",))
                for dtype, dims in hlo_stats.arrays(c.shape) if dtype.startswith(("f", "bf"))]
    weights = [dims for dtype, dims in gathered if D in dims and len(dims) < 4]
    assert len(weights) >= 2 * 7  # the forward's and the backward's q, k, v, o, gate, up, down at least
    assert {dtype for dtype, _ in gathered} == {"bf16"}, sorted(set(gathered))
