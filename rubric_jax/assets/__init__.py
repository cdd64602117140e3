"""Shipped assets: the embedded tiny default (tokenizer, model config, questions, SFT set, rubric) and the
public config.json of the models our configs name (shapes only, for the dry run: rubric_jax/aot.py)."""

from pathlib import Path

TINY_DIR = Path(__file__).resolve().parent / "tiny"
MODEL_SHAPES_DIR = Path(__file__).resolve().parent / "model_shapes"  # <HF directory name>.json

