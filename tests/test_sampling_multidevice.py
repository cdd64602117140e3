"""The sampler on 8 simulated CPU devices: sharded == unsharded in the decode layout, misplaced
parameters are an error (never a silent copy), and the compiled decode loop all-gathers nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_jax import hlo_stats, loader, sampling, sharding
from rubric_jax.models.config import ModelConfig
from tests.random_model import random_weights

CFG = ModelConfig(
    architecture="qwen2", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
    num_kv_heads=4, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
    attention_bias=True, rope_scaling=None, max_position_embeddings=64,
)
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [3], [40, 41]]


@pytest.fixture(scope="module")
def model():
    return random_weights(CFG, std=0.15)


def _decode(mesh_config, tensor):
    return sharding.decode_layout(sharding.make_mesh(mesh_config), tensor)


@pytest.mark.parametrize(
    "mesh_config, tensor, sampler, per_layer",
    [
        (sharding.MeshConfig(data=2, fsdp=2, tensor=2), 2, "greedy", False),
        (sharding.MeshConfig(data=1, fsdp=8, tensor=1), 4, "topk(8, 1.5)", True),
    ],
)
def test_sharded_generate_matches_unsharded(model, mesh_config, tensor, sampler, per_layer):
    """Stacked weights, or per-layer ones (the decode form a run uses), placed in the decode layout."""
    kwargs = dict(key=jax.random.key(4), n=2, max_new_tokens=10, sampler=sampler, stop_tokens=[1, 2], pad_id=0)
    expected = sampling.generate(model, PROMPTS, **kwargs)
    layout = _decode(mesh_config, tensor)
    placed = loader.to_layout(model, layout, per_layer=per_layer)
    if per_layer:
        q = placed.params["layers"][1]["self_attn"]["q_proj"]["kernel"]
        assert q.sharding.spec == jax.sharding.PartitionSpec(None, "tensor", None)  # heads split, no FSDP
        restacked = loader.to_layout(placed, layout)  # and back: the same arrays as placing the stack directly
        for a, b in zip(jax.tree.leaves(restacked.params), jax.tree.leaves(loader.to_layout(model, layout).params)):
            assert a.sharding == b.sharding
            np.testing.assert_array_equal(a, b)
    else:
        q = placed.params["layers"]["self_attn"]["q_proj"]["kernel"]
        assert q.sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor", None)
    got = sampling.generate(placed, PROMPTS, layout=layout, **kwargs)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5)
    np.testing.assert_array_equal(got.lengths, expected.lengths)
    np.testing.assert_array_equal(got.finish_reason, expected.finish_reason)


def test_sharded_generate_across_attention_windows_matches_unsharded(model, monkeypatch):
    """Decode segments (response-cache windows 8 and 12; 12 tokens cross the first) with the batch over
    data 2 and KV heads over tensor 4: the same tokens and log-probs as on one device."""
    monkeypatch.setattr(sampling, "DECODE_BLOCK", 8)
    prompts = [list(range(2, 15)), [7, 8, 9], list(range(20, 31)), [40, 41]]
    assert sampling.decode_windows(12, 8) == (8, 12)
    kwargs = dict(key=jax.random.key(5), max_new_tokens=12, sampler="temperature(1.3)", stop_tokens=[], pad_id=0)
    expected = sampling.generate(model, prompts, **kwargs)
    layout = _decode(sharding.MeshConfig(data=2, fsdp=1, tensor=4), 4)
    got = sampling.generate(loader.to_layout(model, layout), prompts, layout=layout, **kwargs)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5)


def test_sharded_suffix_continuations_match_unsharded(model):
    """Shared prompts continued by suffixes of different lengths (a judge's shared_prefix layout), rows over
    data 2 x fsdp 2 and KV heads over tensor 2: the same tokens and log-probs as on one device."""
    suffixes = [[20], [21, 22, 23, 24], [25, 26], [27, 28, 29], [30], [31, 32, 33, 34, 35], [36], [37, 38]]
    kwargs = dict(key=jax.random.key(6), n=2, max_new_tokens=6, sampler="temperature(1.3)", stop_tokens=[],
                  pad_id=0, suffix_ids=suffixes)
    expected = sampling.generate(model, PROMPTS, **kwargs)
    layout = _decode(sharding.MeshConfig(data=2, fsdp=2, tensor=2), 2)
    got = sampling.generate(loader.to_layout(model, layout, per_layer=True), PROMPTS, layout=layout, **kwargs)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5)


def test_odd_batch_is_padded_to_the_mesh(model):
    layout = _decode(sharding.MeshConfig(data=2, fsdp=4, tensor=1), 1)
    kwargs = dict(key=jax.random.key(0), max_new_tokens=5, stop_tokens=[], pad_id=0)
    got = sampling.generate(loader.to_layout(model, layout), PROMPTS[:3], layout=layout, **kwargs)
    expected = sampling.generate(model, PROMPTS[:3], **kwargs)
    assert got.tokens.shape == (3, 5)
    np.testing.assert_array_equal(got.tokens, expected.tokens)


def test_misplaced_parameters_are_an_error_not_a_copy(model):
    """Parameters on one device, or in the training layout, or in another dtype: generate names the
    first parameter, its sharding and the one expected, and moves nothing."""
    train = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tensor=1)))
    decode = sharding.decode_layout(train.mesh, 2)
    kwargs = dict(key=jax.random.key(0), max_new_tokens=2, stop_tokens=[], pad_id=0, layout=decode)
    with pytest.raises(loader.PlacementError, match=r"generate: embed_tokens/embedding has sharding "
                                                     r"SingleDeviceSharding.*expected NamedSharding"):
        sampling.generate(model, PROMPTS, **kwargs)
    in_training_layout = loader.to_layout(model, train)
    with pytest.raises(loader.PlacementError, match=r"embed_tokens/embedding has sharding .*'fsdp'.*expected"):
        sampling.generate(in_training_layout, PROMPTS, **kwargs)
    placed = loader.to_layout(model, decode)
    wrong_dtype = loader.Weights(placed.cfg, placed.graphdef,
                                 jax.tree.map(lambda x: x.astype(jnp.bfloat16), placed.params), placed.shardings)
    with pytest.raises(loader.PlacementError, match=r"has dtype bfloat16, expected float32"):
        sampling.generate(wrong_dtype, PROMPTS, **kwargs)
    # In bfloat16 on purpose: the decode copy is cast in the same explicit step as the reshard.
    bf16 = loader.to_layout(in_training_layout, decode, param_dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(bf16.params)} == {jnp.dtype(jnp.bfloat16)}
    assert sampling.generate(bf16, PROMPTS, **kwargs).tokens.shape == (4, 2)


def _per_token_all_gathers(layout, sampler, per_layer=False):
    """All-gathers inside the decode while loop (unknown trip count) of the compiled sampler."""
    weights = loader.abstract_weights(CFG, layout, per_layer=per_layer)
    lowered = sampling.lower_generate(weights, PROMPTS * 2, n=2, max_new_tokens=8, sampler=sampler,
                                      stop_tokens=[1], pad_id=0, layout=layout)
    return hlo_stats.summarize(hlo_stats.collectives(lowered.compile().as_text()))["all-gather"].per_iteration_count


@pytest.mark.parametrize(("sampler", "per_layer", "one_pass"),
                         [("greedy", False, False), ("temperature(0.7)", True, False), ("greedy", True, True)])
def test_decode_loop_all_gathers_nothing_in_the_decode_layout(sampler, per_layer, one_pass, monkeypatch):
    """The compiled program is the proof: with FSDP-sharded (training layout) weights every generated
    token all-gathers some (the embedding or LM head; the layer weights are gathered with their once-per-call
    per-layer copies); in the decode layout (tensor 4 x replicas 2) the loop body has none, with stacked or
    per-layer weights, and with the GPU's one-pass draw over the tensor-split vocabulary (`ONE_PASS_DRAW`: its
    blocks merged by all-reduces, where the partitioner all-gathered a variadic reduction's partial results)."""
    if one_pass:
        monkeypatch.setattr(sampling, "ONE_PASS_DRAW", frozenset({"cpu"}))
    train = sharding.Layout(sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tensor=1)))
    assert _per_token_all_gathers(train, sampler) >= 1
    assert _per_token_all_gathers(sharding.decode_layout(train.mesh, 4), sampler, per_layer) == 0
