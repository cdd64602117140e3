"""Random test models drawn on the host: no per-shape init compilation, weights far from HF's 0.02 so
next-token distributions are not uniform (norm scales are 1 + noise). `random_weights` gives the
project's one parameter form (rubric_jax.loader.Weights) on the default device."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_jax import loader
from rubric_jax.models.checkpoint import export_hf_checkpoint
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.transformer import Transformer


def random_model(cfg: ModelConfig, *, std: float, seed: int = 0) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, state) of a Transformer with N(0, std) weights and 1 + N(0, std) norm scales."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        value = rng.normal(0.0, std, leaf.shape) + (1.0 if "scale" in jax.tree_util.keystr(path) else 0.0)
        return jnp.asarray(value, leaf.dtype)

    return graphdef, jax.tree_util.tree_map_with_path(draw, abstract)


def random_weights(cfg: ModelConfig, *, std: float, seed: int = 0) -> loader.Weights:
    """`random_model`'s parameters as Weights on the default device (what sampling.generate takes)."""
    return loader.as_weights(cfg, nnx.to_pure_dict(random_model(cfg, std=std, seed=seed)[1]))


TINY_ASSETS = Path(__file__).resolve().parents[1] / "rubric_jax" / "assets" / "tiny"


def tiny_hf_dir(path: Path, *, num_labels: int = 0, std: float = 0.3, seed: int = 0, **changes) -> Path:
    """A HF directory at `path` with a random model of the tiny default's shape (a causal LM, or with
    `num_labels` a one-pad-id sequence classifier such as a reward model) and the tiny tokenizer files.
    `changes` set other ModelConfig fields (e.g. num_layers=1 for a cheaper model)."""
    hf = json.loads((TINY_ASSETS / "config.json").read_text())
    cfg = ModelConfig.from_hf_dict(hf).replace(num_labels=num_labels,
                                               pad_token_id=hf["pad_token_id"] if num_labels else None, **changes)
    return export_hf_checkpoint(cfg, random_model(cfg, std=std, seed=seed)[1], path,
                                source_dir=TINY_ASSETS / "tokenizer")
