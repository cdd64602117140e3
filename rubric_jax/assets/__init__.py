"""Shipped assets of the embedded tiny default (tokenizer, model config, questions, SFT set, rubrics) and its
distilled judges (tiny_judge, tiny_judge_hack, tiny_judge_fixed)."""

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
TINY_DIR = ASSETS_DIR / "tiny"
TINY_JUDGE_DIR = ASSETS_DIR / "tiny_judge"
