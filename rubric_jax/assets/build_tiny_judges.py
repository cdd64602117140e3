"""Builds the distilled tiny judges into rubric_jax/assets/tiny_judge{,_hack,_fixed}/ (deterministic on one
machine and software stack: every random draw comes from fixed seeds).

  .venv/bin/python -m rubric_jax.assets.build_tiny_judges                      # rewrite all three (CPU minutes)
  .venv/bin/python -m rubric_jax.assets.build_tiny_judges --variant=default --out_root=DIR

What the judges learn, from which teachers, is in tiny_judge_data.py. Each judge directory holds:
  tokenizer   byte-level BPE trained on judge prompts, one tokenizer for all three judges. Its pre-tokenizer
              splits at sentence ends and line breaks only, so merges run across words: an instruction sentence
              of the prompt, or a frequent answer sentence, costs one token (a judge prompt is ~200 tokens where
              word pieces would take ~500, which is what makes judging every GRPO step affordable on a CPU);
  weights     a Llama-shaped model of another architecture, shape and vocabulary than the Qwen2 tiny policy
              (RubricRL 6.2: judge and policy from different bases), distilled by rubric_jax/train/distill_judge.py;
  report.json its agreement with its teacher on held-out items (tiny_judge_data.HELDOUT of the questions),
  report.md   measured on the exported directory loaded the way training loads a judge.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerFast

from rubric_jax.assets import ASSETS_DIR, tiny_judge_data
from rubric_jax.assets.build_tiny_assets import train_tokenizer
from rubric_jax.judges.distill_data import scoring_prompt, verdict_text
from rubric_jax.models.config import ModelConfig
from rubric_jax.train import distill_judge

SEED = 20261202
JUDGE_DIRS = {"default": "tiny_judge", "hack": "tiny_judge_hack", "fixed": "tiny_judge_fixed"}
TOKENIZER_VOCAB = 3072
# Pre-tokenizer pieces are sentences and line breaks (see the module docstring).
SENTENCE_SPLIT = r"[^\n.!?。！？]+[.!?。！？]*|\n"
# A Llama-architecture model: another base than the Qwen2 tiny policy (hidden 128, 2 layers, 2048 tokens), and
# transformers loads a Llama directory's tokenizer as saved (for model_type qwen2 it swaps in Qwen2's own
# pre-tokenizer, which would split the judge's sentence pieces).
JUDGE_MODEL = ModelConfig(architecture="llama", vocab_size=TOKENIZER_VOCAB, hidden_size=64, intermediate_size=192,
                          num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
                          rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, rope_scaling=None,
                          max_position_embeddings=512)
# The compact judge prompt (criterion, fenced response, SCORE line: ~70 tokens, against ~180 for the full prompt):
# measured 2026-11-30 on the politeness teacher, a random-init student stays at chance (loss ~0.176 = ln 2 / 4 on
# the verdict tokens) for 400 updates of the full prompt, and with the compact one leaves that plateau between
# updates 160 and 320 and agrees with its teacher on every held-out item by update 480.
# The hack and fixed judges are still the first recipe (full prompt, 160 updates; not yet learnt, README): moving
# them to the compact one is the open step, and configs/tiny_hack*.py name the prompt each was distilled on.
TRAINING = {
    "default": distill_judge.DistillConfig(steps=480, batch_size=16, learning_rate=3e-3, warmup_steps=20, seed=SEED,
                                           prompt="compact"),
    **{variant: distill_judge.DistillConfig(steps=160, batch_size=16, learning_rate=3e-3, warmup_steps=10, seed=SEED)
       for variant in ("hack", "fixed")},
}
SAMPLER, MAX_NEW_TOKENS = "greedy", 16  # how configs/tiny*.py run the judges (the report measures the same)


def judge_tokenizer() -> PreTrainedTokenizerFast:
    """One tokenizer for the three judges, trained on one rendering of every training prompt and verdict."""
    rng = np.random.default_rng(SEED)
    texts = ["system", "user", "assistant"]
    for variant in tiny_judge_data.VARIANTS:
        for item in tiny_judge_data.judge_items(variant)[0]:
            texts += [m["content"] for m in scoring_prompt(item, rng, ()).messages]
            texts.append(verdict_text(item.dimension, item.score))
    return train_tokenizer(texts, TOKENIZER_VOCAB, JUDGE_MODEL.max_position_embeddings, split=SENTENCE_SPLIT)


def build_judge(variant: str, tokenizer: PreTrainedTokenizerFast, out: Path, *, progress: bool = True
                ) -> dict[str, Any]:
    """Trains, exports and measures one judge variant into `out` (replaced only once the new one is complete)."""
    train_items, heldout_items = tiny_judge_data.judge_items(variant)
    staging = out.parent / f".{out.name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    report = distill_judge.distill(
        JUDGE_MODEL, None, tokenizer, train_items, heldout_items, staging, TRAINING[variant],
        teacher=f"rule teachers of rubric_jax/assets/tiny_judge_data.py, variant {variant!r}",
        student=f"{JUDGE_DIRS[variant]} (random init, {JUDGE_MODEL.architecture})", sampler=SAMPLER,
        max_new_tokens=MAX_NEW_TOKENS, progress=progress)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=(*tiny_judge_data.VARIANTS, "all"), default="all")
    parser.add_argument("--out_root", type=Path, default=ASSETS_DIR, help="directory that gets tiny_judge*/")
    args = parser.parse_args(argv)
    tokenizer = judge_tokenizer()
    variants = tiny_judge_data.VARIANTS if args.variant == "all" else (args.variant,)
    for variant in variants:
        report = build_judge(variant, tokenizer, args.out_root / JUDGE_DIRS[variant])
        print(json.dumps({variant: {"heldout": report["heldout"], "dimensions": report["dimensions"]}}, indent=1))


if __name__ == "__main__":
    main()
