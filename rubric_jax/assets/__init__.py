"""Shipped assets: the embedded tiny default (tokenizer, model config, questions, SFT set, rubrics), its
distilled judges (tiny_judge, tiny_judge_hack, tiny_judge_fixed) and the public config.json of the models our
configs name (shapes only, for the dry run: rubric_jax/aot.py)."""

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
TINY_DIR = ASSETS_DIR / "tiny"
TINY_JUDGE_DIR = ASSETS_DIR / "tiny_judge"
MODEL_SHAPES_DIR = ASSETS_DIR / "model_shapes"  # <HF directory name>.json
