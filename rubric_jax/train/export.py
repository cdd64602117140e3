"""A run's policy as a Hugging Face directory that transformers and vLLM load: the trained weights in
the run's parameter dtype, the run's tokenizer files and the starting checkpoint's generation defaults.
Called at the end of a run (config.export.at_end) and by `experiments.export` (rubric_jax/train/runs.py)."""

from __future__ import annotations

from pathlib import Path

from rubric_jax import loader
from rubric_jax.models.checkpoint import GENERATION_FILE, export_hf_checkpoint


def export_policy(weights: loader.Weights, out: Path, *, tokenizer_dir: Path, start_dir: Path | None,
                  replace: bool = False) -> Path:
    """Writes `weights` to `out` (atomically; new or empty unless `replace`) with the tokenizer files of
    `tokenizer_dir`. generation_config.json comes from the starting checkpoint `start_dir` when it has one, else
    from the tokenizer's bos/eos/pad ids. Every process of a multi-host run calls it; process 0 writes."""
    generation = start_dir if start_dir is not None and (start_dir / GENERATION_FILE).is_file() else None
    return export_hf_checkpoint(weights.cfg, weights.params, out, source_dir=tokenizer_dir,
                                generation_source=generation, replace=replace)
