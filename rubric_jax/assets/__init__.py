"""Shipped assets of the embedded tiny default (tokenizer, model config, questions, SFT set, rubric)."""

from pathlib import Path

TINY_DIR = Path(__file__).resolve().parent / "tiny"

