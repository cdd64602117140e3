"""Transformer parity with Hugging Face (stored golden logits; live torch models when torch is installed),
forward-pass invariants per golden config, and ModelConfig parsing of HF config.json."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_jax import hlo_stats
from rubric_jax.loader import load_weights
from rubric_jax.models.checkpoint import abstract_model
from rubric_jax.models.config import Llama3RopeScaling, ModelConfig, ModelConfigError
from rubric_jax.models.kv_cache import init_cache
from rubric_jax.models.transformer import causal_padding_mask, padding_to_positions, stack_layers, unstack_layers

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
GOLDEN_NAMES = ("llama3_rope_scaling_tied", "llama_gqa4_headdim16", "qwen2_tied_gqa2", "qwen2_untied_mha_oldconfig")


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|."""
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


@functools.partial(jax.jit, static_argnums=0)
def forward(graphdef, state, tokens_BxT, positions_BxT, mask_BxTxS, cache=None, cache_index=None):
    """Jitted logits (and cache) of the merged model."""
    return nnx.merge(graphdef, state)(tokens_BxT, positions_BxT, mask_BxTxS, cache, cache_index)


@functools.cache
def golden(name: str, **overrides):
    """(cfg, graphdef, params, expected npz as dict) of one golden fixture."""
    weights = load_weights(GOLDEN_DIR / name, **overrides)
    cfg, graphdef, state = weights.cfg, weights.graphdef, weights.params
    with np.load(GOLDEN_DIR / name / "expected.npz") as npz:
        expected = dict(npz)
    return cfg, graphdef, state, expected


def golden_logits(name: str, **overrides) -> tuple[np.ndarray, dict]:
    """Our logits on the fixture's batch (and the fixture arrays)."""
    _, graphdef, state, e = golden(name, **overrides)
    mask_BxTxT = causal_padding_mask(jnp.asarray(e["attention_mask"]))
    logits, cache = forward(graphdef, state, jnp.asarray(e["tokens"]), jnp.asarray(e["positions"]), mask_BxTxT)
    assert cache is None
    return np.asarray(logits), e


def graphdef_with(cfg: ModelConfig, **changes) -> nnx.GraphDef:
    """The graphdef of `cfg` with some fields changed (same parameter tree, so any state fits it)."""
    return abstract_model(cfg.replace(**changes))[0]


# ---------------------------------------------------------------- golden parity (no torch needed)

def test_golden_fixture_set_is_complete():
    classifiers = ("qwen2_seqcls_gqa2",)  # tests/models/test_sequence_classifier.py
    assert sorted(p.name for p in GOLDEN_DIR.iterdir() if p.is_dir()) == sorted(GOLDEN_NAMES + classifiers)
    for name in GOLDEN_NAMES + classifiers:
        assert {p.name for p in (GOLDEN_DIR / name).iterdir()} == {"config.json", "model.safetensors", "expected.npz"}


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_logits_match_transformers(name):
    logits, e = golden_logits(name)
    valid_BxT = e["attention_mask"].astype(bool)
    assert logits.dtype == np.float32 and logits.shape == e["logits"].shape
    assert rel_err(logits[valid_BxT], e["logits"][valid_BxT]) <= 1e-5
    # The stored positions are what our helper derives from the padding mask.
    np.testing.assert_array_equal(padding_to_positions(jnp.asarray(e["attention_mask"])), e["positions"])


def test_golden_fixtures_cover_the_variants():
    cfgs = {name: golden(name)[0] for name in GOLDEN_NAMES}
    assert {c.architecture for c in cfgs.values()} == {"qwen2", "llama"}
    assert {c.tie_word_embeddings for c in cfgs.values()} == {True, False}
    assert {c.num_groups for c in cfgs.values()} == {1, 2, 4}
    assert any(c.head_dim != c.hidden_size // c.num_heads for c in cfgs.values())
    assert any(c.attention_bias for c in cfgs.values())
    assert len({c.rope_theta for c in cfgs.values()}) == 4
    assert cfgs["llama3_rope_scaling_tied"].rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8)
    assert not golden(GOLDEN_NAMES[0])[3]["attention_mask"].all()  # left padding is exercised


# ---------------------------------------------------------------- invariants per golden config

