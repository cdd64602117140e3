"""The sequence-classification (reward-model) head: logits equal to transformers' Qwen2ForSequenceClassification
(golden fixture; live when torch is installed), its pooling token, config.json parsing, and export/import
through the one HF tensor table."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from rubric_jax.loader import load_weights
from rubric_jax.models.checkpoint import CheckpointError, export_hf_checkpoint
from rubric_jax.models.config import ModelConfig, ModelConfigError
from rubric_jax.models.transformer import causal_padding_mask, last_non_pad_index
from test_checkpoint import flat_state, parts, read_tensors, rel_err, variant

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "qwen2_seqcls_gqa2"


@functools.partial(jax.jit, static_argnums=0)
def classify(graphdef, state, tokens_BxT, positions_BxT, input_mask_BxT):
    """Jitted [B, C] classifier logits of the merged model."""
    return nnx.merge(graphdef, state).sequence_logits(tokens_BxT, positions_BxT, causal_padding_mask(input_mask_BxT))


def fixture_batch() -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "expected.npz") as npz:
        return dict(npz)


def our_logits(graphdef, state, e: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(classify(graphdef, state, jnp.asarray(e["tokens"]), jnp.asarray(e["positions"]),
                               jnp.asarray(e["attention_mask"]).astype(bool)))


def test_golden_classifier_logits_match_transformers():
    cfg, graphdef, state = parts(load_weights(GOLDEN))
    assert cfg.is_classifier and cfg.num_labels == 3 and cfg.pad_token_id == 7 and cfg.tie_word_embeddings
    assert set(state) == {"embed_tokens", "layers", "norm", "score"}  # no LM head at all
    e = fixture_batch()
    logits = our_logits(graphdef, state, e)
    assert logits.dtype == np.float32 and logits.shape == e["logits"].shape == (4, 3)
    assert rel_err(logits, e["logits"]) <= 1e-5


def test_pooled_token_is_the_last_one_that_is_not_pad_as_transformers_picks_it():
    e = fixture_batch()
    # Rows: unpadded, left-padded, right-padded, right-padded whose last real token is the pad id.
    np.testing.assert_array_equal(last_non_pad_index(jnp.asarray(e["tokens"]), 7), [10, 10, 6, 7])
    last_real = e["attention_mask"].shape[1] - 1 - np.argmax(e["attention_mask"][:, ::-1], axis=1)
    assert last_real[3] == 8  # the attention mask's last token is not the one pooled in row 3
    np.testing.assert_array_equal(last_non_pad_index(jnp.full((2, 4), 7), 7), [0, 0])  # all pad: index 0


def test_score_head_reads_the_last_hidden_state_by_hand():
    """logits[b] = score(final-norm hidden state at the pooled token), computed from the LM pieces."""
    _, graphdef, state = parts(load_weights(GOLDEN))
    e = fixture_batch()
    hidden = jax.jit(lambda s, t, p, m: nnx.merge(graphdef, s).hidden_states(t, p, causal_padding_mask(m))[0])
    h_BxTxD = hidden(state, jnp.asarray(e["tokens"]), jnp.asarray(e["positions"]),
                     jnp.asarray(e["attention_mask"]).astype(bool))
    score_CxD = read_tensors(GOLDEN)["score.weight"]
    pooled = np.asarray(h_BxTxD)[np.arange(4), [10, 10, 6, 7]]
    np.testing.assert_allclose(our_logits(graphdef, state, e), pooled @ score_CxD.T, rtol=1e-5, atol=1e-6)


def test_heads_refuse_the_wrong_call():
    _, graphdef, state = parts(load_weights(GOLDEN))
    with pytest.raises(ValueError, match="sequence classifier"):
        nnx.merge(graphdef, state).logits_from_hidden(jnp.zeros((1, 1, 32)))
    lm_cfg, lm_graphdef, lm_state = parts(load_weights(GOLDEN.parent / "qwen2_tied_gqa2"))
    assert not lm_cfg.is_classifier and lm_cfg.num_labels == 0 and lm_cfg.pad_token_id is None
    tokens = jnp.zeros((1, 2), jnp.int32)
    with pytest.raises(ValueError, match="causal LM"):
        nnx.merge(lm_graphdef, lm_state).sequence_logits(tokens, tokens, causal_padding_mask(tokens == 0))


def test_export_reload_is_identical_and_transformers_reads_the_config(tmp_path):
    cfg, graphdef, state = parts(load_weights(GOLDEN))
    out = export_hf_checkpoint(cfg, state, tmp_path / "export")
    original, exported = read_tensors(GOLDEN), read_tensors(out)
    assert sorted(exported) == sorted(original) and "score.weight" in exported and "lm_head.weight" not in exported
    for name, w in original.items():
        assert np.array_equal(exported[name], w), name
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["Qwen2ForSequenceClassification"] and hf["pad_token_id"] == 7
    hf_cfg = transformers.AutoConfig.for_model(**hf)
    assert hf_cfg.num_labels == 3 and hf_cfg.pad_token_id == 7
    cfg2, graphdef2, state2 = parts(load_weights(out))
    assert cfg2 == cfg
    before, after = flat_state(state), flat_state(state2)
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)


def _classifier_hf(**changes) -> dict:
    hf = {"architectures": ["Qwen2ForSequenceClassification"], "model_type": "qwen2", "vocab_size": 96,
          "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
          "rope_theta": 1e6, "pad_token_id": 7, "id2label": {"0": "LABEL_0"}}
    hf.update(changes)
    return {k: v for k, v in hf.items() if v is not None}


def test_config_reads_labels_as_transformers_does():
    assert ModelConfig.from_hf_dict(_classifier_hf()).num_labels == 1
    # Without id2label, transformers' default is 2 labels (and an explicit num_labels wins).
    assert ModelConfig.from_hf_dict(_classifier_hf(id2label=None)).num_labels == 2
    assert ModelConfig.from_hf_dict(_classifier_hf(id2label=None, num_labels=5)).num_labels == 5
    for hf in (_classifier_hf(), _classifier_hf(architectures=["LlamaForSequenceClassification"],
                                                model_type="llama")):
        assert transformers.AutoConfig.for_model(**hf).num_labels == ModelConfig.from_hf_dict(hf).num_labels
    # A causal LM keeps no label count or pad id, whatever else its config.json says.
    lm = ModelConfig.from_hf_dict(_classifier_hf(architectures=["Qwen2ForCausalLM"]))
    assert (lm.num_labels, lm.pad_token_id) == (0, None)
    again = ModelConfig.from_hf_dict(ModelConfig.from_hf_dict(_classifier_hf()).to_hf_dict())
    assert again == ModelConfig.from_hf_dict(_classifier_hf())


@pytest.mark.parametrize(("changes", "match"), [
    (dict(pad_token_id=None), "pad_token_id"),
    (dict(pad_token_id=96), r"pad_token_id in \[0, 96\)"),
])
def test_config_errors_are_named(changes, match):
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_hf_dict(_classifier_hf(**changes))


def test_a_classifier_directory_with_an_lm_head_is_refused(tmp_path):
    tensors = read_tensors(GOLDEN)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    bad = variant(GOLDEN, tmp_path / "bad", tensors)
    with pytest.raises(CheckpointError, match="unexpected tensor.*lm_head.weight"):
        parts(load_weights(bad))
    del tensors["lm_head.weight"], tensors["score.weight"]
    with pytest.raises(CheckpointError, match="'score.weight' is missing"):
        parts(load_weights(variant(GOLDEN, tmp_path / "headless", tensors)))


def test_live_parity_and_transformers_reads_our_export(tmp_path):
    pytest.importorskip("torch")
    import hf_reference

    spec = hf_reference.SPECS[GOLDEN.name]
    model = hf_reference.build_model(spec, seed=1234)
    model.save_pretrained(tmp_path / "hf")
    tokens, mask, positions = hf_reference.classifier_token_batch(spec["vocab_size"], spec["pad_token_id"], seed=99)
    reference = hf_reference.reference_logits(model, tokens, mask, positions)
    cfg, graphdef, state = parts(load_weights(tmp_path / "hf"))
    e = {"tokens": tokens, "positions": positions, "attention_mask": mask}
    assert rel_err(our_logits(graphdef, state, e), reference) <= 1e-5
    reloaded = hf_reference.load_model(str(export_hf_checkpoint(cfg, state, tmp_path / "ours")), classifier=True)
    assert rel_err(hf_reference.reference_logits(reloaded, tokens, mask, positions), reference) <= 1e-6
