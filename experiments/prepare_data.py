"""Prepares question data as a tensorflow-datasets dataset that experiments.run trains from.

  python -m experiments.prepare_data --input=KIND:PATH [--input=...] --out=DIR --name=NAME [--scores=SCORES.jsonl]
      [--semantic_model=DIR [--semantic_tokenizer=DIR]] [--config.eval_size=0] [--config.golden_size=0]
      [--config.train_size=0] [--config.difficulty_ratio=3:5:2|none] [--config.dedup.threshold=0.7]
      [--config.seed=0] [--config.overwrite] [--config.FIELD=...]

The settings (split sizes, difficulty mix, dedup thresholds, seed) are configs/commands/prepare_data.py,
overridden with --config.FIELD=VALUE; the flags are the inputs and the output.

KIND is questions (the project's question jsonl), hellobench (the folder), biggen, healthbench or
longbench_write (their jsonl files). Steps: PII scrubbing, exact and MinHash near-duplicate removal,
difficulty labels (given, or terciles of the mean reward per question id in --scores), golden and eval
splits per category with no near duplicate in training, the easy:medium:hard mix of the training split.
Writes DIR/NAME/1.0.0 (array_record) with report.json and report.md beside it; train with
`--config.data.tfds_dir=DIR --config.data.train=tfds:NAME --config.data.eval=tfds:NAME`.
Bad input (a missing file, a malformed line, an unknown kind, a ratio that does not parse, an output that
overlaps an input, an unknown config key) exits with status 2 and one line naming it; nothing is written then. A failed write (a
full disk) exits with status 1 and one line; an existing dataset is kept.
"""

from __future__ import annotations

import functools
from pathlib import Path

import tensorflow_datasets as tfds
from absl import app, flags

from experiments import cli
from rubric_jax.command_blocks import PrepareData
from rubric_jax.prepare.pipeline import PrepareConfig, prepare

_CONFIG = cli.define_config("prepare_data")
_INPUT = flags.DEFINE_multi_string("input", None, "KIND:PATH, KIND in questions|hellobench|biggen|healthbench|"
                                   "longbench_write (repeat for several).")
_OUT = flags.DEFINE_string("out", None, "tfds data directory: the dataset goes to OUT/NAME/1.0.0.")
_NAME = flags.DEFINE_string("name", None, "Dataset name (lower case, digits, _), read back as tfds:NAME.")
_SCORES = flags.DEFINE_string("scores", None, "jsonl with id and reward per row: difficulty from mean reward.")
_SEMANTIC_MODEL = flags.DEFINE_string("semantic_model", "",
                                      "HF model directory: embedding cosine marks paraphrases too.")
_SEMANTIC_TOKENIZER = flags.DEFINE_string("semantic_tokenizer", "", "Tokenizer of --semantic_model (default: its dir).")
flags.mark_flags_as_required(["input", "out", "name"])


_fail = functools.partial(cli.fail, "experiments.prepare_data")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.prepare_data", argv)
    tfds.disable_progress_bar()
    settings = cli.settings("experiments.prepare_data", _CONFIG.value, PrepareData)
    dedup = settings.dedup
    config = PrepareConfig(
        inputs=tuple(_INPUT.value), out=Path(_OUT.value), name=_NAME.value, eval_size=settings.eval_size,
        golden_size=settings.golden_size, train_size=settings.train_size, difficulty_ratio=settings.difficulty_ratio,
        scores=Path(_SCORES.value) if _SCORES.value else None, dedup_threshold=dedup.threshold, ngram=dedup.ngram,
        num_perm=dedup.num_perm, seed=settings.seed, overwrite=settings.overwrite,
        semantic_words=dedup.semantic_words, semantic_model=_SEMANTIC_MODEL.value,
        semantic_tokenizer=_SEMANTIC_TOKENIZER.value, semantic_cosine=dedup.semantic_cosine)
    try:
        prepare(config)
    except ValueError as e:  # the library's errors are ValueErrors naming the file, line or flag
        _fail(str(e))
    except OSError as e:  # writing failed (a full disk): nothing was published, an existing dataset is kept
        cli.fail_write("experiments.prepare_data", config.out / config.name, e)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("experiments.prepare_data"))
