"""HF checkpoint loading and export: round trips, sharded files, bf16, transformers reading our export,
and one named error per way a checkpoint directory can be wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx, traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from rubric_jax.assets import TINY_DIR
from rubric_jax.loader import load_weights
from rubric_jax.models.checkpoint import INDEX_FILE, CheckpointError, export_hf_checkpoint, load_tokenizer
from rubric_jax.models.config import ModelConfigError
from rubric_jax.models.transformer import causal_padding_mask

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
QWEN_TIED = GOLDEN_DIR / "qwen2_tied_gqa2"  # q/k/v biases, tied embeddings
LLAMA_UNTIED = GOLDEN_DIR / "llama_gqa4_headdim16"  # lm_head, head_dim != hidden / heads


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of every safetensors file in `path`."""
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, framework="numpy") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})
    return tensors


def variant(src: Path, dst: Path, tensors: dict[str, np.ndarray] | None = None, **config_changes) -> Path:
    """A copy of checkpoint `src` at `dst` with other tensors and/or config.json fields."""
    dst.mkdir(parents=True, exist_ok=True)
    hf = json.loads((src / "config.json").read_text())
    hf.update(config_changes)
    (dst / "config.json").write_text(json.dumps(hf))
    save_file(read_tensors(src) if tensors is None else tensors, dst / "model.safetensors",
              metadata={"format": "pt"})
    return dst


def parts(weights):
    """(config, graphdef, params) of loaded Weights."""
    return weights.cfg, weights.graphdef, weights.params


def flat_state(params) -> dict[tuple[str, ...], np.ndarray]:
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}


