"""configs/tiny.py's config with its repository-relative paths made absolute, for tests that build or run
the tiny default in-process (pytest's working directory need not be the repository root)."""

from pathlib import Path

import ml_collections

from configs import tiny

ROOT = Path(__file__).resolve().parents[1]


def absolute_tiny_config() -> ml_collections.ConfigDict:
    """The tiny default with every data, rubric, model-config, tokenizer and judge path absolute (still unlocked
    for the caller's changes inside `config.unlocked()`)."""
    config = tiny.get_config()
    with config.unlocked():
        for key in ("train", "eval", "sft", "rubric", "golden"):
            if config.data[key]:
                config.data[key] = str(ROOT / config.data[key])
        for key in ("config_json", "tokenizer"):
            if config.model[key]:
                config.model[key] = str(ROOT / config.model[key])
        config.judge.checkpoint = ",".join(str(ROOT / path) for path in config.judge.checkpoint.split(",") if path)
    return config
