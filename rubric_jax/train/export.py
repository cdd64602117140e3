"""A run's policy as a Hugging Face directory that transformers and vLLM load: the trained weights in
the run's parameter dtype, the run's tokenizer files and the starting checkpoint's generation defaults.
Called at the end of a run (config.export.at_end) and by `experiments.export` (rubric_jax/train/runs.py)."""

from __future__ import annotations

from pathlib import Path

import ml_collections

from rubric_jax import loader
from rubric_jax.models.checkpoint import GENERATION_FILE, export_hf_checkpoint


def tokenizer_dir(config: ml_collections.ConfigDict) -> Path:
    """The run's tokenizer directory (config.model.tokenizer, else the starting checkpoint's)."""
    return Path(config.model.tokenizer or config.model.checkpoint)


def export_policy(weights: loader.Weights, config: ml_collections.ConfigDict, out: Path, *,
                  replace: bool = False) -> Path:
    """Writes `weights` of the run configured by `config` to `out` (atomically; new or empty unless
    `replace`). generation_config.json comes from the starting checkpoint when it has one, else from the
    tokenizer's bos/eos/pad ids. Every process of a multi-host run calls it; process 0 writes."""
    start = Path(config.model.checkpoint) if config.model.checkpoint else None
    generation = start if start is not None and (start / GENERATION_FILE).is_file() else None
    return export_hf_checkpoint(weights.cfg, weights.params, out, source_dir=tokenizer_dir(config),
                                generation_source=generation, replace=replace)
