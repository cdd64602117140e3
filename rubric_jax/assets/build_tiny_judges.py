"""Builds the distilled tiny judges into rubric_jax/assets/tiny_judge{,_hack,_fixed,_group}/ (deterministic on one
machine and software stack: every random draw comes from fixed seeds).

  .venv/bin/python -m rubric_jax.assets.build_tiny_judges                      # rewrite all four (CPU minutes)
  .venv/bin/python -m rubric_jax.assets.build_tiny_judges --variant=default --out_root=DIR
  .venv/bin/python -m rubric_jax.assets.build_tiny_judges --variant=hack     # starts from the built tiny_judge (START_FROM)
  .venv/bin/python -m rubric_jax.assets.build_tiny_judges --variant=group    # group-capable, from tiny_judge too

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

from rubric_jax import loader
from rubric_jax.assets import ASSETS_DIR, tiny_judge_data
from rubric_jax.assets.build_tiny_assets import train_tokenizer
from rubric_jax.judges.distill_data import scoring_prompt, verdict_text
from rubric_jax.models.config import ModelConfig
from rubric_jax.train import distill_judge

SEED = 20261202
JUDGE_DIRS = {"default": "tiny_judge", "hack": "tiny_judge_hack", "fixed": "tiny_judge_fixed",
              "group": "tiny_judge_group"}
# The group judge learns the default judge's politeness items (the same teacher, questions and held-out split), both
# pointwise and in the group layout (judge.layout=group: groups of 1..GROUP_MAX_SIZE answers to one question).
ITEMS_OF = {"group": "default"}
GROUP_MAX_SIZE = 3  # the shipped politeness labels' largest group; below the tiny default's rl.group_size of 8
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
# The group judge: the same model with a 768-token context (RoPE positions: no new weights), which holds a group
# prompt of GROUP_MAX_SIZE answers (up to ~610 tokens: this tokenizer was not trained on the group rules) and its
# verdict lines.
GROUP_JUDGE_MODEL = JUDGE_MODEL.replace(max_position_embeddings=768)
MODELS = {"group": GROUP_JUDGE_MODEL}
# The compact judge prompt (criterion, fenced response, SCORE line: ~70 tokens, against ~180 for the full prompt):
# measured 2026-11-30 on the politeness teacher, a random-init student stays at chance (loss ~0.176 = ln 2 / 4 on
# the verdict tokens) for 400 updates of the full prompt, and with the compact one leaves that plateau between
# updates 160 and 320 and agrees with its teacher on every held-out item by update 480.
TRAINING = {variant: distill_judge.DistillConfig(steps=480 if variant == "default" else 960, batch_size=16,
                                                 learning_rate=3e-3, warmup_steps=20, seed=SEED, prompt="compact")
            for variant in tiny_judge_data.VARIANTS}
GROUP_STEPS, GROUP_REPEATS = 300, 2
TRAINING["group"] = distill_judge.DistillConfig(steps=GROUP_STEPS, batch_size=8, learning_rate=3e-3, warmup_steps=10,
                                                seed=SEED, prompt="compact", group_max_size=GROUP_MAX_SIZE,
                                                group_repeats=GROUP_REPEATS)
# The hack and fixed judges start from the default judge's weights and take 960 updates (measured 2026-11-30, held-out
# Spearman vs teacher): from a random init, 480 updates teach the hack judge clarity (0.76) but not politeness, a
# third of its items (it answers 0 to every one); from the default judge, 480 updates keep politeness (0.85, 1.0)
# and leave clarity short (hack 0.50, fixed 0.59); 960 reach 0.76 (hack) and 0.77 (fixed) with politeness 0.93, 0.99.
START_FROM = {"hack": "default", "fixed": "default", "group": "default"}
SAMPLER, MAX_NEW_TOKENS = "greedy", 16  # how configs/tiny*.py run the judges (the report measures the same)
GROUP_MAX_NEW_TOKENS = 32  # a group's verdict lines (`R<k>: <level>`, ~4 tokens each) and eos


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
    """Trains, exports and measures one judge variant into `out` (replaced only once the new one is complete); a
    variant of START_FROM starts from that judge in `out`'s directory, which must be built first."""
    train_items, heldout_items = tiny_judge_data.judge_items(ITEMS_OF.get(variant, variant))
    staging = out.parent / f".{out.name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    start, init = None, "random init"
    if variant in START_FROM:
        start_dir = out.parent / JUDGE_DIRS[START_FROM[variant]]
        start = loader.load_weights(start_dir, distill_judge.default_layout(), param_dtype="float32")
        init = f"fine-tuned from {start_dir.name}"
    report = distill_judge.distill(
        MODELS.get(variant, JUDGE_MODEL), start, tokenizer, train_items, heldout_items, staging, TRAINING[variant],
        teacher=f"rule teachers of rubric_jax/assets/tiny_judge_data.py, variant {variant!r}",
        student=f"{JUDGE_DIRS[variant]} ({init}, {JUDGE_MODEL.architecture})", sampler=SAMPLER,
        max_new_tokens=MAX_NEW_TOKENS, group_max_new_tokens=GROUP_MAX_NEW_TOKENS, progress=progress)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=(*JUDGE_DIRS, "all"), default="all")
    parser.add_argument("--out_root", type=Path, default=ASSETS_DIR, help="directory that gets tiny_judge*/")
    args = parser.parse_args(argv)
    variants = tuple(JUDGE_DIRS) if args.variant == "all" else (args.variant,)
    for variant in variants:
        start = START_FROM.get(variant)
        if start and start not in variants and not (args.out_root / JUDGE_DIRS[start] / "config.json").is_file():
            parser.error(f"--variant={variant} starts from the {start} judge: build it into {args.out_root} first")
    tokenizer = judge_tokenizer()
    for variant in variants:
        report = build_judge(variant, tokenizer, args.out_root / JUDGE_DIRS[variant])
        print(json.dumps({variant: {k: report[k] for k in ("heldout", "dimensions", "heldout_group") if k in report}},
                         indent=1))


if __name__ == "__main__":
    main()