@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_causality_via_gradients(name):
    cfg, graphdef, state, _ = golden(name)
    T = 8
    tokens_1xT = jnp.arange(3, 3 + T, dtype=jnp.int32)[None]  # distinct ids: table row r <-> one position
    positions_1xT = jnp.arange(T, dtype=jnp.int32)[None]
    mask_1xTxT = causal_padding_mask(jnp.ones((1, T), bool))
    probe_D = jax.random.normal(jax.random.key(0), (cfg.hidden_size,))

    def hidden_dot_probe(embedding_VxD):
        s = {**state, "embed_tokens": {"embedding": embedding_VxD}}  # the embedding is the traced argument
        h_1xTxD, _ = nnx.merge(graphdef, s).hidden_states(tokens_1xT, positions_1xT, mask_1xTxT)
        return h_1xTxD[0] @ probe_D  # [T]; hidden states avoid the tied output path

    jac_TxVxD = jax.jit(jax.jacrev(hidden_dot_probe))(state["embed_tokens"]["embedding"][...])
    influence_TxT = np.linalg.norm(np.asarray(jac_TxVxD[:, tokens_1xT[0], :]), axis=-1)  # [t, t']
    assert np.all(influence_TxT[np.triu_indices(T, k=1)] == 0.0)
    assert np.all(influence_TxT[np.tril_indices(T)] > 0.0)


def _loss_and_grads(graphdef, state, e):
    """A scalar of the logits and its gradient w.r.t. every parameter."""
    mask_BxTxT = causal_padding_mask(jnp.asarray(e["attention_mask"]))

    def loss(s):
        logits, _ = nnx.merge(graphdef, s)(jnp.asarray(e["tokens"]), jnp.asarray(e["positions"]), mask_BxTxT)
        return jnp.sum(jax.nn.log_softmax(logits)[..., 0] * jnp.asarray(e["attention_mask"]))

    return jax.jit(jax.value_and_grad(loss))(state)


@functools.cache
def golden_loss_and_grads(name: str):
    """`_loss_and_grads` under the fixture's own config (scan, no remat)."""
    cfg, graphdef, state, e = golden(name)
    assert cfg.scan_layers and not cfg.remat
    return _loss_and_grads(graphdef, state, e)


# Gradients compile slowly on CPU, so remat is checked once per layer path (scan, unrolled) and
# architecture; the unrolled path without remat is covered by the cached-forward test.
@pytest.mark.parametrize(("name", "change"), [
    ("llama3_rope_scaling_tied", dict(remat=True)),
    ("qwen2_tied_gqa2", dict(remat=True, scan_layers=False)),
])
def test_remat_and_scan_do_not_change_results(name, change):
    cfg, _, state, e = golden(name)
    value, grads = golden_loss_and_grads(name)
    other_value, other_grads = _loss_and_grads(graphdef_with(cfg, **change), state, e)
    np.testing.assert_allclose(other_value, value, rtol=1e-6)
    for g, other in zip(jax.tree.leaves(grads), jax.tree.leaves(other_grads)):
        assert rel_err(other, g) <= 1e-5


