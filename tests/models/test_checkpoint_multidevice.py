"""The loader on 8 simulated CPU devices: a HF checkpoint straight into a sharded layout, the same
arrays from a run's orbax params checkpoint, and a judge whose every parameter is placed and typed as
asked (decode layout, bfloat16)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx, traverse_util
from jax.sharding import PartitionSpec as P

from rubric_jax import loader, sharding
from tiny_config import absolute_tiny_config
from rubric_jax.judges.llm_judge import load_judge
from rubric_jax.models.checkpoint import export_hf_checkpoint
from rubric_jax.models.transformer import causal_padding_mask
from rubric_jax.sharding import MeshConfig, make_mesh
from rubric_jax.train import checkpointing
from rubric_jax.train import state as train_state

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def _flat(params):
    return traverse_util.flatten_dict(params)


@pytest.mark.parametrize("name", ["qwen2_tied_gqa2", "llama_gqa4_headdim16"])
def test_sharded_load_places_shards_and_matches_unsharded(name, tmp_path):
    assert jax.device_count() == 8
    layout = sharding.Layout(make_mesh(MeshConfig(data=1, fsdp=4, tensor=2)))
    weights = loader.load_weights(GOLDEN_DIR / name, layout)
    reference = loader.load_weights(GOLDEN_DIR / name)
    cfg = weights.cfg
    expected = _flat(loader.expected_shardings(cfg, layout))
    flat_reference = _flat(reference.params)
    for path, array in _flat(weights.params).items():
        assert array.sharding == expected[path] == _flat(weights.shardings)[path], path
        assert np.array_equal(np.asarray(array), np.asarray(flat_reference[path])), path
    # Every large parameter is split: no device holds a whole copy.
    embedding = weights.params["embed_tokens"]["embedding"]
    assert embedding.addressable_shards[0].data.shape == (cfg.vocab_size // 2, cfg.hidden_size // 4)
    q_kernel = weights.params["layers"]["self_attn"]["q_proj"]["kernel"]
    assert q_kernel.addressable_shards[0].data.shape == (
        cfg.num_layers, cfg.hidden_size // 4, cfg.num_heads // 2, cfg.head_dim)

    with np.load(GOLDEN_DIR / name / "expected.npz") as e:
        tokens, mask, positions, want = e["tokens"], e["attention_mask"], e["positions"], e["logits"]
    forward = jax.jit(lambda p, *args: nnx.merge(weights.graphdef, p)(*args)[0])
    logits = np.asarray(forward(weights.params, jnp.asarray(tokens), jnp.asarray(positions),
                                causal_padding_mask(jnp.asarray(mask))))
    valid = mask.astype(bool)
    assert np.max(np.abs(logits[valid] - want[valid])) <= 1e-5 * np.max(np.abs(want[valid]))

    # Export gathers the shards back into the original HF tensors.
    again = loader.load_weights(export_hf_checkpoint(cfg, weights.params, tmp_path / "export"))
    for path, value in _flat(again.params).items():
        assert np.array_equal(np.asarray(value), np.asarray(flat_reference[path])), path


def test_orbax_params_checkpoint_loads_the_same_arrays_as_the_hf_directory(tmp_path):
    """A train checkpoint of a run (params + optimizer state) read back as params only, into another
    layout and dtype, equals the HF directory the run started from."""
    hf_dir = GOLDEN_DIR / "llama_gqa4_headdim16"
    train = sharding.Layout(make_mesh(MeshConfig(data=1, fsdp=8, tensor=1)))
    policy = loader.load_weights(hf_dir, train)
    state, _ = train_state.new_train_state(policy, optax.adam(1e-3), train.mesh)
    with checkpointing.Checkpointer(tmp_path / "ckpt", max_to_keep=1) as ckpt:
        ckpt.save(state, data_state={}, rubric_hash="h")
        decode = sharding.decode_layout(train.mesh, 2)
        from_orbax = ckpt.restore_params(policy.cfg, decode)
        bf16 = ckpt.restore_params(policy.cfg.replace(param_dtype="bfloat16"), train)
    from_hf = loader.load_weights(hf_dir, decode)
    for path, value in _flat(from_hf.params).items():
        got = _flat(from_orbax.params)[path]
        assert got.sharding.is_equivalent_to(value.sharding, got.ndim), path
        assert np.array_equal(np.asarray(got), np.asarray(value)), path
        assert _flat(bf16.params)[path].dtype == jnp.bfloat16
    assert from_orbax.graphdef == from_hf.graphdef
    direct = loader.load_weights(tmp_path / "ckpt" / "0" / "state", decode, model_config=policy.cfg)
    jax.tree.map(np.testing.assert_array_equal, direct.params, from_hf.params)
    with pytest.raises(checkpointing.CheckpointError, match="carries no model config; pass model_config"):
        loader.load_weights(tmp_path / "ckpt" / "0" / "state", decode)
    with pytest.raises(checkpointing.CheckpointError, match=r"embed_tokens/embedding is saved as shape"):
        loader.load_weights(tmp_path / "ckpt" / "0" / "state", decode,
                            model_config=policy.cfg.replace(vocab_size=policy.cfg.vocab_size * 2))


def test_judge_lives_in_the_decode_layout_in_the_dtype_asked(tmp_path):
    """Every judge parameter: split over heads / KV heads / MLP / vocab on the tensor axis, never over
    fsdp, in bfloat16 when asked; the whole judge is never on one device."""
    from test_llm_judge import tiny_tokenizer

    src = GOLDEN_DIR / "qwen2_tied_gqa2"  # 4 heads, 2 KV heads
    judge_dir = export_hf_checkpoint(loader.load_weights(src).cfg, loader.load_weights(src).params,
                                     tmp_path / "judge")
    tiny_tokenizer().save_pretrained(judge_dir)
    decode = sharding.decode_layout(make_mesh(MeshConfig(data=1, fsdp=8, tensor=1)), 2)
    judge = load_judge(str(judge_dir), layout=decode, param_dtype="bfloat16", compute_dtype="bfloat16",
                       max_new_tokens=8)
    assert (judge.backend.weights.cfg.param_dtype, judge.backend.weights.cfg.compute_dtype) == ("bfloat16", "bfloat16")
    # The decode form holds each layer's weights as arrays of their own (no leading L axis).
    layer_specs = {
        ("self_attn", "q_proj", "kernel"): P(None, "tensor", None),
        ("self_attn", "q_proj", "bias"): P("tensor", None),
        ("self_attn", "k_proj", "kernel"): P(None, "tensor", None),
        ("self_attn", "v_proj", "bias"): P("tensor", None),
        ("self_attn", "o_proj", "kernel"): P("tensor", None, None),
        ("mlp", "gate_proj", "kernel"): P(None, "tensor"),
        ("mlp", "down_proj", "kernel"): P("tensor", None),
        ("input_layernorm", "scale"): P(None),
    }
    params = judge.backend.weights.params
    assert judge.backend.weights.per_layer and len(params["layers"]) == judge.backend.weights.cfg.num_layers
    specs = {("embed_tokens", "embedding"): P("tensor", None),  # vocab split, hidden whole
             ("norm", "scale"): P(None)}
    flat = _flat({k: v for k, v in params.items() if k != "layers"})
    for i, layer in enumerate(params["layers"]):
        flat.update({("layers", i, *path): array for path, array in _flat(layer).items()})
        specs.update({("layers", i, *path): spec for path, spec in layer_specs.items()})
    assert set(specs) <= set(flat)
    for path, array in flat.items():
        assert array.dtype == jnp.bfloat16, path
        assert array.sharding.mesh == decode.mesh and "fsdp" not in str(array.sharding.spec), path
        if path in specs:
            assert array.sharding.spec == specs[path], (path, array.sharding.spec)
    assert len(flat[("embed_tokens", "embedding")].sharding.device_set) == 8
    with pytest.raises(ValueError, match=r"judge.param_dtype='float16': expected one of"):
        load_judge(str(judge_dir), layout=decode, param_dtype="float16")


def test_reference_and_rollout_policy_placement_in_a_run(tmp_path):
    """In a run on 8 devices (tiny config, fsdp 8; decode: tensor 2 x 4 replicas): the frozen reference
    is read back from its orbax checkpoint into the training layout (float32, FSDP over `embed`), equal
    to the policy GRPO starts from; the rollout copy is in the decode layout, resharded explicitly."""
    from rubric_jax import data
    from rubric_jax.train import grpo_stage, loop

    config = absolute_tiny_config()
    with config.unlocked():
        config.mesh.rollout.tensor, config.mesh.rollout.param_dtype = 2, "bfloat16"
    run_ = loop.build(config, tmp_path / "run")
    state = run_.programs.grpo_state.init(run_.initial_params())
    reference = grpo_stage.load_reference(run_, state, data.IteratorState(seed=0))
    expected = _flat(loader.expected_shardings(run_.layouts.model, run_.layouts.training))
    policy = _flat(state.params)
    for path, array in _flat(reference.params).items():
        assert array.dtype == jnp.float32, path
        assert array.sharding.is_equivalent_to(expected[path], array.ndim), (path, array.sharding)
        assert np.array_equal(np.asarray(array), np.asarray(policy[path])), path
    embedding = reference.params["embed_tokens"]["embedding"]
    assert embedding.sharding.spec == P(None, "fsdp") and len(embedding.addressable_shards) == 8

    rollout = run_.layouts.rollout_weights(state.params)
    loader.check_placement(rollout, run_.layouts.decode)
    assert rollout.params["embed_tokens"]["embedding"].sharding.spec == P("tensor", None)
    assert {x.dtype for x in jax.tree.leaves(rollout.params)} == {jnp.dtype(jnp.bfloat16)}
    assert state.params["embed_tokens"]["embedding"].dtype == jnp.float32  # the training copy is untouched
