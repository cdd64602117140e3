"""Writes tests/fixtures/golden/<name>/: tiny random HF checkpoints and their fp32 reference logits.

Each directory holds config.json, model.safetensors (fp32, HF names and layout) and expected.npz
(tokens, attention_mask, positions, logits [B, T, V], or [B, C] for a sequence classifier) computed by
transformers' PyTorch model. The model specs live in tests/hf_reference.py. tests/fixtures/golden_export/
qwen2_tiny_tokenizer is a whole directory as transformers' `save_pretrained` writes it (model,
generation_config.json, the tiny tokenizer), the reference for our exporter (tests/train/test_export.py).
Needs torch==2.13.0 (requirements-bench.txt); the test suite only reads the files. Regenerate all, or
the named ones, with:
    .venv/bin/python tests/make_golden_fixtures.py [NAME ...]
torch runs on one thread, so a fixture regenerates byte for byte (the four causal-LM fixtures were
made before this and differ from a regeneration by float noise, at most 1.5e-5 in a logit).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

import hf_reference

GOLDEN_DIR = Path(__file__).resolve().parent / "fixtures" / "golden"
EXPORT_DIR = Path(__file__).resolve().parent / "fixtures" / "golden_export"
EXPORT_NAME = "qwen2_tiny_tokenizer"
TINY_TOKENIZER = Path(__file__).resolve().parents[1] / "rubric_jax" / "assets" / "tiny" / "tokenizer"
# A model that the tiny tokenizer can drive (its vocab; its special tokens go into config.json).
EXPORT_SPEC = dict(seed=5, model_type="qwen2", vocab_size=2048, hidden_size=32, intermediate_size=64,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rope_theta=1_000_000.0,
                   tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=256)


def _to_old_config_format(config_path: Path) -> None:
    """Rewrites a transformers-5 config.json with the older top-level rope_theta/rope_scaling/torch_dtype keys."""
    hf = json.loads(config_path.read_text())
    rope = hf.pop("rope_parameters")
    hf["rope_theta"] = rope.pop("rope_theta")
    if rope.pop("rope_type") != "default":
        raise ValueError(f"{config_path}: the old-format fixture is meant for default RoPE")
    hf["torch_dtype"] = hf.pop("dtype")
    hf.pop("layer_types", None)
    config_path.write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")


def write_fixture(name: str) -> Path:
    """Builds one spec's model, saves it and its reference logits; returns the directory."""
    spec = hf_reference.SPECS[name]
    seed = spec["seed"]
    out_dir = GOLDEN_DIR / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    model = hf_reference.build_model(spec, seed)
    model.save_pretrained(out_dir)
    for path in out_dir.iterdir():
        if path.name not in ("config.json", "model.safetensors"):
            path.unlink()
    if spec.get("config_format") == "old":
        _to_old_config_format(out_dir / "config.json")
    tokens_BxT, mask_BxT, positions_BxT = hf_reference.fixture_batch(spec, seed)
    logits_BxTxV = hf_reference.reference_logits(model, tokens_BxT, mask_BxT, positions_BxT)
    np.savez(out_dir / "expected.npz", tokens=tokens_BxT, attention_mask=mask_BxT, positions=positions_BxT,
             logits=logits_BxTxV)
    return out_dir


def write_export_fixture() -> Path:
    """A Qwen2 model with the tiny tokenizer, saved whole by transformers (model and tokenizer)."""
    from transformers import AutoTokenizer

    out_dir = EXPORT_DIR / EXPORT_NAME
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER)
    spec = dict(EXPORT_SPEC, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    model = hf_reference.build_model(spec, spec["seed"])
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    tokens_BxT, mask_BxT, positions_BxT = hf_reference.fixture_batch(spec, spec["seed"])
    logits_BxTxV = hf_reference.reference_logits(model, tokens_BxT, mask_BxT, positions_BxT)
    np.savez(out_dir / "expected.npz", tokens=tokens_BxT, attention_mask=mask_BxT, positions=positions_BxT,
             logits=logits_BxTxV)
    return out_dir


def main(names: list[str]) -> None:
    known = [*sorted(hf_reference.SPECS), EXPORT_NAME]
    unknown = sorted(set(names) - set(known))
    if unknown:
        sys.exit(f"unknown fixture name(s) {unknown}; expected some of {known}")
    torch.set_num_threads(1)  # thread count changes float summation order, and so the stored logits
    total = 0
    for name in names or known:
        out_dir = write_export_fixture() if name == EXPORT_NAME else write_fixture(name)
        size = sum(p.stat().st_size for p in out_dir.iterdir())
        total += size
        print(f"{out_dir}: {size / 1024:.1f} KiB")
    print(f"total {total / 1024:.1f} KiB")


if __name__ == "__main__":
    main(sys.argv[1:])
