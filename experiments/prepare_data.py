"""Prepares question data as a tensorflow-datasets dataset that experiments.run trains from.

  python -m experiments.prepare_data --input=KIND:PATH [--input=...] --out=DIR --name=NAME
      [--eval_size=0] [--golden_size=0] [--train_size=0] [--difficulty_ratio=3:5:2|none]
      [--scores=SCORES.jsonl] [--dedup_threshold=0.7] [--ngram=3] [--num_perm=128] [--seed=0] [--overwrite]

KIND is questions (the project's question jsonl), hellobench (the folder), biggen, healthbench or
longbench_write (their jsonl files). Steps: PII scrubbing, exact and MinHash near-duplicate removal,
difficulty labels (given, or terciles of the mean reward per question id in --scores), golden and eval
splits per category with no near duplicate in training, the easy:medium:hard mix of the training split.
Writes DIR/NAME/1.0.0 (array_record) with report.json and report.md beside it; train with
`--config.data.tfds_dir=DIR --config.data.train=tfds:NAME --config.data.eval=tfds:NAME`.
Bad input (a missing file, a malformed line, an unknown kind, a ratio that does not parse, an output that
overlaps an input) exits with status 2 and one line naming it; nothing is written then. A failed write (a
full disk) exits with status 1 and one line; an existing dataset is kept.
"""

from __future__ import annotations

import functools
from pathlib import Path

import tensorflow_datasets as tfds
from absl import app, flags

from experiments import cli
from rubric_jax.prepare.pipeline import PrepareConfig, prepare

_INPUT = flags.DEFINE_multi_string("input", None, "KIND:PATH, KIND in questions|hellobench|biggen|healthbench|"
                                   "longbench_write (repeat for several).")
_OUT = flags.DEFINE_string("out", None, "tfds data directory: the dataset goes to OUT/NAME/1.0.0.")
_NAME = flags.DEFINE_string("name", None, "Dataset name (lower case, digits, _), read back as tfds:NAME.")
_EVAL = flags.DEFINE_integer("eval_size", 0, "Held-out eval questions (split 'eval').")
_GOLDEN = flags.DEFINE_integer("golden_size", 0, "Golden questions (split 'golden').")
_TRAIN = flags.DEFINE_integer("train_size", 0, "Training questions; 0 = as many as the ratio allows.")
_RATIO = flags.DEFINE_string("difficulty_ratio", "3:5:2", "easy:medium:hard of the training split, or none.")
_SCORES = flags.DEFINE_string("scores", None, "jsonl with id and reward per row: difficulty from mean reward.")
_THRESHOLD = flags.DEFINE_float("dedup_threshold", 0.7, "Character n-gram Jaccard at which questions are duplicates.")
_NGRAM = flags.DEFINE_integer("ngram", 3, "Character n-gram size for dedup.")
_NUM_PERM = flags.DEFINE_integer("num_perm", 128, "MinHash signature length.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the MinHash functions and the split and mix sampling.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing OUT/NAME.")
flags.mark_flags_as_required(["input", "out", "name"])


_fail = functools.partial(cli.fail, "experiments.prepare_data")  # one line on stderr, exit status 2


def main(argv: list[str]) -> None:
    cli.start("experiments.prepare_data", argv)
    tfds.disable_progress_bar()
    config = PrepareConfig(
        inputs=tuple(_INPUT.value), out=Path(_OUT.value), name=_NAME.value, eval_size=_EVAL.value,
        golden_size=_GOLDEN.value, train_size=_TRAIN.value, difficulty_ratio=_RATIO.value,
        scores=Path(_SCORES.value) if _SCORES.value else None, dedup_threshold=_THRESHOLD.value,
        ngram=_NGRAM.value, num_perm=_NUM_PERM.value, seed=_SEED.value, overwrite=_OVERWRITE.value)
    try:
        prepare(config)
    except ValueError as e:  # the library's errors are ValueErrors naming the file, line or flag
        _fail(str(e))
    except OSError as e:  # writing failed (a full disk): nothing was published, an existing dataset is kept
        cli.fail_write("experiments.prepare_data", config.out / config.name, e)


if __name__ == "__main__":
    app.run(main)