def logits_of(graphdef, state, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(our logits, expected logits) at the valid positions of a golden fixture's batch."""
    with np.load(GOLDEN_DIR / name / "expected.npz") as e:
        tokens, mask, positions, expected = e["tokens"], e["attention_mask"], e["positions"], e["logits"]
    logits, _ = nnx.merge(graphdef, state)(jnp.asarray(tokens), jnp.asarray(positions),
                                           causal_padding_mask(jnp.asarray(mask)))
    valid = mask.astype(bool)
    return np.asarray(logits)[valid], expected[valid]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("src", [QWEN_TIED, LLAMA_UNTIED], ids=lambda p: p.name)
def test_load_export_reload_is_identical(src, tmp_path):
    cfg, _, state = parts(load_weights(src))
    out = export_hf_checkpoint(cfg, state, tmp_path / "export")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    # Exported tensors are the original HF tensors, bit for bit, under the same names.
    original, exported = read_tensors(src), read_tensors(out)
    assert sorted(exported) == sorted(original)
    for name, w in original.items():
        assert exported[name].dtype == w.dtype and np.array_equal(exported[name], w), name
    cfg2, _, state2 = parts(load_weights(out))
    assert cfg2 == cfg
    before, after = flat_state(state), flat_state(state2)
    assert before.keys() == after.keys()
    for key in before:
        assert np.array_equal(before[key], after[key]), key


def test_loaded_layout_matches_hand_mapping():
    """Spot checks of the table against the HF layout written out by hand."""
    cfg, _, state = parts(load_weights(QWEN_TIED))
    hf, ours = read_tensors(QWEN_TIED), flat_state(state)
    D, K, H = cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim
    q1 = hf["model.layers.1.self_attn.q_proj.weight"]  # [N*H, D]
    for n, h, d in [(0, 0, 0), (3, 15, 63), (2, 5, 17)]:
        assert ours[("layers", "self_attn", "q_proj", "kernel")][1, d, n, h] == q1[n * H + h, d]
    o0 = hf["model.layers.0.self_attn.o_proj.weight"]  # [D, N*H]
    assert ours[("layers", "self_attn", "o_proj", "kernel")][0, 2, 7, 40] == o0[40, 2 * H + 7]
    kb = hf["model.layers.1.self_attn.k_proj.bias"]  # [K*H]
    assert ours[("layers", "self_attn", "k_proj", "bias")][1, 1, 3] == kb[1 * H + 3]
    down = hf["model.layers.0.mlp.down_proj.weight"]  # [D, F]
    assert ours[("layers", "mlp", "down_proj", "kernel")][0, 11, 5] == down[5, 11]
    assert np.array_equal(ours[("norm", "scale")], hf["model.norm.weight"])
    assert ours[("layers", "self_attn", "v_proj", "kernel")].shape == (cfg.num_layers, D, K, H)
    assert "lm_head" not in state


def test_export_copies_tokenizer_files_and_rejects_a_used_directory(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(QWEN_TIED, source)
    shutil.copytree(TINY_DIR / "tokenizer", source, dirs_exist_ok=True)
    (source / "README.md").write_text("not copied")
    cfg, _, state = parts(load_weights(source))
    out = export_hf_checkpoint(cfg, state, tmp_path / "out", source_dir=source)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    assert not (out / "README.md").exists()
    (source / "tokenizer.json").write_text('{"fake": "tokenizer"}')
    with pytest.raises(CheckpointError, match="cannot load the tokenizer"):
        export_hf_checkpoint(cfg, state, tmp_path / "out2", source_dir=source)
    assert not (tmp_path / "out2").exists()
    with pytest.raises(FileExistsError, match="already holds a checkpoint"):
        export_hf_checkpoint(cfg, state, out)


def test_export_rejects_a_state_that_does_not_match_the_config(tmp_path):
    cfg, _, state = parts(load_weights(QWEN_TIED))
    pure = jax.tree.map(lambda x: x, state)  # new dicts: deleting below leaves `state` whole
    del pure["layers"]["self_attn"]["q_proj"]["bias"]
    with pytest.raises(ValueError, match="layers/self_attn/q_proj/bias"):
        export_hf_checkpoint(cfg, pure, tmp_path / "a")
    with pytest.raises(ValueError, match="embed_tokens/embedding has shape"):
        export_hf_checkpoint(cfg.replace(vocab_size=cfg.vocab_size + 1), state, tmp_path / "b")


# ---------------------------------------------------------------- shards

def test_export_in_shards_writes_an_index_and_reloads(tmp_path):
    cfg, graphdef, state = parts(load_weights(LLAMA_UNTIED))
    out = export_hf_checkpoint(cfg, state, tmp_path / "sharded", max_shard_bytes=64 * 1024)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / INDEX_FILE).read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert sorted(index["weight_map"]) == sorted(read_tensors(LLAMA_UNTIED))
    assert index["metadata"]["total_size"] == sum(w.nbytes for w in read_tensors(out).values())
    _, _, state2 = parts(load_weights(out))
    for key, value in flat_state(state).items():
        assert np.array_equal(flat_state(state2)[key], value), key


def test_hand_written_two_shard_checkpoint_loads(tmp_path):
    tensors = read_tensors(QWEN_TIED)
    names = sorted(tensors)
    files = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    shutil.copy(QWEN_TIED / "config.json", tmp_path / "config.json")
    for file, part in files.items():
        save_file({n: tensors[n] for n in part}, tmp_path / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {n: f for f, part in files.items() for n in part}}
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    cfg, graphdef, state = parts(load_weights(tmp_path))
    assert rel_err(*logits_of(graphdef, state, QWEN_TIED.name)) <= 1e-5
    # Without the index the shards are found by listing the directory.
    (tmp_path / INDEX_FILE).unlink()
    _, _, state2 = parts(load_weights(tmp_path))
    for key, value in flat_state(state).items():
        assert np.array_equal(flat_state(state2)[key], value), key


# ---------------------------------------------------------------- dtypes

def test_bf16_checkpoint_loads_in_any_param_dtype_and_exports_bf16(tmp_path):
    bf16 = {n: w.astype(ml_dtypes.bfloat16) for n, w in read_tensors(LLAMA_UNTIED).items()}
    src = variant(LLAMA_UNTIED, tmp_path / "bf16", bf16, dtype="bfloat16")
    _, _, state32 = parts(load_weights(src))
    cfg16, graphdef16, state16 = parts(load_weights(src, param_dtype="bfloat16"))
    emb32 = np.asarray(state32["embed_tokens"]["embedding"][...])
    assert emb32.dtype == np.float32
    assert np.array_equal(emb32, bf16["model.embed_tokens.weight"].astype(np.float32))
    assert state16["embed_tokens"]["embedding"][...].dtype == jnp.bfloat16
    out = export_hf_checkpoint(cfg16, state16, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    exported = read_tensors(out)
    for name, w in bf16.items():
        assert exported[name].dtype == ml_dtypes.bfloat16 and np.array_equal(exported[name], w), name
    # fp32 params export in the config's dtype: fp32 -> bf16 rounding on the way out.
    cfg32, _, state_fp32 = parts(load_weights(LLAMA_UNTIED))
    out16 = export_hf_checkpoint(cfg32.replace(param_dtype="bfloat16"), state_fp32, tmp_path / "down")
    assert read_tensors(out16)["lm_head.weight"].dtype == ml_dtypes.bfloat16


# ---------------------------------------------------------------- transformers reads our export (torch)

@pytest.mark.parametrize("shard_bytes", [4 << 30, 64 * 1024])
@pytest.mark.parametrize("src", [QWEN_TIED, LLAMA_UNTIED], ids=lambda p: p.name)
def test_transformers_loads_the_export_with_the_same_logits(src, shard_bytes, tmp_path):
    pytest.importorskip("torch")
    import hf_reference

    cfg, graphdef, state = parts(load_weights(src))
    out = export_hf_checkpoint(cfg, state, tmp_path / "export", max_shard_bytes=shard_bytes)
    model = hf_reference.load_model(str(out))
    with np.load(src / "expected.npz") as e:
        logits = hf_reference.reference_logits(model, e["tokens"], e["attention_mask"], e["positions"])
        valid, expected = e["attention_mask"].astype(bool), e["logits"]
    assert rel_err(logits[valid], expected[valid]) <= 1e-6
    ours, _ = logits_of(graphdef, state, src.name)
    assert rel_err(ours, logits[valid]) <= 1e-5


def test_transformers_loads_a_bf16_export(tmp_path):
    torch = pytest.importorskip("torch")
    import hf_reference

    cfg, _, state = parts(load_weights(QWEN_TIED, param_dtype="bfloat16"))
    out = export_hf_checkpoint(cfg, state, tmp_path / "export")
    model = hf_reference.load_model(str(out))  # upcasts to fp32
    embedding = np.asarray(state["embed_tokens"]["embedding"][...]).astype(np.float32)
    assert np.array_equal(model.model.embed_tokens.weight.detach().numpy(), embedding)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    assert torch.is_tensor(model.model.layers[0].self_attn.q_proj.bias)


# ---------------------------------------------------------------- named errors

def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match=r"nowhere: checkpoint directory does not exist"):
        load_weights(tmp_path / "nowhere")


def test_missing_config(tmp_path):
    shutil.copy(QWEN_TIED / "model.safetensors", tmp_path)
    with pytest.raises(ModelConfigError, match=r"config\.json: no such file"):
        load_weights(tmp_path)


def test_no_safetensors(tmp_path):
    shutil.copy(QWEN_TIED / "config.json", tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors.*pytorch_model\.bin"):
        load_weights(tmp_path)


def test_unsupported_architecture(tmp_path):
    variant(QWEN_TIED, tmp_path, model_type="gpt_neox")
    with pytest.raises(ModelConfigError, match=r"config\.json.*'gpt_neox'"):
        load_weights(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    tensors = read_tensors(QWEN_TIED)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    variant(QWEN_TIED, tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' is missing"):
        load_weights(tmp_path)


def test_untied_checkpoint_without_lm_head_is_missing_it(tmp_path):
    tensors = read_tensors(LLAMA_UNTIED)
    del tensors["lm_head.weight"]
    variant(LLAMA_UNTIED, tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight' is missing"):
        load_weights(tmp_path)


def test_shape_mismatch_names_tensor_expected_and_got(tmp_path):
    tensors = read_tensors(LLAMA_UNTIED)
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((16, 32), np.float32)
    variant(LLAMA_UNTIED, tmp_path, tensors)
    expected = r"'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \(16, 32\), expected \(32, 32\)"
    with pytest.raises(CheckpointError, match=expected):
        load_weights(tmp_path)


def test_config_that_disagrees_with_tensors_is_a_shape_error(tmp_path):
    variant(LLAMA_UNTIED, tmp_path, intermediate_size=81)
    with pytest.raises(CheckpointError, match=r"gate_proj\.weight' has shape \(80, 32\), expected \(81, 32\)"):
        load_weights(tmp_path)


@pytest.mark.parametrize("extra", ["model.layers.2.mlp.up_proj.weight", "model.layers.0.self_attn.o_proj.bias",
                                   "model.layers.0.self_attn.q_proj.bias", "vision_tower.weight"])
def test_unexpected_tensors_are_named(extra, tmp_path):
    tensors = read_tensors(LLAMA_UNTIED)  # Llama: no biases
    tensors[extra] = np.zeros((4,), np.float32)
    variant(LLAMA_UNTIED, tmp_path, tensors)
    with pytest.raises(CheckpointError, match=rf"1 unexpected tensor.*'{extra}'"):
        load_weights(tmp_path)


def test_rope_inverse_frequency_buffers_are_ignored(tmp_path):
    tensors = read_tensors(LLAMA_UNTIED)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones((8,), np.float32)
    variant(LLAMA_UNTIED, tmp_path, tensors)
    load_weights(tmp_path)


def test_tied_checkpoint_with_a_copy_of_the_embedding_as_lm_head(tmp_path):
    tensors = read_tensors(QWEN_TIED)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    variant(QWEN_TIED, tmp_path / "same", tensors)
    load_weights(tmp_path / "same")
    tensors["lm_head.weight"][0, 0] += 1.0
    variant(QWEN_TIED, tmp_path / "different", tensors)
    with pytest.raises(CheckpointError, match=r"ties word embeddings but 'lm_head\.weight' differs"):
        load_weights(tmp_path / "different")


def test_integer_tensor_is_a_dtype_error(tmp_path):
    tensors = read_tensors(QWEN_TIED)
    tensors["model.norm.weight"] = np.ones(tensors["model.norm.weight"].shape, np.int32)
    variant(QWEN_TIED, tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' has dtype int32"):
        load_weights(tmp_path)


def test_index_naming_a_missing_shard(tmp_path):
    shutil.copy(QWEN_TIED / "config.json", tmp_path)
    shutil.copy(QWEN_TIED / "model.safetensors", tmp_path / "model-00001-of-00002.safetensors")
    weight_map = {n: "model-00001-of-00002.safetensors" for n in read_tensors(QWEN_TIED)}
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"shard 'model-00002-of-00002\.safetensors'"):
        load_weights(tmp_path)
    (tmp_path / INDEX_FILE).write_text("{}")
    with pytest.raises(CheckpointError, match=r"index\.json: not a safetensors index"):
        load_weights(tmp_path)


def test_tensor_in_two_files_without_index(tmp_path):
    variant(QWEN_TIED, tmp_path)
    save_file({"model.norm.weight": read_tensors(QWEN_TIED)["model.norm.weight"]},
              tmp_path / "extra.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' is in both"):
        load_weights(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_truncated_or_malformed_safetensors_file_is_named(damage, tmp_path):
    """One CheckpointError line naming the file, never the safetensors library's own message."""
    variant(QWEN_TIED, tmp_path)
    weights_file = tmp_path / "model.safetensors"
    data = weights_file.read_bytes()
    weights_file.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"not a tensor file" * 8,
                              "empty": b""}[damage])
    with pytest.raises(CheckpointError) as info:
        load_weights(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{weights_file}: not a readable safetensors file") and "\n" not in message
    assert "header" not in message and "deserializ" not in message  # the rust library's words


def test_a_directory_without_tokenizer_files_is_one_line(tmp_path):
    variant(QWEN_TIED, tmp_path)
    with pytest.raises(CheckpointError, match=rf"^{tmp_path}: no tokenizer files \(expected one of tokenizer\.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(CheckpointError, match=r"nowhere: tokenizer directory does not exist$"):
        load_tokenizer(tmp_path / "nowhere")
