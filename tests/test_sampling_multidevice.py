"""Sharded generate == unsharded generate on 8 simulated CPU devices."""

import jax
import numpy as np
import pytest

from rubric_jax import sampling, sharding
from rubric_jax.models.config import ModelConfig
from tests.random_model import random_model

CFG = ModelConfig(
    architecture="qwen2", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
    num_kv_heads=4, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
    attention_bias=True, rope_scaling=None, max_position_embeddings=64,
)
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [3], [40, 41]]


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, std=0.15)


@pytest.mark.parametrize(
    "mesh_config, sampler",
    [
        (sharding.MeshConfig(data=2, fsdp=2, tensor=2), "greedy"),
        (sharding.MeshConfig(data=1, fsdp=4, tensor=2), "topk(8, 1.5)"),
    ],
)
def test_sharded_generate_matches_unsharded(model, mesh_config, sampler):
    graphdef, state = model
    kwargs = dict(key=jax.random.key(4), n=2, max_new_tokens=10, sampler=sampler, stop_tokens=[1, 2], pad_id=0)
    expected = sampling.generate(graphdef, state, PROMPTS, **kwargs)
    mesh = sharding.make_mesh(mesh_config)
    got = sampling.generate(graphdef, state, PROMPTS, mesh=mesh, **kwargs)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5)
    np.testing.assert_array_equal(got.lengths, expected.lengths)
    np.testing.assert_array_equal(got.finish_reason, expected.finish_reason)


def test_odd_batch_is_padded_to_the_mesh(model):
    graphdef, state = model
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=4, tensor=1))
    kwargs = dict(key=jax.random.key(0), max_new_tokens=5, stop_tokens=[], pad_id=0)
    got = sampling.generate(graphdef, state, PROMPTS[:3], mesh=mesh, **kwargs)
    expected = sampling.generate(graphdef, state, PROMPTS[:3], **kwargs)
    assert got.tokens.shape == (3, 5)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
