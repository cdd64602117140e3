"""Tiny random Hugging Face (PyTorch) reference models for parity fixtures and live parity tests.

Needs torch; import it only from `tests/make_golden_fixtures.py` or after `pytest.importorskip("torch")`.
Weights are re-drawn at O(1) scale (norm scales around 1, non-zero biases) so that a wrong transpose,
bias, norm or RoPE mapping changes the logits by far more than the parity tolerance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers

# name -> HF config fields; covers tied/untied, GQA ratios 1/2/4, head_dim != hidden/heads, rope_theta,
# llama3 rope scaling, Qwen2 q/k/v bias. "config_format": "old" rewrites config.json with top-level keys.
# "head": "sequence_classification" builds a *ForSequenceClassification model (score head, no LM head).
# "seed" draws the fixture's weights and batch (fixed per fixture, so adding one changes no other).
SPECS: dict[str, dict[str, Any]] = {
    "qwen2_tied_gqa2": dict(
        seed=2,
        model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=10_000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-6, max_position_embeddings=64,
    ),
    "qwen2_untied_mha_oldconfig": dict(
        seed=3,
        model_type="qwen2", vocab_size=160, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, rope_theta=1_000_000.0, tie_word_embeddings=False,
        rms_norm_eps=1e-6, max_position_embeddings=64, config_format="old",
    ),
    "llama_gqa4_headdim16": dict(
        seed=1,
        model_type="llama", vocab_size=192, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, rope_theta=500_000.0,
        tie_word_embeddings=False, rms_norm_eps=1e-5, max_position_embeddings=64,
    ),
    # A Qwen2ForSequenceClassification (reward-model head): 3 labels so a transposed score weight shows; tied
    # embeddings as in the small Qwen2.5 bases (a classifier has no LM head to tie, and stores none).
    "qwen2_seqcls_gqa2": dict(
        seed=4,
        model_type="qwen2", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=1_000_000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-6, max_position_embeddings=64, head="sequence_classification", num_labels=3,
        pad_token_id=7,
    ),
    "llama3_rope_scaling_tied": dict(
        seed=0,
        model_type="llama", vocab_size=128, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, rope_theta=50_000.0,
        tie_word_embeddings=True, rms_norm_eps=1e-5, max_position_embeddings=64,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8),
    ),
}

_CONFIG_CLASSES = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}
_MODEL_CLASSES = {
    ("qwen2", "causal_lm"): transformers.Qwen2ForCausalLM,
    ("llama", "causal_lm"): transformers.LlamaForCausalLM,
    ("qwen2", "sequence_classification"): transformers.Qwen2ForSequenceClassification,
    ("llama", "sequence_classification"): transformers.LlamaForSequenceClassification,
}
_SPEC_ONLY_KEYS = ("seed", "model_type", "rope_theta", "rope_scaling", "config_format", "head")


def is_classifier(spec: dict[str, Any]) -> bool:
    """Whether a spec describes a sequence classifier (its fixture holds [B, C] logits)."""
    return spec.get("head", "causal_lm") == "sequence_classification"


def hf_config(spec: dict[str, Any]) -> transformers.PretrainedConfig:
    """A transformers config (new `rope_parameters` layout) for one spec."""
    fields = {k: v for k, v in spec.items() if k not in _SPEC_ONLY_KEYS}
    rope = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
    if "rope_scaling" in spec:
        rope.update(rope_type="llama3", **spec["rope_scaling"])
    return _CONFIG_CLASSES[spec["model_type"]](rope_parameters=rope, **fields)


def build_model(spec: dict[str, Any], seed: int) -> transformers.PreTrainedModel:
    """A random fp32 eager-attention model with O(1)-scale weights, deterministic in `seed`."""
    config = hf_config(spec)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = _MODEL_CLASSES[spec["model_type"], spec.get("head", "causal_lm")](config).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied lm_head is the embedding: listed once
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.5 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            else:  # Linear [out, in]
                param.copy_(noise / np.sqrt(param.shape[1]))
    return model


def token_batch(vocab_size: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [3, 11], attention_mask [3, 11], positions [3, 11]); rows 1 and 2 are left-padded."""
    rng = np.random.default_rng(seed)
    tokens_BxT = rng.integers(0, vocab_size, size=(3, 11)).astype(np.int32)
    mask_BxT = np.ones((3, 11), np.int32)
    mask_BxT[1, :3] = 0
    mask_BxT[2, :7] = 0
    tokens_BxT[mask_BxT == 0] = 0
    positions_BxT = np.maximum(np.cumsum(mask_BxT, axis=1) - 1, 0).astype(np.int32)
    return tokens_BxT, mask_BxT, positions_BxT