def test_remat_policy_dots_keeps_the_matmul_outputs():
    """model.remat_policy="dots": the same loss and gradients as full remat, and the backward runs no layer matmul
    of the forward again (full remat runs the 6 whose outputs the backward reads twice: q, k, v, o, gate, up; the
    attention's batched dots run again under both)."""
    name = "llama3_rope_scaling_tied"
    cfg, _, state, e = golden(name)
    mask_BxTxT = causal_padding_mask(jnp.asarray(e["attention_mask"]))

    def dots_and_grads(policy):
        graphdef = graphdef_with(cfg, remat=True, remat_policy=policy)

        def loss(s):
            logits, _ = nnx.merge(graphdef, s)(jnp.asarray(e["tokens"]), jnp.asarray(e["positions"]), mask_BxTxT)
            return jnp.sum(jax.nn.log_softmax(logits)[..., 0] * jnp.asarray(e["attention_mask"]))

        compiled = jax.jit(jax.value_and_grad(loss)).lower(state).compile()
        dots = hlo_stats.summarize(hlo_stats.collectives(compiled.as_text(), ("dot",)), ("dot",))["dot"].count
        return dots, compiled(state)

    (full_dots, (value, grads)), (kept_dots, (kept_value, kept_grads)) = dots_and_grads("full"), dots_and_grads("dots")
    assert full_dots - kept_dots == 6 * cfg.num_layers, (full_dots, kept_dots)
    np.testing.assert_allclose(kept_value, value, rtol=1e-6)
    for g, kept in zip(jax.tree.leaves(grads), jax.tree.leaves(kept_grads)):
        assert rel_err(kept, g) <= 1e-5
    with pytest.raises(ValueError, match=r"field 'remat_policy' must be one of \('full', 'dots'\), got 'some'"):
        cfg.replace(remat_policy="some")


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_bf16_compute_is_close(name):
    logits, e = golden_logits(name, compute_dtype="bfloat16", param_dtype="bfloat16")
    _, _, state, _ = golden(name, compute_dtype="bfloat16", param_dtype="bfloat16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(state))
    valid_BxT = e["attention_mask"].astype(bool)
    assert logits.dtype == np.float32 and np.all(np.isfinite(logits))
    err = rel_err(logits[valid_BxT], e["logits"][valid_BxT])
    assert 1e-4 < err < 5e-2  # bf16 really is used, and it stays close


@functools.partial(jax.jit, static_argnums=0)
def forward_per_layer(graphdef, state, tokens_BxT, positions_BxT, mask_BxTxS, cache, cache_index):
    """`forward` over per-layer weights (`unstack_layers`) and a per-layer cache."""
    model = nnx.merge(graphdef, stack_layers(state))
    return model(tokens_BxT, positions_BxT, mask_BxTxS, cache, cache_index, state["layers"])


# Prefill then one chunk (scan), or prefill, a one-token decode step and a chunk (unrolled layers, or the
# decode loop's per-layer weights and cache).
@pytest.mark.parametrize(("name", "chunks", "layers"), [
    ("llama3_rope_scaling_tied", (6, 5), "scan"),
    ("qwen2_untied_mha_oldconfig", (6, 5), "scan"),
    ("llama_gqa4_headdim16", (5, 1, 5), "unrolled"),
    ("qwen2_tied_gqa2", (5, 1, 5), "unrolled"),
    ("qwen2_untied_mha_oldconfig", (5, 1, 5), "per_layer"),
    ("llama_gqa4_headdim16", (5, 1, 5), "per_layer"),
])
def test_cached_forward_in_chunks_equals_full_forward(name, chunks, layers):
    cfg, _, state, e = golden(name)
    graphdef = graphdef_with(cfg, scan_layers=layers == "scan")
    full_logits, _ = golden_logits(name)
    tokens_BxT, input_mask_BxT = jnp.asarray(e["tokens"]), jnp.asarray(e["attention_mask"]).astype(bool)
    positions_BxT = jnp.asarray(e["positions"])
    B, T = tokens_BxT.shape
    assert sum(chunks) == T
    S = T + 3  # spare slots past the sequence stay masked
    cache = init_cache(cfg, B, S, per_layer=layers == "per_layer")
    step = forward
    if layers == "per_layer":
        state, step = unstack_layers(state, cfg.num_layers), forward_per_layer
    slot_mask_BxS = jnp.pad(input_mask_BxT, ((0, 0), (0, S - T)))
    pieces, start = [], 0
    for size in chunks:
        query_T = jnp.arange(start, start + size)
        mask_BxTxS = (jnp.arange(S)[None, :] <= query_T[:, None])[None] & slot_mask_BxS[:, None, :]
        logits, cache = step(graphdef, state, tokens_BxT[:, start:start + size],
                             positions_BxT[:, start:start + size], mask_BxTxS, cache, jnp.int32(start))
        pieces.append(np.asarray(logits))
        start += size
    cached_logits = np.concatenate(pieces, axis=1)
    valid_BxT = e["attention_mask"].astype(bool)
    assert rel_err(cached_logits[valid_BxT], full_logits[valid_BxT]) <= 1e-5
    stacked = np.stack if layers == "per_layer" else np.asarray
    # Keys are stored [.., H, S] (the score dot's right operand), values [.., S, H].
    for slots_last, part in ((True, cache.k), (False, cache.v)):
        part = stacked(part).swapaxes(-1, -2) if slots_last else stacked(part)
        assert part.shape == (cfg.num_layers, B, cfg.num_kv_heads, S, cfg.head_dim)
        assert np.all(part[:, :, :, T:] == 0)  # nothing written past the sequence
        assert np.all(np.any(part[:, :, :, :T] != 0, axis=-1))  # and every slot of it, in every layer


def test_per_layer_cache_needs_per_layer_weights():
    cfg, graphdef, state, e = golden("qwen2_tied_gqa2")
    model = nnx.merge(graphdef, state)
    tokens_BxT = jnp.asarray(e["tokens"])[:, :2]
    mask_BxTxS = jnp.ones((tokens_BxT.shape[0], 2, 4), bool)
    cache = init_cache(cfg, tokens_BxT.shape[0], 4, per_layer=True)
    with pytest.raises(ValueError, match="per-layer KV cache"):
        model(tokens_BxT, jnp.zeros_like(tokens_BxT), mask_BxTxS, cache, jnp.int32(0))
    with pytest.raises(ValueError, match=f"layers: 1 given, the model has {cfg.num_layers}"):
        model(tokens_BxT, jnp.zeros_like(tokens_BxT), mask_BxTxS, cache, jnp.int32(0),
              unstack_layers(state, cfg.num_layers)["layers"][:1])


# ---------------------------------------------------------------- live parity against transformers (torch)

def _truncated_hidden(cfg, state, k, tokens_BxT, positions_BxT, mask_BxTxT):
    """Final-normed hidden states of the first k layers only (per-layer parity without model internals)."""
    graphdef_k, _ = abstract_model(cfg.replace(num_layers=k))
    state_k = {**state, "layers": jax.tree.map(lambda x: x[:k], state["layers"])}
    h, _ = nnx.merge(graphdef_k, state_k).hidden_states(tokens_BxT, positions_BxT, mask_BxTxT)
    return np.asarray(h)


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_live_parity_with_transformers_per_layer_and_logits(name, tmp_path):
    pytest.importorskip("torch")
    import hf_reference

    spec = hf_reference.SPECS[name]
    model = hf_reference.build_model(spec, seed=1234)
    model.save_pretrained(tmp_path)
    tokens, mask, positions = hf_reference.token_batch(spec["vocab_size"], seed=99)
    ref_logits = hf_reference.reference_logits(model, tokens, mask, positions)
    ref_layers = hf_reference.reference_normed_layer_outputs(model, tokens, mask, positions)

    weights = load_weights(tmp_path)
    cfg, graphdef, state = weights.cfg, weights.graphdef, weights.params
    valid = mask.astype(bool)
    mask_BxTxT = causal_padding_mask(jnp.asarray(mask))
    logits, _ = forward(graphdef, state, jnp.asarray(tokens), jnp.asarray(positions), mask_BxTxT)
    assert rel_err(np.asarray(logits)[valid], ref_logits[valid]) <= 1e-5
    assert len(ref_layers) == cfg.num_layers
    for k, ref_h in enumerate(ref_layers[:-1], start=1):  # the last layer is checked through the logits
        h = _truncated_hidden(cfg, state, k, jnp.asarray(tokens), jnp.asarray(positions), mask_BxTxT)
        assert rel_err(h[valid], ref_h[valid]) <= 1e-5, f"layer {k}"


# ---------------------------------------------------------------- ModelConfig from HF config.json

def _llama3_new() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128, "hidden_size": 48,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 12, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "max_position_embeddings": 64, "attention_bias": False, "mlp_bias": False, "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    }


def _llama3_old() -> dict:
    old = {k: v for k, v in _llama3_new().items() if k not in ("rope_parameters", "dtype")}
    old.update(torch_dtype="bfloat16", rope_theta=500000.0,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    return old


def test_config_new_and_old_rope_layouts_agree():
    new, old = ModelConfig.from_hf_dict(_llama3_new()), ModelConfig.from_hf_dict(_llama3_old())
    assert new == old
    assert new.rope_theta == 500000.0 and new.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)
    assert (new.num_heads, new.num_kv_heads, new.head_dim, new.num_groups) == (4, 2, 12, 2)
    assert new.architecture == "llama" and not new.attention_bias and new.tie_word_embeddings
    # The pre-"rope_type" spelling of old checkpoints ("type") and plain default RoPE.
    legacy = _llama3_old()
    legacy["rope_scaling"] = dict(legacy["rope_scaling"], type=legacy["rope_scaling"].pop("rope_type"))
    assert ModelConfig.from_hf_dict(legacy) == new
    plain = {k: v for k, v in _llama3_old().items() if k != "rope_scaling"}
    assert ModelConfig.from_hf_dict(plain).rope_scaling is None


def test_config_qwen2_defaults_and_round_trip():
    hf = _llama3_new()
    hf.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_parameters={"rope_theta": 1e6})
    for key in ("head_dim", "num_key_value_heads", "attention_bias", "mlp_bias"):
        hf.pop(key)
    cfg = ModelConfig.from_hf_dict(hf, param_dtype="bfloat16", remat=True)
    assert cfg.attention_bias and cfg.head_dim == 12 and cfg.num_kv_heads == 4 and cfg.rope_scaling is None
    assert cfg.param_dtype == "bfloat16" and cfg.remat
    for c in (cfg, ModelConfig.from_hf_dict(_llama3_new())):
        again = ModelConfig.from_hf_dict(c.to_hf_dict(), param_dtype=c.param_dtype, remat=c.remat)
        assert again == c
    assert ModelConfig.from_hf_dict(dict(_llama3_new(), model_type="mistral")).architecture == "llama"


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_config_to_hf_dict_is_read_by_transformers(name):
    import transformers

    cfg = golden(name)[0]
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf_dict())
    assert hf_cfg.model_type == cfg.architecture
    assert hf_cfg.head_dim == cfg.head_dim
    assert (hf_cfg.num_attention_heads, hf_cfg.num_key_value_heads) == (cfg.num_heads, cfg.num_kv_heads)
    assert hf_cfg.rope_parameters["rope_theta"] == cfg.rope_theta
    assert hf_cfg.rope_parameters["rope_type"] == ("default" if cfg.rope_scaling is None else "llama3")
    assert hf_cfg.tie_word_embeddings == cfg.tie_word_embeddings


