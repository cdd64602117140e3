"""Sharded forward == single-device forward on 8 simulated CPU devices (fsdp-only, tensor-only, mixed)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rubric_jax import hlo_stats, sharding
from rubric_jax.models.checkpoint import abstract_model
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.transformer import causal_padding_mask, padding_to_positions
from tests.random_model import random_model

CFG = ModelConfig(
    architecture="qwen2", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
    num_kv_heads=4, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
    attention_bias=True, rope_scaling=None, max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, std=0.1)


def _forward(graphdef, state, tokens_BxT, mask_BxT):
    logits, _ = nnx.merge(graphdef, state)(tokens_BxT, padding_to_positions(mask_BxT), causal_padding_mask(mask_BxT))
    return logits


def _batch():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, CFG.vocab_size, (8, 12)).astype(np.int32)
    mask = np.arange(12)[None, :] >= rng.integers(0, 6, (8, 1))  # left padding of 0..5 slots
    return tokens, mask


@pytest.mark.parametrize(
    "mesh_config, q_spec, embed_spec",
    [
        (sharding.MeshConfig(data=1, fsdp=8, tensor=1), P(None, "fsdp", None, None), P(None, "fsdp")),
        # tensor=8 does not divide the 4 KV heads: k/v stay replicated over heads, q is split 8 ways.
        (sharding.MeshConfig(data=1, fsdp=1, tensor=8), P(None, None, "tensor", None), P("tensor", None)),
        (sharding.MeshConfig(data=2, fsdp=2, tensor=2), P(None, "fsdp", "tensor", None), P("tensor", "fsdp")),
    ],
)
def test_sharded_forward_matches_single_device(model, mesh_config, q_spec, embed_spec):
    graphdef, state = model
    tokens, mask = _batch()
    expected = jax.jit(_forward, static_argnums=0)(graphdef, state, tokens, mask)

    mesh = sharding.make_mesh(mesh_config)
    param_sh = sharding.param_shardings(state, mesh)
    sharded_state = sharding.shard_pytree(state, param_sh)
    q_kernel = sharded_state["layers"]["self_attn"]["q_proj"]["kernel"].get_value()
    assert q_kernel.sharding.spec == q_spec
    assert sharded_state["embed_tokens"]["embedding"].get_value().sharding.spec == embed_spec
    assert len(q_kernel.addressable_shards) == 8
    batch_sh = sharding.batch_sharding(mesh, tokens.shape)
    fn = jax.jit(_forward, static_argnums=0, in_shardings=(param_sh, batch_sh, batch_sh), out_shardings=batch_sh)
    got = fn(graphdef, sharded_state, *sharding.shard_pytree((tokens, mask), batch_sh))
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=1e-5)


def test_shared_prompt_gradient_gathers_each_fsdp_weight_once_per_layer(model):
    """`prefix_continuation_states` runs each layer's weights twice (the prompts, then the responses on the
    prompts' K/V). Under FSDP (fsdp 8, the training layout's residual constraint) its gradient must all-gather
    exactly the weight elements of the plain forward's gradient over the same rows at full length, which uses
    each weight once per layer; gathering per use (what the 7B GPU compile showed before the weights were
    constrained once per layer, `Transformer._compute_weights`) moves about twice as much."""
    graphdef, state = model
    layout = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tensor=1)))
    graphdef = abstract_model(CFG, layout.shard_activation)[0]
    params = sharding.shard_pytree(state, sharding.param_shardings(state, layout.mesh))
    u, j, p, t = 2, 4, 8, 6
    ones = jnp.ones

    def shared_prompt(params):
        h_prompt, h_response = nnx.merge(graphdef, params).prefix_continuation_states(
            ones((u, p), jnp.int32), jnp.tile(jnp.arange(p), (u, 1)), jnp.tril(ones((u, p, p), bool)),
            ones((u * j, t), jnp.int32), jnp.tile(jnp.arange(p, p + t), (u * j, 1)), jnp.tril(ones((u * j, t, t), bool)),
            ones((u, p), bool))
        return jnp.sum(h_prompt.astype(jnp.float32)) + jnp.sum(h_response.astype(jnp.float32))

    def plain(params):
        b, n = u * j, p + t
        h, _ = nnx.merge(graphdef, params).hidden_states(ones((b, n), jnp.int32), jnp.tile(jnp.arange(n), (b, 1)),
                                                         jnp.tril(ones((b, n, n), bool)))
        return jnp.sum(h.astype(jnp.float32))

    # one layer's weight matrices, dims in any order (the norm scales' [D] is also the final norm's, which the
    # shared-prompt forward applies twice)
    weights = {tuple(sorted(x.shape[1:])) for x in jax.tree.leaves(state["layers"]) if x.ndim > 2}
    gathered = {}
    for fn in (shared_prompt, plain):
        found = hlo_stats.collectives(jax.jit(jax.grad(fn)).lower(params).compile().as_text(), ("all-gather",))
        gathered[fn.__name__] = sum(c.executions * math.prod(dims) for c in found for dims in hlo_stats.array_dims(c.shape)
                                    if tuple(sorted(dims)) in weights)
    assert 0 < gathered["shared_prompt"] == gathered["plain"], gathered