def classifier_token_batch(vocab_size: int, pad_id: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [4, 11], attention_mask, positions) for a classifier, padded with `pad_id`: row 0 unpadded,
    row 1 left-padded, row 2 right-padded, row 3 right-padded with its last real token equal to `pad_id`
    (transformers then pools the token before it: the rightmost token that is not `pad_id`)."""
    rng = np.random.default_rng(seed)
    tokens_BxT = rng.integers(0, vocab_size, size=(4, 11)).astype(np.int32)
    tokens_BxT[tokens_BxT == pad_id] = (pad_id + 1) % vocab_size  # no stray pad ids among real tokens
    mask_BxT = np.ones((4, 11), np.int32)
    mask_BxT[1, :3] = 0
    mask_BxT[2, 7:] = 0
    mask_BxT[3, 9:] = 0
    tokens_BxT[mask_BxT == 0] = pad_id
    tokens_BxT[3, 8] = pad_id
    positions_BxT = np.maximum(np.cumsum(mask_BxT, axis=1) - 1, 0).astype(np.int32)
    return tokens_BxT, mask_BxT, positions_BxT


def fixture_batch(spec: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The token batch a spec's fixture is computed on."""
    if is_classifier(spec):
        return classifier_token_batch(spec["vocab_size"], spec["pad_token_id"], seed)
    return token_batch(spec["vocab_size"], seed)


def reference_logits(model: transformers.PreTrainedModel, tokens_BxT: np.ndarray, mask_BxT: np.ndarray,
                     positions_BxT: np.ndarray) -> np.ndarray:
    """fp32 logits [B, T, V] from the HF model (explicit positions, as generation with left padding uses);
    [B, C] pooled logits from a sequence classifier."""
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(tokens_BxT.astype(np.int64)),
            attention_mask=torch.from_numpy(mask_BxT.astype(np.int64)),
            position_ids=torch.from_numpy(positions_BxT.astype(np.int64)),
        )
    return out.logits.to(torch.float32).numpy()


def reference_normed_layer_outputs(model: transformers.PreTrainedModel, tokens_BxT: np.ndarray,
                                   mask_BxT: np.ndarray, positions_BxT: np.ndarray) -> list[np.ndarray]:
    """final_norm(output of decoder layer k) [B, T, D] for k = 1..L, captured with forward hooks."""
    outputs = []

    def record(module, args, output):
        outputs.append(output[0] if isinstance(output, tuple) else output)

    hooks = [layer.register_forward_hook(record) for layer in model.model.layers]
    try:
        reference_logits(model, tokens_BxT, mask_BxT, positions_BxT)
    finally:
        for hook in hooks:
            hook.remove()
    with torch.no_grad():
        return [model.model.norm(h).to(torch.float32).numpy() for h in outputs]


def load_model(path: str, *, classifier: bool = False) -> transformers.PreTrainedModel:
    """Loads an HF directory (e.g. one our exporter wrote) as an fp32 eager-attention torch model."""
    auto = transformers.AutoModelForSequenceClassification if classifier else transformers.AutoModelForCausalLM
    return auto.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
