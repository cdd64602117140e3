"""Loading a HF checkpoint straight into a sharded state on 8 simulated CPU devices."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util

from rubric_jax.models.checkpoint import export_hf_checkpoint, load_hf_checkpoint
from rubric_jax.models.transformer import causal_padding_mask
from rubric_jax.sharding import MeshConfig, make_mesh, param_shardings

GOLDEN_DIR = Path(__file__).resolve().parent / "fixtures" / "golden"


@pytest.mark.parametrize("name", ["qwen2_tied_gqa2", "llama_gqa4_headdim16"])
def test_sharded_load_places_shards_and_matches_unsharded(name, tmp_path):
    assert jax.device_count() == 8
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    cfg, graphdef, state = load_hf_checkpoint(GOLDEN_DIR / name, shardings=lambda s: param_shardings(s, mesh))
    _, _, reference = load_hf_checkpoint(GOLDEN_DIR / name)
    expected_shardings = traverse_util.flatten_dict(nnx.to_pure_dict(param_shardings(state, mesh)))
    flat = traverse_util.flatten_dict(nnx.to_pure_dict(state))
    flat_reference = traverse_util.flatten_dict(nnx.to_pure_dict(reference))
    for path, array in flat.items():
        assert array.sharding == expected_shardings[path], path
        assert np.array_equal(np.asarray(array), np.asarray(flat_reference[path])), path
    # Every large parameter is split: no device holds a whole copy.
    embedding = flat[("embed_tokens", "embedding")]
    assert embedding.addressable_shards[0].data.shape == (cfg.vocab_size // 2, cfg.hidden_size // 4)
    q_kernel = flat[("layers", "self_attn", "q_proj", "kernel")]
    assert q_kernel.addressable_shards[0].data.shape == (
        cfg.num_layers, cfg.hidden_size // 4, cfg.num_heads // 2, cfg.head_dim)

    with np.load(GOLDEN_DIR / name / "expected.npz") as e:
        tokens, mask, positions, expected = e["tokens"], e["attention_mask"], e["positions"], e["logits"]
    forward = jax.jit(lambda s, *args: nnx.merge(graphdef, s)(*args)[0])
    logits = np.asarray(forward(state, jnp.asarray(tokens), jnp.asarray(positions),
                                causal_padding_mask(jnp.asarray(mask))))
    valid = mask.astype(bool)
    assert np.max(np.abs(logits[valid] - expected[valid])) <= 1e-5 * np.max(np.abs(expected[valid]))

    # Export gathers the shards back into the original HF tensors.
    out = export_hf_checkpoint(cfg, state, tmp_path / "export")
    _, _, again = load_hf_checkpoint(out)
    for path, value in traverse_util.flatten_dict(nnx.to_pure_dict(again)).items():
        assert np.array_equal(np.asarray(value), np.asarray(flat_reference[path])), path
