"""Sentence embeddings for semantic deduplication (RubricRL §5.1 "用嵌入向量做语义去重"): the mean of a causal LM's
final-norm hidden states over a text's tokens, L2-normalised, so the dot product of two embeddings is their
cosine similarity.

Any local Hugging Face directory the loader reads (rubric_jax/loader.py: config.json + safetensors, its tokenizer
beside it or in `tokenizer_dir`) embeds; a config.json without weights (the tiny policy's) is initialised from
`seed`, which is only useful to measure what a random model gives (rubric_jax/prepare/dedup.py has the numbers).
Texts are tokenised without a chat template, right-padded to power-of-two buckets, `batch_size` a call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_jax import loader, padding, sharding
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.transformer import causal_padding_mask, padding_to_positions

_MIN_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class Embedder:
    """A loaded model and its tokenizer; `name` says where they came from (for reports)."""

    name: str
    weights: loader.Weights
    tokenizer: Any


def load_embedder(model_dir: str | Path, tokenizer_dir: str | Path | None = None, seed: int = 0) -> Embedder:
    """The model of `model_dir` (random init from `seed` when it holds a config.json and no weights) on one device,
    float32, and its tokenizer (`tokenizer_dir`, else `model_dir`)."""
    from transformers import AutoTokenizer  # slow import; only loading needs it

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: not a Hugging Face model directory (no config.json)")
    layout = sharding.single_device_layout()
    if any(path.glob("*.safetensors")):
        weights = loader.load_weights(path, layout, param_dtype="float32", compute_dtype="float32")
        name = str(path)
    else:
        cfg = ModelConfig.from_hf_dir(path, param_dtype="float32", compute_dtype="float32")
        weights = loader.init_weights(cfg, layout, jax.random.key(seed))
        name = f"{path} (no weights: random init, seed {seed})"
    tokenizer = AutoTokenizer.from_pretrained(Path(tokenizer_dir) if tokenizer_dir else path)
    return Embedder(name, weights, tokenizer)


@functools.lru_cache(maxsize=4)
def _mean_pool_program(graphdef: nnx.GraphDef):
    def mean_pool(params: dict[str, Any], tokens_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
        model = nnx.merge(graphdef, params)
        h_BxTxD, _ = model.hidden_states(tokens_BxT, padding_to_positions(mask_BxT), causal_padding_mask(mask_BxT))
        weights_BxT = mask_BxT.astype(jnp.float32)
        sum_BxD = jnp.einsum("BTD,BT->BD", h_BxTxD.astype(jnp.float32), weights_BxT)
        return sum_BxD / jnp.maximum(weights_BxT.sum(axis=1, keepdims=True), 1.0)

    return jax.jit(mean_pool)


def embed(embedder: Embedder, texts: Sequence[str], *, batch_size: int = 32, max_tokens: int = 128) -> np.ndarray:
    """float32 [N, D]: unit-length mean-pooled final hidden states (texts cut to `max_tokens` tokens)."""
    if not texts:
        return np.zeros((0, embedder.weights.cfg.hidden_size), np.float32)
    cfg = embedder.weights.cfg
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0  # masked out: any id pads
    max_tokens = min(max_tokens, cfg.max_position_embeddings)
    ids = [list(embedder.tokenizer.encode(t, add_special_tokens=False))[:max_tokens] or [pad] for t in texts]
    buckets = padding.power_of_two_buckets(min(_MIN_BUCKET, max_tokens), 1 << (max_tokens - 1).bit_length())
    program = _mean_pool_program(embedder.weights.graphdef)
    out_NxD = np.empty((len(texts), cfg.hidden_size), np.float32)
    for start in range(0, len(ids), batch_size):
        chunk = ids[start:start + batch_size]
        tokens_BxT, mask_BxT = padding.pad_right(chunk + [[pad]] * (batch_size - len(chunk)), pad, buckets)
        mask_BxT[len(chunk):] = False
        pooled_BxD = np.asarray(program(embedder.weights.params, jnp.asarray(tokens_BxT), jnp.asarray(mask_BxT)))
        out_NxD[start:start + len(chunk)] = pooled_BxD[: len(chunk)]
    norms_N = np.linalg.norm(out_NxD, axis=1, keepdims=True)
    return out_NxD / np.maximum(norms_N, 1e-12)