def test_config_unknown_architecture_is_named():
    with pytest.raises(ModelConfigError, match="'gpt2'"):
        ModelConfig.from_hf_dict(dict(_llama3_new(), model_type="gpt2"))
    with pytest.raises(ModelConfigError, match="None"):
        ModelConfig.from_hf_dict({k: v for k, v in _llama3_new().items() if k != "model_type"})


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "rms_norm_eps", "max_position_embeddings"])
def test_config_missing_field_is_named(field):
    hf = _llama3_new()
    del hf[field]
    with pytest.raises(ModelConfigError, match=f"'{field}'"):
        ModelConfig.from_hf_dict(hf)


def test_config_bad_values_are_named():
    no_theta = _llama3_new()
    del no_theta["rope_parameters"]["rope_theta"]
    with pytest.raises(ModelConfigError, match="rope_theta"):
        ModelConfig.from_hf_dict(no_theta)
    no_factor = _llama3_new()
    del no_factor["rope_parameters"]["low_freq_factor"]
    with pytest.raises(ModelConfigError, match="'low_freq_factor'"):
        ModelConfig.from_hf_dict(no_factor)
    yarn = _llama3_new()
    yarn["rope_parameters"]["rope_type"] = "yarn"
    with pytest.raises(ModelConfigError, match="'yarn'"):
        ModelConfig.from_hf_dict(yarn)
    with pytest.raises(ModelConfigError, match="num_kv_heads"):
        ModelConfig.from_hf_dict(dict(_llama3_new(), num_key_value_heads=3))
    with pytest.raises(ModelConfigError, match="'attention' must be one of .* got 'flash'"):
        ModelConfig.from_hf_dict(_llama3_new(), attention="flash")
    with pytest.raises(ModelConfigError, match="attention='cudnn' needs compute_dtype in .* got 'float32'"):
        ModelConfig.from_hf_dict(_llama3_new(), attention="cudnn")
    with pytest.raises(ModelConfigError, match="head_dim a multiple of 8 up to 256 .* got .* and 12"):
        ModelConfig.from_hf_dict(_llama3_new(), attention="cudnn", compute_dtype="bfloat16")
    assert ModelConfig.from_hf_dict(dict(_llama3_new(), head_dim=16), attention="cudnn",
                                    compute_dtype="bfloat16").attention == "cudnn"
    with pytest.raises(ModelConfigError, match="'gelu'"):
        ModelConfig.from_hf_dict(dict(_llama3_new(), hidden_act="gelu"))
    with pytest.raises(ModelConfigError, match="mlp_bias"):
        ModelConfig.from_hf_dict(dict(_llama3_new(), mlp_bias=True))
    with pytest.raises(ModelConfigError, match="'vocab_sise'"):
        ModelConfig.from_hf_dict(_llama3_new(), vocab_sise=3)
    with pytest.raises(ModelConfigError, match="'float8'"):
        ModelConfig.from_hf_dict(_llama3_new(), param_dtype="float8")


def test_config_from_hf_dir_names_the_file(tmp_path):
    with pytest.raises(ModelConfigError, match="config.json"):
        ModelConfig.from_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        ModelConfig.from_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelConfigError, match=r"config\.json.*'bert'"):
        ModelConfig.from_hf_dir(tmp_path)
