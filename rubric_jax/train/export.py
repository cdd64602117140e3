"""A run's policy as a Hugging Face directory that transformers and vLLM load: the trained weights in
the run's parameter dtype, the run's tokenizer files and the starting checkpoint's generation defaults.
Called at the end of a run (config.export.at_end) and by `experiments.export` (rubric_jax/train/runs.py). A LoRA
policy is written twice: merged (a plain HF model) and as a PEFT adapter directory for its base."""

from __future__ import annotations

from pathlib import Path

from rubric_jax import loader, sharding
from rubric_jax.models.checkpoint import GENERATION_FILE, export_hf_checkpoint, export_peft_adapter


def export_policy(weights: loader.Weights, out: Path, *, tokenizer_dir: Path, start_dir: Path | None,
                  replace: bool = False) -> Path:
    """Writes `weights` to `out` (atomically; new or empty unless `replace`) with the tokenizer files of
    `tokenizer_dir`. generation_config.json comes from the starting checkpoint `start_dir` when it has one, else
    from the tokenizer's bos/eos/pad ids. Every process of a multi-host run calls it; process 0 writes."""
    generation = start_dir if start_dir is not None and (start_dir / GENERATION_FILE).is_file() else None
    return export_hf_checkpoint(weights.cfg, weights.params, out, source_dir=tokenizer_dir,
                                generation_source=generation, replace=replace)


def export_lora_policy(weights: loader.Weights, layout: sharding.Layout, out: Path, peft_out: Path, *,
                       tokenizer_dir: Path, start_dir: Path | None, base_model: str, replace: bool = False
                       ) -> tuple[Path, Path]:
    """A LoRA policy (`weights` in `layout`, stacked) as a merged HF directory `out` (`export_policy` of the
    adapters merged into their kernels) and a PEFT adapter directory `peft_out` for the HF model `base_model`."""
    merged = loader.to_layout(weights, layout)
    return (export_policy(merged, out, tokenizer_dir=tokenizer_dir, start_dir=start_dir, replace=replace),
            export_peft_adapter(weights.cfg, weights.params, peft_out, base_model=base_model, replace=replace))
